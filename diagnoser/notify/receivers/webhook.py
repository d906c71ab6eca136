"""The JSON webhook receiver (``type: webhook``): every notification POSTed as one JSON object.

For a receiver that is not Slack (an incident tool, a chat bridge, a queue's HTTP gateway). The
body is ``{"text", "blocks", "marker", "thread_ts", "updates"}``: ``text`` is the plain message,
``blocks`` the Slack layout (ignored by receivers that do not want it), ``marker`` the
notification's id (stable across retries, so a receiver can drop a repeat), and ``updates`` the
``ts`` of a message this one replaces (an edit). It has no threads nor read-back; an edit is a
new POST naming what it replaces. A 2xx is delivered; 408, 429 (with ``Retry-After``) and 5xx
are retried with backoff, 401/403 too (credentials being rotated) until
``notify.delivery.dead_letter_after_s``; any other 4xx refuses that one message. ::

    notify:
      receivers:
        - {name: bridge, type: webhook, url: "https://hooks.example/diagnoser"}

    sender = JsonWebhookSender("https://hooks.example/diagnoser", timeout_s=10)
    await sender.post(WebhookMessage("text"), marker="dgn-1-a1b2")

Where it sends is checked as the probe's targets are, and stricter: the URL's address and every
address its name resolves to, at each connection (:class:`AddressGuard`, so a name that resolves
elsewhere later is caught too), must be public unless ``allowed_addresses`` lists it or its
network; a cloud metadata or link-local address needs itself listed
(:func:`~diagnoser.config.addresses.outbound_refusal`). A redirect (301, 302, 303, 307, 308) is
not followed unless ``follow_redirects`` is set, and then only on the same host (``http`` to
``https`` allowed, never back), the payload POSTed again, at most :data:`MAX_REDIRECTS` times;
one not followed is a refusal (dead-lettered, never counted as sent). Errors name the receiver's
origin only (``https://hooks.example``): the path, the query and the ``headers`` of a webhook
URL are its secret, and reach neither the state file's ``last_error`` nor logs nor metrics.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver
from pydantic import Field, SecretStr, field_validator, model_validator

from diagnoser.config.addresses import IPNetwork, outbound_refusal, parse_networks
from diagnoser.config.sections import http_url
from diagnoser.errors import WebhookSendError
from diagnoser.notify.outbox import OutboxEntry, render_entry, render_reply
from diagnoser.notify.receivers import ReceiverConfig, receiver_type
from diagnoser.notify.sender import Capabilities, Delivery, HttpAnswer, TokenBucket, post_json
from diagnoser.redact import scrub

__all__ = [
    "MAX_REDIRECTS",
    "AddressGuard",
    "JsonWebhookSender",
    "WebhookConfig",
    "WebhookMessage",
    "WebhookReceiver",
    "origin",
    "render_webhook",
]


class _TextAndBlocks(Protocol):
    text: str
    blocks: list[dict[str, Any]]


@dataclass(frozen=True)
class WebhookMessage:
    """The webhook's message: the plain text and (for receivers that want it) Slack's layout."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)


def render_webhook(entry: OutboxEntry, *, reply: bool = False) -> WebhookMessage | None:
    """The JSON webhook's message for an entry (its reply when ``reply``); pure."""
    message = render_reply(entry) if reply else render_entry(entry)
    return None if message is None else WebhookMessage(message.text, message.blocks)


class WebhookConfig(ReceiverConfig):
    url: SecretStr
    #: Headers sent with every POST (an ``Authorization`` the receiver wants); secret.
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    #: Follow a redirect on the same host (the payload POSTed again); else a redirect is refused.
    follow_redirects: bool = False
    #: Addresses or networks (``10.0.0.0/8``, ``127.0.0.1``) besides public ones the webhook may
    #: reach; a cloud metadata or link-local address only when listed as itself.
    allowed_addresses: list[str] = Field(default_factory=list)

    @field_validator("url")
    @classmethod
    def _http(cls, value: SecretStr) -> SecretStr:
        http_url(value.get_secret_value(), "webhook URL")
        return value

    @field_validator("allowed_addresses")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        parse_networks(value)
        return value

    @model_validator(mode="after")
    def _literal_address_allowed(self) -> WebhookConfig:
        # A URL whose host is an address is judged at load; a name, where it resolves, at each send.
        host = (urlsplit(self.url.get_secret_value()).hostname or "").strip("[]")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return self
        refusal = outbound_refusal(host, parse_networks(self.allowed_addresses))
        if refusal is not None:
            raise ValueError(f"webhook URL refused: {refusal}")
        return self


#: Redirects followed per message, with ``follow_redirects``.
MAX_REDIRECTS = 3
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class AddressGuard(AbstractResolver):
    """aiohttp's resolver, refusing a name when any address it resolves to is not allowed.

    Every address, not only the first: a name that answers with a public address and a
    private one would otherwise reach the private one on a retry or a reconnect.
    """

    def __init__(self, allowed: list[IPNetwork]) -> None:
        self.allowed = allowed
        self._resolver = ThreadedResolver()
        #: The last refusal, for the error the sender raises.
        self.refused: str | None = None

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._resolver.resolve(host, port, family)
        for result in results:
            refusal = outbound_refusal(result["host"], self.allowed)
            if refusal is not None:
                self.refused = f"{host!r} resolves to {refusal}"
                raise OSError(self.refused)  # aiohttp reports it as a failed name lookup
        return results

    async def close(self) -> None:
        await self._resolver.close()


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: how errors name a webhook (its path may be its secret)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        host = f"[{host}]" if ":" in host else host
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "an unparsable URL"


class JsonWebhookSender:
    """POSTs each message as JSON to one URL (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        messages_per_s: float = 1.0,
        burst: int = 2,
        headers: Mapping[str, str] | None = None,
        follow_redirects: bool = False,
        allowed_addresses: Sequence[str] = (),
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.channel_id: str | None = None
        self.headers = dict(headers or {})
        self.follow_redirects = follow_redirects
        self.allowed = parse_networks(allowed_addresses)
        self._bucket = TokenBucket(messages_per_s, burst)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(threads=False, update=True, read_back=False)

    @property
    def target(self) -> str:
        return f"the JSON webhook at {origin(self.url)}"

    async def post(
        self, message: _TextAndBlocks, *, thread_ts: str | None = None, marker: str | None = None
    ) -> Delivery:
        body = {"text": message.text, "blocks": message.blocks, "marker": marker, "thread_ts": thread_ts}
        return await self._send(body)

    async def update(self, message: _TextAndBlocks, *, ts: str, channel: str | None = None) -> Delivery:
        body = {"text": message.text, "blocks": message.blocks, "updates": ts, "marker": None}
        return await self._send(body)

    async def find_posted(self, marker: str, *, thread_ts: str | None, since: float) -> Delivery | None:
        raise WebhookSendError("a JSON webhook cannot be read back", permanent=True, error="not_supported")

    async def _send(self, body: dict[str, Any]) -> Delivery:
        await self._bucket.take()
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            answer = await self._post(url, scrub(body))
            if answer.status not in _REDIRECTS:
                return self._judge(answer)
            url = self._redirect(url, answer)
        raise WebhookSendError(
            f"the webhook at {origin(self.url)} redirected more than {MAX_REDIRECTS} times",
            permanent=True,
            error="too_many_redirects",
        )

    async def _post(self, url: str, body: dict[str, Any]) -> HttpAnswer:
        """One POST to ``url``, its address checked; every error naming the origin only."""
        host = (urlsplit(url).hostname or "").strip("[]")
        refusal = outbound_refusal(host, self.allowed) if _is_address(host) else None
        if refusal is not None:
            raise WebhookSendError(f"webhook refused: {refusal}", permanent=True, error="address_refused")
        guard = AddressGuard(self.allowed)
        try:
            return await post_json(
                url, body, timeout_s=self.timeout_s, error=WebhookSendError, what="webhook", keep=200,
                follow_redirects=False, headers=self.headers, resolver=guard,
            )  # fmt: skip
        except WebhookSendError as exc:
            if guard.refused is not None:
                raise WebhookSendError(
                    f"webhook refused: {guard.refused}", permanent=True, error="address_refused"
                ) from exc
            raise WebhookSendError(
                self._hidden(str(exc), url), permanent=exc.permanent, error=exc.error, in_doubt=exc.in_doubt
            ) from exc

    def _redirect(self, url: str, answer: HttpAnswer) -> str:
        """Where a redirect may be followed to; else the refusal (never counted as sent)."""
        status = answer.status
        target = urljoin(url, answer.location or "")
        where = origin(target) if answer.location else "nowhere (no Location)"
        if not self.follow_redirects:
            raise WebhookSendError(
                f"the webhook at {origin(url)} answered HTTP {status}, a redirect to {where}:"
                " not followed (set follow_redirects, or give the final URL)",
                permanent=True,
                error=f"http_{status}",
            )
        before, after = urlsplit(url), urlsplit(target)
        same_host = (before.hostname or "").lower() == (after.hostname or "").lower()
        downgrade = before.scheme == "https" and after.scheme != "https"
        if not answer.location or not same_host or downgrade or after.scheme not in ("http", "https"):
            raise WebhookSendError(
                f"the webhook at {origin(url)} answered HTTP {status}, a redirect to {where}:"
                " refused (only the same host, and never from https to http)",
                permanent=True,
                error=f"http_{status}",
            )
        return target

    def _hidden(self, text: str, url: str) -> str:
        """``text`` with the webhook's URLs (and their paths) replaced by their origins."""
        for known in {url, self.url}:
            parts = urlsplit(known)
            secret_part = parts.path + (f"?{parts.query}" if parts.query else "")
            text = text.replace(known, origin(known))
            if secret_part.strip("/"):
                text = text.replace(secret_part, "/***")
        return text

    def _judge(self, answer: HttpAnswer) -> Delivery:
        status, text = answer.status, self._hidden(answer.text, self.url)
        if 200 <= status < 300:
            # Receivers rarely name what they stored: an id of our own stands for it.
            return Delivery(None, f"webhook-{secrets.token_hex(6)}")
        raise answer.refusal(WebhookSendError, f"the webhook answered HTTP {status} {text.strip()}".rstrip())


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@receiver_type("webhook", config=WebhookConfig)
class WebhookReceiver(JsonWebhookSender):
    """A :class:`JsonWebhookSender` with its name and its renderer."""

    def __init__(self, config: WebhookConfig) -> None:
        super().__init__(
            config.url.get_secret_value(),
            timeout_s=config.timeout_s,
            messages_per_s=config.messages_per_s,
            burst=config.message_burst,
            headers={k: v.get_secret_value() for k, v in config.headers.items()},
            follow_redirects=config.follow_redirects,
            allowed_addresses=config.allowed_addresses,
        )
        self.name = config.name

    def render(self, entry: OutboxEntry) -> WebhookMessage | None:
        return render_webhook(entry)

    def render_reply(self, entry: OutboxEntry) -> WebhookMessage | None:
        return render_webhook(entry, reply=True)

    def plain(self, message: WebhookMessage) -> WebhookMessage:
        return WebhookMessage(message.text)
