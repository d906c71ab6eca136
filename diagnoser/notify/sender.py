"""The one protocol every receiver's sender implements, and the rate every channel is held to.

A sender posts a message of its integration's own type (into a thread when it has threads),
edits one it posted (when it can), and finds a post again by its marker (when it can read the
channel back): the outbox delivery (:mod:`diagnoser.notify.delivery`) asks its
:class:`Capabilities` and never which service it is. A :class:`Receiver` is a sender that also
renders an outbox entry into its own message type (a pure function): Slack's Block Kit
(:mod:`diagnoser.notify.receivers.slack`), the JSON webhook's object
(:mod:`diagnoser.notify.receivers.webhook`), PagerDuty's Events v2 event
(:mod:`diagnoser.notify.receivers.pagerduty`). Every failure is a :class:`SendError`. ::

    delivery = await sender.post(message, thread_ts=None, marker="dgn-1-a1b2")
    if sender.capabilities.update:
        await sender.update(edited, ts=delivery.ts)

:class:`TokenBucket` spaces a sender's calls (Slack allows about one message per second per
channel, short bursts tolerated): the sender waits for a token before each call, so bursts are
smoothed before Slack has to answer 429.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from diagnoser.errors import SendError

if TYPE_CHECKING:
    from aiohttp.abc import AbstractResolver

    from diagnoser.notify.outbox import OutboxEntry

__all__ = [
    "Capabilities", "Delivery", "HttpAnswer", "Receiver", "SendError", "Sender", "TokenBucket", "post_json",
    "retry_after_s",
]  # fmt: skip

#: A receiver's own message type (Slack's blocks, a webhook's JSON, a PagerDuty event).
M = TypeVar("M")
M_contra = TypeVar("M_contra", contravariant=True)


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
    #: Changes said (as a new message) even without threads: by default the resolution and the
    #: confirm probe's verdict after it.
    without_threads: frozenset[str] = frozenset({"resolved", "verified"})


class Sender(Protocol[M_contra]):
    """Post, update, reply (``thread_ts``) and find a post again; raise :class:`SendError`."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def target(self) -> str:
        """Where messages go, fit to print (never a secret)."""
        ...

    #: The channel's id once known (kept across restarts by the delivery).
    channel_id: str | None

    async def post(
        self, message: M_contra, *, thread_ts: str | None = None, marker: str | None = None
    ) -> Delivery: ...

    async def update(self, message: M_contra, *, ts: str, channel: str | None = None) -> Delivery: ...

    async def find_posted(self, marker: str, *, thread_ts: str | None, since: float) -> Delivery | None: ...


class Receiver(Sender[M], Protocol[M]):
    """A named sender that renders outbox entries into its own message type (pure functions).

    ``render``: an incident's own message (posted first, edited after), a digest, a report;
    ``render_reply``: what a change says in its thread; ``plain``: the message without its rich
    layout, for a service that refused the layout. ``None``: this receiver says nothing of it.
    """

    name: str

    def render(self, entry: OutboxEntry) -> M | None: ...

    def render_reply(self, entry: OutboxEntry) -> M | None: ...

    def plain(self, message: M) -> M: ...


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


@dataclass(frozen=True)
class HttpAnswer:
    """What a JSON-over-HTTP receiver answered: its status, the start of its body, ``Retry-After``."""

    status: int
    text: str
    retry_after: str | None
    #: Where a redirect points (``Location``), when redirects are not followed.
    location: str | None = None

    def refusal(self, error: type[SendError], message: str, *, now: float | None = None) -> SendError:
        """The :class:`SendError` a non-2xx answer stands for, by its HTTP status.

        401/403: the credentials were refused (``auth``: retried with backoff, a key being
        rotated must not lose messages); 408, 425, 429 and 5xx: transient (a 429's
        ``Retry-After``, seconds or an HTTP date as RFC 9110 allows, kept); any other 4xx: this
        message is refused for good. A webhook or an events endpoint is one URL, so a rate limit
        covers the whole receiver.
        """
        status = self.status
        wait = retry_after_s(self.retry_after, now=now) if status in (429, 503) else None
        return error(
            message,
            permanent=400 <= status < 500 and status not in (401, 403, 408, 425, 429),
            error=f"http_{status}",
            retry_after=wait,
            in_doubt=status >= 500,
            auth=status in (401, 403),
        )


def retry_after_s(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value (delay-seconds or an HTTP date); ``None`` when absent
    or unreadable."""
    if value is None or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


async def post_json(
    url: str, body: Any, *, timeout_s: float, error: type[SendError], what: str, keep: int = 500,
    follow_redirects: bool = True, headers: Mapping[str, str] | None = None,
    resolver: AbstractResolver | None = None,
) -> HttpAnswer:
    """POST ``body`` as JSON; a connection that fails is ``error`` (``in_doubt`` once the request
    may have been sent), any answer is returned for the receiver to judge. ``resolver`` answers
    the connection's name lookups (one that refuses an address refuses the connection)."""
    import aiohttp  # the HTTP client loads only where a receiver sends

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(resolver=resolver) if resolver is not None else None
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
            session.post(url, json=body, allow_redirects=follow_redirects, headers=headers) as response,
        ):
            text = (await response.text())[:keep]
            return HttpAnswer(
                response.status, text, response.headers.get("Retry-After"), response.headers.get("Location")
            )
    except aiohttp.ClientConnectorError as exc:
        raise error(f"{what} unreachable: {type(exc).__name__}") from exc
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise error(f"{what} unreachable: {type(exc).__name__}: {exc}", in_doubt=True) from exc
