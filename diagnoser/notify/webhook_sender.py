"""A generic JSON webhook sender: every notification POSTed as one JSON object to any receiver.

For a receiver that is not Slack (an incident tool, a chat bridge, a queue's HTTP gateway). The
body is ``{"text", "blocks", "marker", "thread_ts", "updates"}``: ``text`` is the plain message,
``blocks`` the Slack layout (ignored by receivers that do not want it), ``marker`` the
notification's id (stable across retries, so a receiver can drop a repeat), and ``updates`` the
``ts`` of a message this one replaces (an edit). It has no threads nor read-back; an edit is a
new POST naming what it replaces. A 2xx is delivered; 429 (with ``Retry-After``) and 5xx are
retried; any other 4xx is a refusal. ::

    sender = JsonWebhookSender("https://hooks.example/diagnoser", timeout_s=10)
    await sender.post(message, marker="dgn-1-a1b2")
"""

from __future__ import annotations

import secrets
from typing import Any

import aiohttp

from diagnoser.errors import SlackSendError
from diagnoser.notify.sender import Capabilities, Delivery, TokenBucket
from diagnoser.notify.slack import SlackMessage
from diagnoser.redact import redact_url, scrub

__all__ = ["JsonWebhookSender"]


class JsonWebhookSender:
    """POSTs each message as JSON to one URL (see the module docstring)."""

    def __init__(
        self, url: str, *, timeout_s: float = 10.0, messages_per_s: float = 1.0, burst: int = 2
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.channel_id: str | None = None
        self._bucket = TokenBucket(messages_per_s, burst)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(threads=False, update=True, read_back=False)

    @property
    def target(self) -> str:
        return f"the JSON webhook {redact_url(self.url)}"

    async def post(
        self, message: SlackMessage, *, thread_ts: str | None = None, marker: str | None = None
    ) -> Delivery:
        body = {"text": message.text, "blocks": message.blocks, "marker": marker, "thread_ts": thread_ts}
        return await self._send(body)

    async def update(self, message: SlackMessage, *, ts: str, channel: str | None = None) -> Delivery:
        body = {"text": message.text, "blocks": message.blocks, "updates": ts, "marker": None}
        return await self._send(body)

    async def find_posted(self, marker: str, *, thread_ts: str | None, since: float) -> Delivery | None:
        raise SlackSendError("a JSON webhook cannot be read back", permanent=True, error="not_supported")

    async def _send(self, body: dict[str, Any]) -> Delivery:
        await self._bucket.take()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(self.url, json=scrub(body)) as response,
            ):
                text = (await response.text())[:200]
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except aiohttp.ClientConnectorError as exc:
            raise SlackSendError(f"webhook unreachable: {type(exc).__name__}") from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise SlackSendError(f"webhook unreachable: {type(exc).__name__}: {exc}", in_doubt=True) from exc
        if 200 <= status < 300:
            # Receivers rarely name what they stored: an id of our own stands for it.
            return Delivery(None, f"webhook-{secrets.token_hex(6)}")
        wait = None
        if status == 429 and retry_after is not None:
            try:
                wait = max(0.0, float(retry_after))
            except ValueError:
                wait = None
        raise SlackSendError(
            f"the webhook answered HTTP {status} {text.strip()}".rstrip(),
            permanent=400 <= status < 500 and status not in (408, 429),
            error=f"http_{status}",
            retry_after=wait,
            in_doubt=status >= 500,
        )
