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

Where it sends obeys the rules of :mod:`diagnoser.notify.outbound`, as every receiver's does:
the URL's address and every address its name resolves to must be public unless
``allowed_addresses`` lists them; a redirect is not followed unless ``follow_redirects`` is set
(then the same host only, never ``https`` to ``http``), and one not followed is a refusal
(dead-lettered, never counted as sent). Errors name the receiver's origin only
(``https://hooks.example``): the path, the query and the ``headers`` of a webhook URL are its
secret, and reach neither the state file's ``last_error`` nor logs nor metrics.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import Field, SecretStr, field_validator, model_validator

from diagnoser.config.sections import http_url
from diagnoser.errors import WebhookSendError
from diagnoser.notify.outbound import MAX_REDIRECTS, AddressGuard, GuardedPoster, origin
from diagnoser.notify.outbox import OutboxEntry, render_entry, render_reply
from diagnoser.notify.receivers import OutboundConfig, receiver_type
from diagnoser.notify.sender import Capabilities, Delivery, HttpAnswer, TokenBucket
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


class WebhookConfig(OutboundConfig):
    url: SecretStr
    #: Headers sent with every POST (an ``Authorization`` the receiver wants); secret.
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http(cls, value: SecretStr) -> SecretStr:
        http_url(value.get_secret_value(), "webhook URL")
        return value

    @model_validator(mode="after")
    def _literal_address_allowed(self) -> WebhookConfig:
        refusal = self.url_refusal(self.url.get_secret_value())
        if refusal is not None:
            raise ValueError(f"webhook URL refused: {refusal}")
        return self


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
        self._poster = GuardedPoster(
            url, error=WebhookSendError, what="webhook", timeout_s=timeout_s, headers=self.headers,
            follow_redirects=follow_redirects, allowed_addresses=allowed_addresses, keep=200,
        )  # fmt: skip
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
        return self._judge(await self._poster.post(scrub(body)))

    def _judge(self, answer: HttpAnswer) -> Delivery:
        status, text = answer.status, self._poster.hidden(answer.text)
        if 200 <= status < 300:
            # Receivers rarely name what they stored: an id of our own stands for it.
            return Delivery(None, f"webhook-{secrets.token_hex(6)}")
        raise answer.refusal(WebhookSendError, f"the webhook answered HTTP {status} {text.strip()}".rstrip())


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
