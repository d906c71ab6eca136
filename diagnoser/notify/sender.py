"""The one protocol every notification sender implements, and the rate every channel is held to.

A sender posts a rendered message (into a thread when it has threads), edits one it posted
(when it can), and finds a post again by its marker (when it can read the channel back): the
outbox delivery (:mod:`diagnoser.notify.delivery`) asks its :class:`Capabilities` and never
which service it is. Implemented by :class:`~diagnoser.notify.slack_sender.SlackSender` (bot
token: everything; incoming webhook: post only) and
:class:`~diagnoser.notify.webhook_sender.JsonWebhookSender` (any receiver of JSON). ::

    delivery = await sender.post(message, thread_ts=None, marker="dgn-1-a1b2")
    if sender.capabilities.update:
        await sender.update(edited, ts=delivery.ts)

:class:`TokenBucket` spaces a sender's calls (Slack allows about one message per second per
channel, short bursts tolerated): the sender waits for a token before each call, so bursts are
smoothed before Slack has to answer 429.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from diagnoser.errors import SlackSendError
from diagnoser.notify.slack import SlackMessage

__all__ = ["Capabilities", "Delivery", "SendError", "Sender", "TokenBucket"]

#: A failed send, classified (permanent, retry_after, in_doubt); one type for every sender.
SendError = SlackSendError


@dataclass(frozen=True)
class Delivery:
    """Where a message landed: its channel and ``ts`` (``None`` for receivers that do not say)."""

    channel: str | None
    ts: str | None


@dataclass(frozen=True)
class Capabilities:
    """What a sender can do beyond posting."""

    #: Replies go into a thread.
    threads: bool = False
    #: A posted message can be edited in place.
    update: bool = False
    #: A post whose answer never came can be looked for (exactly-once delivery).
    read_back: bool = False


class Sender(Protocol):
    """Post, update, reply (``thread_ts``) and find a post again; raise :data:`SendError`."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def target(self) -> str:
        """Where messages go, fit to print (never a secret)."""
        ...

    #: The channel's id once known (kept across restarts by the delivery).
    channel_id: str | None

    async def post(
        self, message: SlackMessage, *, thread_ts: str | None = None, marker: str | None = None
    ) -> Delivery: ...

    async def update(self, message: SlackMessage, *, ts: str, channel: str | None = None) -> Delivery: ...

    async def find_posted(self, marker: str, *, thread_ts: str | None, since: float) -> Delivery | None: ...


class TokenBucket:
    """``rate`` calls per second on average, ``burst`` at once; :meth:`take` waits for a token."""

    def __init__(
        self,
        rate: float,
        burst: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs a positive rate and a burst of at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = burst
        self._at = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    async def take(self) -> None:
        """Wait until a call may go out, then spend its token (callers are served in order)."""
        async with self._lock:
            self._refill()
            while self._tokens < 1:
                await self._sleep((1 - self._tokens) / self.rate)
                self._refill()
            self._tokens -= 1
