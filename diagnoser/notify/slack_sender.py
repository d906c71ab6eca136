"""Posting rendered messages to Slack (or a Slack-compatible endpoint) with slack-sdk.

Two ways in, chosen from :class:`~diagnoser.config.SlackSettings`:

- a bot token and a channel: ``chat.postMessage`` through ``AsyncWebClient`` (its ``base_url`` is
  configurable), answering the message ``ts`` so that updates and the resolution go into the
  first message's thread. Each message carries a marker in its metadata (``event_type``
  ``diagnoser_notification``), so :meth:`SlackSender.find_posted` can tell, through
  ``conversations.history`` / ``conversations.replies``, whether a post whose answer never
  came reached the channel after all;
- an incoming webhook URL through ``AsyncWebhookClient`` (any URL: Slack, or a Slack-compatible
  receiver such as a Mattermost incoming webhook); no threads, and nothing can be read back.

One call is one HTTP request: no retries, no sleeping here, and no redirect followed (Slack's Web
API and its incoming webhooks never redirect; a 3xx, from a proxy or a moved endpoint, is a
refusal naming where it pointed, as every receiver's redirect is: :mod:`diagnoser.notify.outbound`).
Where it connects obeys every receiver's address rule too: ``base_url`` or ``webhook_url`` and
every address its name resolves to, at each connection, must be public unless
``allowed_addresses`` lists it (a refusal is permanent, ``address_refused``, and nothing is sent).
Every failure is raised as one
:class:`SlackSendError` saying what the caller (the outbox, :mod:`diagnoser.notify.delivery`)
needs to decide: ``permanent`` when resending cannot help (the message, the channel or the
credentials were refused), ``retry_after`` when Slack asked to wait (a 429), ``in_doubt`` when the
request may have been processed (a timeout or a 5xx after it was sent). ::

    sender = SlackSender.from_settings(settings.slack)
    delivery = await sender.post(render_finding(finding, at=now), marker="dgn-1-a1b2")
    await sender.post(render_resolved(finding, at=now), thread_ts=delivery.ts, marker="dgn-2-c3d4")
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from diagnoser.config import SlackSettings
from diagnoser.config.addresses import literal_refusal, parse_networks
from diagnoser.errors import SlackSendError
from diagnoser.notify.outbound import AddressGuard, redirect_refusal
from diagnoser.notify.sender import Capabilities, Delivery, TokenBucket
from diagnoser.notify.slack import SlackMessage, escape
from diagnoser.redact import redact_url, scrub

__all__ = ["MARKER_EVENT_TYPE", "SlackDelivery", "SlackSendError", "SlackSender"]

#: The message metadata ``event_type`` that carries a notification's marker.
MARKER_EVENT_TYPE = "diagnoser_notification"

#: Errors about the message's layout: the same blocks will never be accepted (text may be).
_LAYOUT_ERRORS = frozenset(
    {
        "invalid_blocks",
        "invalid_blocks_format",
        "invalid_payload",
        "msg_too_long",
        "no_text",
        "too_many_attachments",
        "invalid_attachments",
        "invalid_metadata_format",
        "invalid_metadata_schema",
        "metadata_too_large",
    }
)
#: Errors no retry of this message can fix: the channel, the thread or the message (an edit
#: refused by ``chat.update``: not ours to edit, past the workspace's edit window, deleted) was
#: refused. Slack's Web API documents these for chat.postMessage, chat.update and the
#: conversations.* methods. The delivery posts a refused edit anew and goes on.
_REFUSED_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "thread_not_found",
        "message_not_found",
        "cant_update_message",
        "edit_window_closed",
        "no_permission",
        "missing_scope",
        "not_allowed_token_type",
        "restricted_action",
        "restricted_action_read_only_channel",
        "restricted_action_thread_only_channel",
        "restricted_action_non_threadable_channel",
        "team_access_not_granted",
        "ekm_access_denied",
        # Incoming webhooks answer these as plain text with 400/403/404/410.
        "no_service",
        "no_service_id",
        "no_team",
        "team_disabled",
        "action_prohibited",
        "posting_to_general_channel_denied",
        "channel_is_archived",
    }
)
#: The credentials were refused: every call fails alike until the token is fixed (rotated,
#: reinstalled). Retried with backoff for ``notify.delivery.dead_letter_after_s`` before any
#: message becomes a dead letter, so a short glitch delays messages by about its own length.
_AUTH_ERRORS = frozenset(
    {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired", "invalid_token"}
)
#: Errors after which the message may have been posted anyway (Slack says "it's possible some
#: aspect of the operation succeeded").
_MAYBE_PROCESSED_ERRORS = frozenset({"internal_error", "fatal_error"})
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{6,}$")


#: Where a message landed (the name the Slack sender's callers have used).
SlackDelivery = Delivery


def _retry_after(headers: Any) -> float | None:
    """Seconds from a ``Retry-After`` header (Slack sends an integer), if any."""
    if not headers:
        return None
    value = None
    if isinstance(headers, Mapping):
        for key in headers:
            if str(key).lower() == "retry-after":
                value = headers[key]
                break
    try:
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _on_the_wire(message: SlackMessage) -> SlackMessage:
    """The message as Slack must receive it: credentials scrubbed (a source error or a label
    quoting a URL with them), and ``text`` escaped as Slack documents for mrkdwn (``&``, ``<``,
    ``>``), so a label holding ``<!channel>`` or ``<@U123>`` mentions nobody. The renderers' text
    is plain (the JSON webhook sends it as is); their blocks are escaped already."""
    return SlackMessage(escape(scrub(message.text)), scrub(message.blocks))


def _is_permanent(error: str) -> bool:
    return error in _LAYOUT_ERRORS or error in _REFUSED_ERRORS


async def _refuse_redirect(
    session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestRedirectParams
) -> None:
    """aiohttp's redirect hook: a redirect is refused before it is followed (nothing re-sent)."""
    response = params.response
    _, refusal = redirect_refusal(
        str(params.url), response.status, response.headers.get("Location"), follow=False
    )
    response.release()
    raise SlackSendError(f"Slack at {refusal}", permanent=True, error=f"http_{response.status}")


class SlackSender:
    """Posts :class:`SlackMessage` values; build it with :meth:`from_settings`."""

    def __init__(self, settings: SlackSettings) -> None:
        self.settings = settings
        # No retry handler at all: slack-sdk's would sleep through a Retry-After inside the call
        # and re-send after a dropped connection, which may post the message twice.
        retry: list[Any] = []
        timeout = max(1, round(settings.timeout_s))
        #: The channel's id once known (posts answer it; conversations.history needs it).
        self.channel_id: str | None = (
            settings.channel if settings.channel and _CHANNEL_ID.match(settings.channel) else None
        )
        self._timeout_s = timeout
        self._allowed = parse_networks(settings.allowed_addresses)
        self._web: AsyncWebClient | None = None
        self._webhook: AsyncWebhookClient | None = None
        # Slack's limit is about one message per second per channel: calls wait for their turn.
        self._bucket = TokenBucket(settings.messages_per_s, settings.message_burst)
        if settings.token is not None:
            if not settings.channel:
                raise SlackSendError("slack.token is set but slack.channel is not")
            self._web = AsyncWebClient(
                token=settings.token.get_secret_value(),
                base_url=settings.base_url if settings.base_url.endswith("/") else settings.base_url + "/",
                timeout=timeout,
                retry_handlers=list(retry),
            )
        elif settings.webhook_url is not None:
            self._webhook = AsyncWebhookClient(
                settings.webhook_url.get_secret_value(), timeout=timeout, retry_handlers=list(retry)
            )

    @classmethod
    def from_settings(cls, settings: SlackSettings) -> SlackSender | None:
        """A sender, or ``None`` when Slack is not configured (the daemon then only keeps state)."""
        if settings.token is None and settings.webhook_url is None:
            return None
        return cls(settings)

    @asynccontextmanager
    async def _web_client(self) -> AsyncIterator[AsyncWebClient]:
        """The Web API client for one call, on a session refusing redirects (slack-sdk's own
        session follows them: a 307 would re-send the message, token included, elsewhere).

        One session per call, as slack-sdk makes when given none; one client per call too,
        since calls may overlap and a client holds its session."""
        assert self._web is not None
        async with self._session(self._web.base_url) as session:
            yield AsyncWebClient(
                token=self._web.token, base_url=self._web.base_url, timeout=self._web.timeout,
                retry_handlers=[], session=session,
            )  # fmt: skip

    @asynccontextmanager
    async def _webhook_client(self) -> AsyncIterator[AsyncWebhookClient]:
        """The incoming webhook's client for one call, on a session refusing redirects."""
        assert self._webhook is not None
        async with self._session(self._webhook.url) as session:
            yield AsyncWebhookClient(
                self._webhook.url, timeout=self._webhook.timeout, retry_handlers=[], session=session
            )

    @asynccontextmanager
    async def _session(self, url: str) -> AsyncIterator[aiohttp.ClientSession]:
        """A session for one call to ``url``: redirects refused, and every address it connects
        to checked (:class:`~diagnoser.notify.outbound.AddressGuard`, as the webhook's)."""
        refusal = literal_refusal(url, self._allowed)
        if refusal is not None:
            raise SlackSendError(f"Slack refused: {refusal}", permanent=True, error="address_refused")
        trace = aiohttp.TraceConfig()
        trace.on_request_redirect.append(_refuse_redirect)
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        guard = AddressGuard(self._allowed)
        connector = aiohttp.TCPConnector(resolver=guard)
        async with aiohttp.ClientSession(
            timeout=timeout, trace_configs=[trace], connector=connector
        ) as session:
            try:
                yield session
            except Exception as exc:
                if guard.refused is None:
                    raise
                # aiohttp reports the refusal as a failed name lookup: a permanent refusal instead.
                raise SlackSendError(
                    f"Slack refused: {guard.refused}", permanent=True, error="address_refused"
                ) from exc

    @property
    def capabilities(self) -> Capabilities:
        """A bot token threads, edits and reads back; an incoming webhook only posts."""
        web = self._web is not None
        return Capabilities(threads=web, update=web, read_back=web)

    @property
    def threads(self) -> bool:
        """True when replies can go into a thread (bot token); webhooks post standalone messages."""
        return self._web is not None

    @property
    def target(self) -> str:
        """Where messages go, fit to print (never the token or the webhook's secret path)."""
        if self._web is not None:
            return f"channel {self.settings.channel} via {redact_url(self.settings.base_url)}"
        return "an incoming webhook"

    @property
    def can_read_back(self) -> bool:
        """True when a post can be looked for afterwards (bot token); webhooks cannot."""
        return self._web is not None

    async def post(
        self, message: SlackMessage, *, thread_ts: str | None = None, marker: str | None = None
    ) -> SlackDelivery:
        """Post ``message`` (into ``thread_ts``'s thread when given and possible), carrying ``marker``."""
        message = _on_the_wire(message)
        await self._bucket.take()
        try:
            if self._web is not None:
                return await self._post_web(message, thread_ts, marker)
            if self._webhook is not None:
                return await self._post_webhook(message)
        except Exception as exc:
            raise _classified(exc, scope="post") from exc
        raise SlackSendError("Slack is not configured", permanent=True)

    async def update(self, message: SlackMessage, *, ts: str, channel: str | None = None) -> Delivery:
        """Edit the message ``ts`` in place (``chat.update``; a bot token only)."""
        if self._web is None:
            raise SlackSendError(
                "an incoming webhook cannot edit a message", permanent=True, error="not_supported"
            )
        message = _on_the_wire(message)
        await self._bucket.take()
        try:
            async with self._web_client() as web:
                where = channel or await self._resolve_channel(web)
                response = await web.chat_update(
                    channel=where, ts=ts, text=message.text, blocks=message.blocks or [],
                )
        except SlackSendError:
            raise
        except Exception as exc:
            raise _classified(exc, scope="update") from exc
        return Delivery(str(response.get("channel") or where), str(response.get("ts") or ts))

    async def permalink(self, ts: str, *, channel: str | None = None) -> str | None:
        """A link to the message ``ts`` (``chat.getPermalink``); ``None`` from a webhook, which
        cannot ask. A failure is raised as :class:`SlackSendError`, as for a post."""
        if self._web is None:
            return None
        try:
            async with self._web_client() as web:
                where = channel or await self._resolve_channel(web)
                response = await web.chat_getPermalink(channel=where, message_ts=ts)
        except SlackSendError:
            raise
        except Exception as exc:
            raise _classified(exc, scope="permalink") from exc
        link = response.get("permalink")
        return str(link) if isinstance(link, str) and link.startswith("https://") else None

    async def find_posted(self, marker: str, *, thread_ts: str | None, since: float) -> SlackDelivery | None:
        """The message carrying ``marker`` posted at or after ``since`` (epoch seconds), if any.

        Looks through ``conversations.replies`` of ``thread_ts`` or ``conversations.history`` of
        the channel; raises :class:`SlackSendError` when it cannot look (``permanent`` when it
        never will: a missing ``channels:history`` scope, a webhook).
        """
        if self._web is None:
            raise SlackSendError("an incoming webhook cannot be read back", permanent=True)
        try:
            async with self._web_client() as web:
                return await self._find(web, marker, thread_ts=thread_ts, since=since)
        except SlackSendError:
            raise
        except Exception as exc:
            raise _classified(exc, scope="read_back") from exc

    async def _find(
        self, web: AsyncWebClient, marker: str, *, thread_ts: str | None, since: float
    ) -> SlackDelivery | None:
        channel = await self._resolve_channel(web)
        cursor: str | None = None
        for _ in range(5):  # 5 pages of 200: far more than one outage's worth of posts
            args: dict[str, Any] = {
                "channel": channel,
                "oldest": f"{max(0.0, since - 1):.6f}",
                "include_all_metadata": True,
                "limit": 200,
            }
            if cursor:
                args["cursor"] = cursor
            if thread_ts:
                response = await web.conversations_replies(ts=thread_ts, **args)
            else:
                response = await web.conversations_history(**args)
            for item in response.get("messages") or []:
                metadata = item.get("metadata") or {}
                payload = metadata.get("event_payload") or {}
                if metadata.get("event_type") == MARKER_EVENT_TYPE and payload.get("marker") == marker:
                    return SlackDelivery(channel, str(item.get("ts")))
            cursor = (response.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                break
        return None

    async def _resolve_channel(self, web: AsyncWebClient) -> str:
        if self.channel_id is not None:
            return self.channel_id
        name = (self.settings.channel or "").lstrip("#")
        cursor: str | None = None
        for _ in range(20):
            response = await web.conversations_list(
                types="public_channel,private_channel", exclude_archived=True, limit=1000, cursor=cursor
            )
            for channel in response.get("channels") or []:
                if channel.get("name") == name:
                    self.channel_id = str(channel["id"])
                    return self.channel_id
            cursor = (response.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                break
        raise SlackSendError(
            f"channel {self.settings.channel} not found by conversations.list", permanent=True,
            error="channel_not_found",
        )

    async def _post_web(
        self, message: SlackMessage, thread_ts: str | None, marker: str | None
    ) -> SlackDelivery:
        metadata = (
            {"event_type": MARKER_EVENT_TYPE, "event_payload": {"marker": marker}} if marker else None
        )
        async with self._web_client() as web:
            response = await web.chat_postMessage(
                channel=self.settings.channel or "",
                text=message.text,
                blocks=message.blocks or None,
                thread_ts=thread_ts,
                unfurl_links=False,
                unfurl_media=False,
                metadata=metadata,
            )
        ts = response.get("ts")
        channel = response.get("channel")
        if channel:
            self.channel_id = str(channel)
        return SlackDelivery(str(channel) if channel else self.settings.channel, str(ts) if ts else None)

    async def _post_webhook(self, message: SlackMessage) -> SlackDelivery:
        async with self._webhook_client() as webhook:
            response = await webhook.send(
                text=message.text, blocks=message.blocks or None, unfurl_links=False, unfurl_media=False
            )
        status = response.status_code
        if status != 200:
            body = (response.body or "").strip()[:200]
            error = body if re.fullmatch(r"[a-z_]+", body) else ""
            auth = error in _AUTH_ERRORS or status in (401, 403)
            raise SlackSendError(
                f"the webhook answered HTTP {status} {body}".rstrip(),
                permanent=not auth and (_is_permanent(error) or status in (400, 404, 410)),
                error=error,
                layout=error in _LAYOUT_ERRORS,
                retry_after=_retry_after(response.headers) if status == 429 else None,
                in_doubt=status >= 500,
                auth=auth,
            )
        return SlackDelivery(None, None)


def _classified(exc: BaseException, *, scope: str) -> SlackSendError:
    """One :class:`SlackSendError` for whatever slack-sdk or aiohttp raised.

    ``scope``: the kind of call (``post``, ``update``, ``read_back``). Slack's rate limits are per
    method (chat.update is Tier 3, chat.postMessage about one per second per channel), so a 429
    holds back only calls of its kind.
    """
    if isinstance(exc, SlackSendError):
        return exc
    if isinstance(exc, SlackApiError):
        data = exc.response.data if exc.response is not None else None
        # A non-JSON error page (a 500 from a proxy) arrives as a string, not a dict.
        error = str(data.get("error", "")) if isinstance(data, dict) else ""
        status = exc.response.status_code if exc.response is not None else 0
        headers = exc.response.headers if exc.response is not None else None
        limited = status == 429
        return SlackSendError(
            f"Slack refused the message: HTTP {status} {error or 'error'}",
            permanent=_is_permanent(error),
            error=error,
            layout=error in _LAYOUT_ERRORS,
            retry_after=_retry_after(headers) if limited else None,
            in_doubt=status >= 500 or error in _MAYBE_PROCESSED_ERRORS,
            auth=error in _AUTH_ERRORS,
            scope=scope if limited else None,
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        # The connection was never made: the request was certainly not processed.
        return SlackSendError(f"Slack unreachable: {type(exc).__name__}: {exc}")
    if isinstance(exc, TimeoutError | aiohttp.ClientError | SlackClientError | OSError):
        # Sent, perhaps, and no answer: Slack may have posted it.
        return SlackSendError(f"Slack unreachable: {type(exc).__name__}: {exc}", in_doubt=True)
    if isinstance(exc, ValueError):  # a body that is not the JSON Slack documents
        return SlackSendError(f"Slack answered garbage: {exc}", in_doubt=True)
    return SlackSendError(f"Slack call failed: {type(exc).__name__}: {exc}", in_doubt=True)
