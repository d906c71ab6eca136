"""Posting rendered messages to Slack (or a Slack-compatible endpoint) with slack-sdk.

Two ways in, chosen from :class:`~diagnoser.config.SlackSettings`:

- a bot token and a channel: ``chat.postMessage`` through ``AsyncWebClient`` (its ``base_url`` is
  configurable), answering the message ``ts`` so that updates and the resolution go into the
  first message's thread;
- an incoming webhook URL through ``AsyncWebhookClient`` (any URL: Slack, or a Slack-compatible
  receiver such as a Mattermost incoming webhook); no threads.

The asyncio clients are the slack-sdk's own, so a 429's ``Retry-After`` wait (slack-sdk's
rate-limit retry handler) never blocks the daemon's event loop. Every failure is raised as one
:class:`SlackSendError`, with ``permanent`` set when Slack refused the message itself (retrying
the same payload cannot succeed) rather than being unreachable, rate limited or misconfigured. ::

    sender = SlackSender.from_settings(settings.slack)
    delivery = await sender.post(render_finding(finding, at=now))
    await sender.post(render_resolved(finding, at=now), thread_ts=delivery.ts)
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from diagnoser.config import SlackSettings
from diagnoser.errors import DiagnoserError
from diagnoser.notify.slack import SlackMessage
from diagnoser.redact import redact_url, scrub

__all__ = ["SlackDelivery", "SlackSendError", "SlackSender"]

#: Errors about the message itself: the same payload will never be accepted.
_PERMANENT_ERRORS = frozenset(
    {
        "invalid_blocks",
        "invalid_blocks_format",
        "invalid_payload",
        "msg_too_long",
        "no_text",
        "too_many_attachments",
        "invalid_attachments",
    }
)


class SlackSendError(DiagnoserError):
    """Slack did not take the message; ``permanent`` when resending it unchanged cannot help."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class SlackDelivery:
    """Where a message landed: its channel and ``ts`` (``None`` for webhooks, which do not say)."""

    channel: str | None
    ts: str | None


class SlackSender:
    """Posts :class:`SlackMessage` values; build it with :meth:`from_settings`."""

    def __init__(self, settings: SlackSettings) -> None:
        self.settings = settings
        retry = [AsyncRateLimitErrorRetryHandler(max_retry_count=settings.rate_limit_retries)]
        timeout = max(1, round(settings.timeout_s))
        self._web: AsyncWebClient | None = None
        self._webhook: AsyncWebhookClient | None = None
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

    async def post(self, message: SlackMessage, *, thread_ts: str | None = None) -> SlackDelivery:
        """Post ``message`` (into ``thread_ts``'s thread when given and possible)."""
        # Last line of defence: a source error or label quoting a URL with credentials.
        message = SlackMessage(scrub(message.text), scrub(message.blocks))
        try:
            if self._web is not None:
                return await self._post_web(message, thread_ts)
            if self._webhook is not None:
                return await self._post_webhook(message)
        except SlackSendError:
            raise
        except SlackApiError as exc:
            data = exc.response.data if exc.response is not None else None
            # A non-JSON error page (a 500 from a proxy) arrives as a string, not a dict.
            error = str(data.get("error", "")) if isinstance(data, dict) else ""
            status = exc.response.status_code if exc.response is not None else 0
            raise SlackSendError(
                f"Slack refused the message: HTTP {status} {error or 'error'}",
                permanent=error in _PERMANENT_ERRORS,
            ) from exc
        except (TimeoutError, aiohttp.ClientError, SlackClientError, OSError) as exc:
            raise SlackSendError(f"Slack unreachable: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:  # a body that is not the JSON Slack documents
            raise SlackSendError(f"Slack answered garbage: {exc}") from exc
        raise SlackSendError("Slack is not configured")

    async def _post_web(self, message: SlackMessage, thread_ts: str | None) -> SlackDelivery:
        assert self._web is not None
        response = await self._web.chat_postMessage(
            channel=self.settings.channel or "",
            text=message.text,
            blocks=message.blocks or None,
            thread_ts=thread_ts,
            unfurl_links=False,
            unfurl_media=False,
        )
        ts = response.get("ts")
        channel = response.get("channel")
        return SlackDelivery(str(channel) if channel else self.settings.channel, str(ts) if ts else None)

    async def _post_webhook(self, message: SlackMessage) -> SlackDelivery:
        assert self._webhook is not None
        response = await self._webhook.send(
            text=message.text, blocks=message.blocks or None, unfurl_links=False, unfurl_media=False
        )
        if response.status_code != 200:
            body = (response.body or "").strip()[:200]
            raise SlackSendError(
                f"the webhook answered HTTP {response.status_code} {body}".rstrip(),
                permanent=response.status_code == 400 and body in _PERMANENT_ERRORS,
            )
        return SlackDelivery(None, None)
