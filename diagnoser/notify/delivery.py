"""Delivering the outbox to Slack: in order, once, without ever holding up a diagnosis.

The daemon's *outbox* job calls :meth:`OutboxDelivery.flush`; the diagnose job only queues (in
the state store, in the transaction that decides what to say) and wakes the job up, so a slow,
rate-limiting or absent Slack never delays a diagnosis. One flush takes the entries that are due,
oldest first,
and stops at the first one that must wait, so messages keep their order:

- **before each post** the entry is marked as under way with a *marker*, an id the message
  carries in its Slack metadata. A post that times out, gets a 5xx, or is cut short by a crash
  (SIGKILL) stays marked: it is *in doubt*. Before posting it again, the channel (or the thread)
  is searched for the marker with ``conversations.history`` / ``conversations.replies``: found,
  it is recorded as delivered; absent ``slack.in_doubt_settle_s`` after it was sent, it is
  posted again. Incoming webhooks cannot be read back: an in-doubt webhook post is sent again
  after the settle time (at least once; a duplicate is possible only when the webhook answered
  after the timeout). Use a bot token for exactly-once delivery.
- **a 429** reschedules the entry after its ``Retry-After`` (nothing sleeps); any other transient
  failure after an exponential backoff with jitter (``slack.retry_base_s`` doubling, "equal
  jitter", capped at ``slack.retry_max_s``).
- **a permanent refusal** (``channel_not_found``, ``invalid_auth``, ``not_in_channel``, a
  webhook's 403/404...) moves the entry to the state's ``dead_letters`` table with an ERROR log
  line and ``diagnoser_notifications_dead_lettered_total{kind, reason}``, and the queue goes on;
  refused blocks are retried as plain text; a reply whose thread is gone
  (``thread_not_found``) is posted at top level and becomes the finding's new thread. ::

    delivery = OutboxDelivery(store, sender, metrics, render_entry, settings.slack)
    await delivery.flush()
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from prometheus_client import Counter

from diagnoser.config import SlackSettings
from diagnoser.notify.outbox import NotificationKind, OutboxEntry, OutboxStore
from diagnoser.notify.slack import SlackMessage
from diagnoser.notify.slack_sender import SlackDelivery, SlackSender, SlackSendError

__all__ = ["DeliveryMetrics", "OutboxDelivery", "backoff_s"]

log = logging.getLogger(__name__)

_CHANNEL_KEY = "slack_channel_id"


class DeliveryMetrics(Protocol):
    """The counters delivery moves (:class:`diagnoser.daemon.metrics.DaemonMetrics` has them)."""

    notifications_sent: Counter
    notifications_failed: Counter
    notifications_dead_lettered: Counter
    notifications_in_doubt: Counter
    slack_threads_lost: Counter


class _Lookup(Enum):
    found = "found"
    absent = "absent"
    wait = "wait"


def backoff_s(
    attempt: int, *, base_s: float, max_s: float, rng: Callable[[], float] = random.random
) -> float:
    """Wait before try ``attempt + 1``: ``base * 2^(attempt-1)`` capped at ``max_s``, then "equal
    jitter" (between half and all of it), so replicas and entries do not retry in lockstep."""
    ceiling = min(max_s, base_s * float(2 ** max(0, min(attempt - 1, 30))))
    return ceiling / 2 + rng() * ceiling / 2


class OutboxDelivery:
    """Sends due outbox entries through a :class:`SlackSender`; see the module docstring."""

    def __init__(
        self,
        state: OutboxStore,
        sender: SlackSender,
        metrics: DeliveryMetrics,
        render: Callable[[OutboxEntry], SlackMessage],
        settings: SlackSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.sender = sender
        self.metrics = metrics
        self.render = render
        self.settings = settings
        self.clock = clock
        if sender.channel_id is None:
            sender.channel_id = state.recall(_CHANNEL_KEY)

    async def flush(self) -> None:
        """Deliver the due entries oldest first; stop at the first one that must wait."""
        for entry in self.state.pending():
            if entry.next_attempt_at > self.clock():
                return
            if not await self._deliver(entry):
                return

    async def _deliver(self, entry: OutboxEntry) -> bool:
        thread_ts = None
        if self.sender.threads and entry.fingerprint and entry.kind is not NotificationKind.new:
            _, thread_ts = self.state.thread_of(entry.fingerprint)
        if entry.in_doubt:
            outcome = await self._look_for(entry, thread_ts)
            if outcome is _Lookup.found:
                return True
            if outcome is _Lookup.wait:
                return False
        try:
            message = self.render(entry)
        except Exception:  # a payload that cannot be rendered would block the queue forever
            log.exception("dead-lettering outbox entry %d: cannot render it", entry.id)
            self._dead_letter(entry, "cannot render", reason="render")
            return True
        marker = entry.marker or f"dgn-{entry.id}-{secrets.token_hex(6)}"
        # Written before the post: if the process dies before the answer, the next start knows
        # this entry may be in the channel already.
        self.state.begin_attempt(entry.id, marker=marker, now=self.clock())
        try:
            delivery, new_thread = await self._post(entry, message, thread_ts, marker)
        except SlackSendError as exc:
            return self._failed(entry, exc)
        self._delivered(entry, delivery, starts_thread=new_thread)
        return True

    async def _post(
        self, entry: OutboxEntry, message: SlackMessage, thread_ts: str | None, marker: str
    ) -> tuple[SlackDelivery, bool]:
        try:
            return await self.sender.post(message, thread_ts=thread_ts, marker=marker), False
        except SlackSendError as exc:
            if exc.layout:
                # Slack refused the layout: the plain text still tells the story.
                log.warning("Slack refused the blocks of entry %d (%s); sending text only", entry.id, exc)
                text_only = SlackMessage(message.text)
                return await self.sender.post(text_only, thread_ts=thread_ts, marker=marker), False
            if exc.error == "thread_not_found" and thread_ts:
                log.warning(
                    "the Slack thread of entry %d is gone (%s); posting it at top level as the new thread",
                    entry.id,
                    exc,
                )
                self.metrics.slack_threads_lost.inc()
                return await self.sender.post(message, thread_ts=None, marker=marker), True
            raise

    def _delivered(self, entry: OutboxEntry, delivery: SlackDelivery, *, starts_thread: bool = False) -> None:
        self.state.mark_sent(entry.id, channel=delivery.channel, ts=delivery.ts, starts_thread=starts_thread)
        self.metrics.notifications_sent.labels(entry.kind.value).inc()
        channel = self.sender.channel_id
        if channel and self.state.recall(_CHANNEL_KEY) != channel:
            self.state.remember(_CHANNEL_KEY, channel)
        log.info("notified", extra={"kind": entry.kind.value, "entry": entry.id, "ts": delivery.ts})

    def _dead_letter(self, entry: OutboxEntry, error: str, *, reason: str) -> None:
        self.state.dead_letter(entry.id, error, now=self.clock())
        self.metrics.notifications_dead_lettered.labels(entry.kind.value, reason).inc()

    def _failed(self, entry: OutboxEntry, exc: SlackSendError) -> bool:
        self.metrics.notifications_failed.labels(entry.kind.value).inc()
        if exc.permanent:
            log.error(
                "dead-lettered outbox entry %d: Slack refused it for good: %s",
                entry.id,
                exc,
                extra={"kind": entry.kind.value, "reason": exc.error or "refused"},
            )
            self._dead_letter(entry, str(exc), reason=exc.error or "refused")
            return True
        attempts = entry.attempts + 1
        # When Slack said when, a little jitter on top, so replicas do not come back together.
        delay = exc.retry_after + random.random() if exc.retry_after is not None else self._backoff(attempts)
        self.state.attempt_failed(entry.id, str(exc), retry_at=self.clock() + delay, in_doubt=exc.in_doubt)
        log.warning(
            "notification queued until Slack answers: %s",
            exc,
            extra={
                "entry": entry.id,
                "kind": entry.kind.value,
                "attempts": attempts,
                "retry_in_s": round(delay, 1),
                "in_doubt": exc.in_doubt,
            },
        )
        return False

    async def _look_for(self, entry: OutboxEntry, thread_ts: str | None) -> _Lookup:
        """Whether an in-doubt post reached Slack: record it, or say to post again or to wait."""
        assert entry.attempt_started_at is not None
        now = self.clock()
        settles_at = entry.attempt_started_at + self.settings.in_doubt_settle_s
        settled = now >= settles_at
        if not self.sender.can_read_back or entry.marker is None:
            if not settled:
                return self._wait_in_doubt(entry, "waiting before posting again", settles_at)
            log.warning(
                "outbox entry %d may have been posted already; an incoming webhook cannot be read back,"
                " so it is posted again",
                entry.id,
            )
            self.metrics.notifications_in_doubt.labels("reposted_unverified").inc()
            return _Lookup.absent
        try:
            since = entry.attempt_started_at
            found = await self.sender.find_posted(entry.marker, thread_ts=thread_ts, since=since)
            if found is None and thread_ts is not None:
                # A reply whose thread was lost is reposted at top level: look there too.
                found = await self.sender.find_posted(entry.marker, thread_ts=None, since=since)
        except SlackSendError as exc:
            if exc.permanent:
                log.warning(
                    "cannot check whether outbox entry %d reached Slack (%s: the token needs channels:history"
                    " or groups:history); it is posted again",
                    entry.id,
                    exc,
                )
                self.metrics.notifications_in_doubt.labels("reposted_unverified").inc()
                return _Lookup.absent
            delay = exc.retry_after
            if delay is None:
                delay = self._backoff(entry.attempts + 1)
            self.state.attempt_failed(
                entry.id, f"in doubt: cannot look for it yet: {exc}", retry_at=now + delay, in_doubt=True,
                count_attempt=True,
            )
            return _Lookup.wait
        if found is not None:
            log.info("outbox entry %d had reached Slack after all; not posting it again", entry.id)
            self.metrics.notifications_in_doubt.labels("found").inc()
            self._delivered(entry, found)
            return _Lookup.found
        if not settled:
            return self._wait_in_doubt(entry, "not in the channel yet", settles_at)
        self.metrics.notifications_in_doubt.labels("absent").inc()
        log.info("outbox entry %d never reached Slack; posting it again", entry.id)
        return _Lookup.absent

    def _backoff(self, attempts: int) -> float:
        return backoff_s(attempts, base_s=self.settings.retry_base_s, max_s=self.settings.retry_max_s)

    def _wait_in_doubt(self, entry: OutboxEntry, why: str, retry_at: float) -> _Lookup:
        retry_at = max(retry_at, self.clock() + 0.05)
        self.state.attempt_failed(entry.id, f"in doubt: {why}", retry_at=retry_at, in_doubt=True)
        return _Lookup.wait
