"""Delivering the outbox through each :class:`~diagnoser.notify.sender.Receiver`: in order, once, unwaited.

One delivery per receiver (``notify.receivers``), each over that receiver's rows of the outbox
(:meth:`~diagnoser.daemon.state.StateStore.outbox_for`): a receiver that is down, slow or
refusing holds only its own queue. The receiver renders each entry into its own message type
and says what it can do (:class:`~diagnoser.notify.sender.Capabilities`); what follows is said
in Slack's terms, the richest receiver, and holds for every one within its capabilities.

The daemon's *outbox* job calls :meth:`OutboxDelivery.flush`; the diagnose job only queues (in
the state store, in the transaction that decides what to say) and wakes the job up, so a slow,
rate-limiting or absent Slack never delays a diagnosis. One flush takes the entries that are due,
oldest first; an incident's messages keep their order (one that must wait holds the later ones of
its incident), and no message holds up the others:

- **before each post** the entry is marked as under way with a *marker*, an id the message
  carries in its Slack metadata. A post that times out, gets a 5xx, or is cut short by a crash
  (SIGKILL) stays marked: it is *in doubt*. Before posting it again, the channel (or the thread)
  is searched for the marker with ``conversations.history`` / ``conversations.replies``: found,
  it is recorded as delivered; absent ``slack.in_doubt_settle_s`` after it was sent, it is
  posted again. Incoming webhooks cannot be read back: an in-doubt webhook post is sent again
  after the settle time (at least once; a duplicate is possible only when the webhook answered
  after the timeout). Use a bot token for exactly-once delivery.
- **a 429** reschedules the entry after its ``Retry-After`` (nothing sleeps). When it covers one
  kind of call (:attr:`~diagnoser.errors.SendError.scope`: Slack limits ``chat.update`` apart from
  ``chat.postMessage``) only entries needing that kind wait; otherwise the receiver does.
- **refused credentials** (:attr:`~diagnoser.errors.SendError.auth`) and any other transient
  failure stop the flush for an exponential backoff with jitter (``retry_base_s`` doubling,
  "equal jitter", capped at ``retry_max_s``); credentials refused for ``dead_letter_after_s``
  dead-letter the entries.
- **an edit refused for good** (``cant_update_message``, ``edit_window_closed``...) is posted
  anew, in the incident's thread or as a new message.
- **a permanent refusal** (``channel_not_found``, ``not_in_channel``, a webhook's 404...) moves
  the entry to the state's ``dead_letters`` table with an ERROR log line and
  ``diagnoser_notifications_dead_lettered_total{kind, reason}``, and the queue goes on; dead
  letters are put back in their place every ``dead_letter_retry_s``. A message about an incident
  whose first message is a dead letter waits with it (never a "Resolved" for an incident nobody
  was told about); a first message whose incident cleared before it could go is dropped (its
  resolution, when queued, is posted on its own); refused blocks are retried as plain text; a
  reply whose thread is gone (``thread_not_found``) is posted at top level and becomes the
  incident's new thread.
- **stuck**: when the oldest undelivered entry is older than ``stuck_after_s``, one ERROR line,
  :attr:`OutboxDelivery.stuck` (``/readyz`` answers 503 with it) and
  ``diagnoser_receiver_stuck{receiver}``.
- **a success** resets the other entries' backoff: after an outage the queue drains at the
  sender's rate (about one message per second), in order.

An incident's entry is an *edit* of its message (``chat.update``, when the sender can), a *reply*
in its thread (:func:`~diagnoser.notify.outbox.render_reply`), or both: the edit first (it is
idempotent), then the reply, which carries the marker. A sender without threads posts only an
incident's first message and its resolution. ::

    outbox = store.outbox_for(receiver.name)
    delivery = OutboxDelivery(outbox, receiver, metrics, settings=settings.notify.delivery)
    await delivery.flush()
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from diagnoser.config import DeliverySettings, SlackSettings
from diagnoser.errors import SendError, StateError
from diagnoser.notify.outbox import IncidentThread, NotificationKind, OutboxEntry, OutboxStore, render_reply
from diagnoser.notify.payloads import FindingPayload, IncidentPayload
from diagnoser.notify.sender import Delivery, Receiver, Sender
from diagnoser.notify.slack import SlackMessage
from diagnoser.redact import scrub_text

__all__ = ["DeliveryMetrics", "FanOut", "OutboxDelivery", "backoff_s"]

log = logging.getLogger(__name__)

_CHANNEL_KEY = "slack_channel_id"
#: A reply refused with these has no thread to go in any more (its parent deleted): it is posted
#: at top level and becomes the incident's thread.
_THREAD_GONE = frozenset({"thread_not_found", "message_not_found"})


class DeliveryMetrics(Protocol):
    """The counters delivery moves (:class:`diagnoser.daemon.metrics.DaemonMetrics` has them)."""

    notifications_sent: Counter
    notifications_failed: Counter
    notifications_dead_lettered: Counter
    notifications_in_doubt: Counter
    slack_threads_lost: Counter
    receiver_stuck: Gauge


class _Outcome(Enum):
    """What one entry's turn left: ``done`` (sent, dead-lettered or dropped), ``held`` (it waits
    for a limit of its own; the entries of other incidents go on), ``stop`` (the receiver itself
    is failing: everything waits for the backoff)."""

    done = "done"
    held = "held"
    stop = "stop"


class _Lookup(Enum):
    found = "found"
    absent = "absent"
    wait = "wait"


@dataclass(frozen=True)
class _Plan:
    """What one entry does: edit its incident's message, post (top level or in a thread), or both."""

    edit_ts: str | None
    edited: Any
    post: Any
    thread_ts: str | None


class _Rendered:
    """A plain :class:`Sender` of Slack messages given its renderer (how deliveries were built
    before receivers rendered for themselves)."""

    def __init__(self, sender: Sender[Any], render: Callable[[OutboxEntry], SlackMessage]) -> None:
        self.sender = sender
        self.name = "Slack"
        self.render = render
        self.render_reply = render_reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sender, name)

    @property
    def channel_id(self) -> str | None:
        return self.sender.channel_id

    @channel_id.setter
    def channel_id(self, value: str | None) -> None:
        self.sender.channel_id = value

    def plain(self, message: SlackMessage) -> SlackMessage:
        return SlackMessage(message.text)


def _knobs(settings: DeliverySettings | SlackSettings | None) -> DeliverySettings:
    """The delivery's knobs, from ``notify.delivery`` or the older ``slack.*`` ones."""
    if settings is None or isinstance(settings, DeliverySettings):
        return settings or DeliverySettings()
    fields = DeliverySettings.model_fields
    return DeliverySettings(**{k: v for k, v in settings.model_dump().items() if k in fields})


def _order_key(entry: OutboxEntry) -> object:
    """What an entry keeps its order within: its incident (or, for an older version's entry,
    its finding); ``None`` for one about no incident (a digest), which keeps its place in all."""
    if entry.incident_id is not None:
        return ("incident", entry.incident_id)
    if entry.fingerprint:
        return ("finding", entry.fingerprint)
    return None


def backoff_s(
    attempt: int, *, base_s: float, max_s: float, rng: Callable[[], float] = random.random
) -> float:
    """Wait before try ``attempt + 1``: ``base * 2^(attempt-1)`` capped at ``max_s``, then "equal
    jitter" (between half and all of it), so replicas and entries do not retry in lockstep."""
    ceiling = min(max_s, base_s * float(2 ** max(0, min(attempt - 1, 30))))
    return ceiling / 2 + rng() * ceiling / 2


class OutboxDelivery:
    """Sends due outbox entries through a :class:`Receiver`; see the module docstring.

    ``render``: for a plain :class:`Sender` of Slack messages, its renderer (the receiver's own
    otherwise); ``settings``: the delivery's knobs (``notify.delivery``).
    """

    def __init__(
        self,
        state: OutboxStore,
        sender: Receiver[Any] | Sender[Any],
        metrics: DeliveryMetrics,
        render: Callable[[OutboxEntry], SlackMessage] | None = None,
        settings: DeliverySettings | SlackSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        receiver: Any = _Rendered(sender, render) if render is not None else sender
        self.sender: Receiver[Any] = receiver
        self.metrics = metrics
        self.settings = _knobs(settings)
        self.clock = clock
        self._dead_checked = clock()
        #: Until when each rate-limited kind of call (``post``, ``update``, ``read_back``) waits.
        self._limited: dict[str, float] = {}
        #: The kind of call each rate-limited entry waits for.
        self._held_by: dict[int, str] = {}
        #: Since when the receiver refuses the credentials (``None``: it does not).
        self._auth_failing_since: float | None = None
        #: Incidents whose first message was dropped because they cleared before it could go:
        #: their later messages, but the resolution, are dropped too.
        self._untold: set[int] = set()
        #: Why the receiver is stuck (:attr:`stuck`), ``None`` while it is not.
        self.stuck: str | None = None
        if sender.channel_id is None:
            sender.channel_id = state.recall(_CHANNEL_KEY)

    async def flush(self) -> None:
        """Deliver the due entries oldest first.

        An incident's messages keep their order: one that must wait holds the later ones of
        its incident. One waiting for a rate limit of its own kind of call (a 429 on chat.update)
        holds nobody else; a failure of the receiver itself (unreachable, 5xx, credentials
        refused) stops the flush until its backoff is over.
        """
        self._retry_dead_letters()
        waiting: list[OutboxEntry] = []
        held: set[object] = set()
        stopped = False
        for entry in self.state.pending():
            key = _order_key(entry)
            if stopped or key in held:
                waiting.append(entry)
                continue
            if entry.next_attempt_at > self.clock():
                outcome = _Outcome.held if self._limited_for(entry) else _Outcome.stop
            else:
                outcome = await self._deliver(entry)
            if outcome is _Outcome.done:
                continue
            waiting.append(entry)
            if outcome is _Outcome.stop or key is None:
                stopped = True  # an entry about no incident (a digest, a report) keeps its place
            held.add(key)
        self._note_stuck(waiting)

    def _limited_for(self, entry: OutboxEntry) -> bool:
        """True when ``entry`` waits for a rate limit of one kind of call that is still in force
        (known since this process began; after a restart the entry waits as for an outage)."""
        scope = self._held_by.get(entry.id)
        return scope is not None and self._limited.get(scope, 0.0) > self.clock()

    def _limits_in_force(self, plan: _Plan, entry: OutboxEntry) -> str | None:
        """The kind of call ``plan`` needs that is rate-limited now, if any."""
        now = self.clock()
        needs = [
            scope
            for scope, needed in (
                ("update", plan.edit_ts is not None and plan.edited is not None),
                ("post", plan.post is not None),
                ("read_back", plan.post is not None and entry.in_doubt),
            )
            if needed
        ]
        return next((scope for scope in needs if self._limited.get(scope, 0.0) > now), None)

    def _note_stuck(self, waiting: list[OutboxEntry]) -> None:
        """Say (an ERROR line, :attr:`stuck`, the gauge) when the oldest undelivered entry is too old."""
        name = self.sender.name
        oldest = min(waiting, key=lambda e: e.created_at, default=None)
        age = self.clock() - oldest.created_at if oldest is not None else 0.0
        if oldest is None or age < self.settings.stuck_after_s:
            if self.stuck is not None:
                log.info("receiver %s delivers again", name, extra={"receiver": name})
            self.stuck = None
            self.metrics.receiver_stuck.labels(name).set(0)
            return
        reason = (
            f"receiver {name} stuck: {len(waiting)} notification(s) queued, the oldest"
            f" ({oldest.kind.value}, entry {oldest.id}) for {age:.0f}s:"
            f" {oldest.last_error or 'not tried yet'}"
        )
        reason = scrub_text(reason)  # /readyz is unauthenticated: no credential an error quoted
        if self.stuck is None:
            log.error(reason, extra={"receiver": name, "entry": oldest.id, "queued": len(waiting)})
        self.stuck = reason
        self.metrics.receiver_stuck.labels(name).set(1)

    def _retry_dead_letters(self) -> None:
        """Every tenth of ``dead_letter_retry_s``, put back the dead letters due for another try."""
        now = self.clock()
        if now - self._dead_checked < self.settings.dead_letter_retry_s / 10:
            return
        self._dead_checked = now
        count = self.state.retry_dead_letters(
            older_than_s=self.settings.dead_letter_retry_s,
            max_retries=self.settings.dead_letter_retries,
            now=now,
        )
        if count:
            log.warning("%d dead-lettered notification(s) queued again for another try", count)

    async def _deliver(self, entry: OutboxEntry) -> _Outcome:
        incident = self.state.incident_thread(entry.incident_id) if entry.incident_id is not None else None
        if incident is not None and self._too_late(entry, incident):
            return _Outcome.done
        if incident is not None and incident.landed < 0 and entry.kind is not NotificationKind.new:
            # Its first message never reached the channel: it waits with it (and is retried with it).
            self._dead_letter(entry, "its incident's first message never reached the channel",
                              reason="first_not_landed")
            return _Outcome.done
        try:
            entry = await self._linked(entry)
            plan = self._plan(entry, incident)
        except Exception:  # a payload that cannot be rendered would block the queue forever
            log.exception("dead-lettering outbox entry %d: cannot render it", entry.id)
            self._dead_letter(entry, "cannot render", reason="render")
            return _Outcome.done
        if self._limits_in_force(plan, entry) is not None:
            return _Outcome.held
        if plan.post is None:
            try:
                edited = await self._edit(entry, plan)
            except SendError as exc:
                return self._failed(entry, exc)
            if edited:
                self._delivered(entry, Delivery(self.sender.channel_id, None))
                return _Outcome.done
            # The message cannot be edited any more: what the edit said is posted anew.
            plan = _Plan(None, None, plan.edited, plan.thread_ts)
        if entry.in_doubt:
            outcome = await self._look_for(entry, plan.thread_ts)
            if outcome is _Lookup.found:
                return _Outcome.done
            if outcome is _Lookup.wait:
                return _Outcome.stop
        marker = entry.marker or f"dgn-{entry.id}-{secrets.token_hex(6)}"
        # Written before the post: if the process dies before the answer, the next start knows
        # this entry may be in the channel already.
        self.state.begin_attempt(entry.id, marker=marker, now=self.clock())
        try:
            await self._edit(entry, plan)
            delivery, new_thread = await self._post(entry, plan.post, plan.thread_ts, marker)
        except SendError as exc:
            return self._failed(entry, exc)
        self._delivered(entry, delivery, starts_thread=new_thread)
        return _Outcome.done

    async def _linked(self, entry: OutboxEntry) -> OutboxEntry:
        """A merged incident's note with a link to the thread its findings joined, when the
        receiver can give one (Slack's permalink); without it when it cannot."""
        payload = entry.payload
        if not isinstance(payload, IncidentPayload) or payload.merged_into is None or payload.joined_url:
            return entry
        ask = getattr(self.sender, "permalink", None)
        host = self.state.incident_thread(payload.merged_into) if ask is not None else None
        if ask is None or host is None or host.message_ts is None:
            return entry
        try:
            url = await ask(host.message_ts, channel=host.channel)
        except SendError as exc:  # a link is a courtesy: the note goes without it
            log.warning("no link to incident %d's thread for entry %d: %s", payload.merged_into, entry.id,
                        exc)  # fmt: skip
            return entry
        if not url:
            return entry
        linked = payload.model_copy(update={"joined_url": str(url)})
        return replace(entry, raw=json.loads(linked.model_dump_json()), _parsed=[linked])

    def _too_late(self, entry: OutboxEntry, incident: IncidentThread) -> bool:
        """Drop what would announce, as if current, an incident that cleared before anyone was told.

        Its first message (late: an outage, credentials refused, a dead letter retried) is
        dropped with a log line, and so are its later changes; its resolution, when one was
        queued, is still posted, standalone, so the channel learns of it as it now stands.
        """
        untold = entry.incident_id in self._untold
        # One in doubt may be in the channel already: it is looked for (and resolved) as usual.
        if not incident.cleared or entry.in_doubt or not (
            untold or (entry.kind is NotificationKind.new and incident.landed != 1)
        ):
            return False
        if entry.kind is NotificationKind.resolved:
            return False
        assert entry.incident_id is not None
        self._untold.add(entry.incident_id)
        log.warning(
            "not posting outbox entry %d (%s): its incident cleared before its first message could be"
            " delivered; its resolution, if queued, says so",
            entry.id,
            entry.kind.value,
            extra={"receiver": self.sender.name, "entry": entry.id, "kind": entry.kind.value},
        )
        # Recorded as landed without a message: a resolution that follows is posted on its own.
        self.state.mark_sent(entry.id)
        return True

    def _plan(self, entry: OutboxEntry, incident: IncidentThread | None) -> _Plan:
        receiver = self.sender
        caps = receiver.capabilities
        kind = entry.kind
        payload = entry.payload
        thread = incident.thread_ts if incident is not None and caps.threads else None
        if isinstance(payload, FindingPayload) or (incident is None and kind is not NotificationKind.digest):
            # A report, or an entry an older version queued about one finding.
            if caps.threads and entry.fingerprint and kind is not NotificationKind.new:
                thread = self.state.thread_of(entry.fingerprint)[1]
            return _Plan(None, None, receiver.render(entry), thread)
        if kind is NotificationKind.digest:
            return _Plan(None, None, receiver.render(entry), None)
        assert incident is not None
        if kind is NotificationKind.new:
            in_digest = isinstance(payload, IncidentPayload) and payload.in_digest
            return _Plan(None, None, receiver.render(entry), thread if in_digest else None)
        if kind is NotificationKind.alert_report:
            return _Plan(None, None, receiver.render(entry), thread)
        # A confirm probe's verdict is a reply only: the message already says it resolved.
        edit_ts = incident.message_ts if caps.update and kind is not NotificationKind.verified else None
        edited = receiver.render(entry) if edit_ts else None
        reply = receiver.render_reply(entry)
        if reply is not None and not caps.threads and kind.value not in caps.without_threads:
            reply = None
        return _Plan(edit_ts, edited, reply, thread)

    async def _edit(self, entry: OutboxEntry, plan: _Plan) -> bool:
        """Edit the incident's message in place; ``False`` when it can no longer be edited
        (``cant_update_message``, ``edit_window_closed``, ``message_not_found``...)."""
        if plan.edit_ts is None or plan.edited is None:
            return True
        try:
            await self.sender.update(plan.edited, ts=plan.edit_ts)
        except SendError as exc:
            if not exc.permanent:
                raise
            log.warning(
                "cannot edit the message of entry %d (%s); the change goes out as a new message",
                entry.id,
                exc,
                extra={"receiver": self.sender.name, "entry": entry.id, "reason": exc.error},
            )
            return False
        return True

    async def _post(
        self, entry: OutboxEntry, message: Any, thread_ts: str | None, marker: str
    ) -> tuple[Delivery, bool]:
        try:
            return await self.sender.post(message, thread_ts=thread_ts, marker=marker), False
        except SendError as exc:
            if exc.layout:
                # Slack refused the layout: the plain text still tells the story.
                log.warning("Slack refused the blocks of entry %d (%s); sending text only", entry.id, exc)
                text_only = self.sender.plain(message)
                return await self.sender.post(text_only, thread_ts=thread_ts, marker=marker), False
            if exc.error in _THREAD_GONE and thread_ts:
                log.warning(
                    "the Slack thread of entry %d is gone (%s); posting it at top level as the new thread",
                    entry.id,
                    exc,
                )
                self.metrics.slack_threads_lost.inc()
                return await self.sender.post(message, thread_ts=None, marker=marker), True
            raise

    def _delivered(self, entry: OutboxEntry, delivery: Delivery, *, starts_thread: bool = False) -> None:
        self._auth_failing_since = None
        self._held_by.pop(entry.id, None)
        self.state.mark_sent(entry.id, channel=delivery.channel, ts=delivery.ts, starts_thread=starts_thread)
        self.metrics.notifications_sent.labels(entry.kind.value).inc()
        # The channel answers again: the others need not wait out the backoff of the outage.
        self.state.reset_backoff(except_id=entry.id)
        channel = self.sender.channel_id
        if channel and self.state.recall(_CHANNEL_KEY) != channel:
            self.state.remember(_CHANNEL_KEY, channel)
        log.info(
            "notified",
            extra={"kind": entry.kind.value, "entry": entry.id, "ts": delivery.ts,
                   "receiver": self.sender.name},
        )

    def _dead_letter(self, entry: OutboxEntry, error: str, *, reason: str) -> None:
        self._held_by.pop(entry.id, None)
        self.state.dead_letter(entry.id, error, reason=reason, now=self.clock())
        self.metrics.notifications_dead_lettered.labels(entry.kind.value, reason).inc()

    def _failed(self, entry: OutboxEntry, exc: SendError) -> _Outcome:
        self.metrics.notifications_failed.labels(entry.kind.value).inc()
        now = self.clock()
        if exc.auth:
            since = self._auth_failing_since = self._auth_failing_since or now
            if now - since < self.settings.dead_letter_after_s:
                return self._retry_later(entry, exc, self._backoff(entry.attempts + 1), _Outcome.stop)
        elif not exc.permanent:
            self._auth_failing_since = None
        if exc.permanent or exc.auth:
            log.error(
                "dead-lettered outbox entry %d: %s refused it for good: %s",
                entry.id,
                self.sender.name,
                exc,
                extra={"kind": entry.kind.value, "reason": exc.error or "refused",
                       "receiver": self.sender.name},
            )
            self._dead_letter(entry, str(exc), reason=exc.error or "refused")
            return _Outcome.done
        if exc.retry_after is not None:
            # When the service said when, a little jitter on top, so replicas do not come back together.
            delay = exc.retry_after + random.random()
            if exc.scope is not None:
                # A limit on one kind of call: the entries that need only other kinds go on.
                self._limited[exc.scope] = max(self._limited.get(exc.scope, 0.0), now + delay)
                self._held_by[entry.id] = exc.scope
                return self._retry_later(entry, exc, delay, _Outcome.held)
            return self._retry_later(entry, exc, delay, _Outcome.stop)
        return self._retry_later(entry, exc, self._backoff(entry.attempts + 1), _Outcome.stop)

    def _retry_later(self, entry: OutboxEntry, exc: SendError, delay: float, outcome: _Outcome) -> _Outcome:
        attempts = entry.attempts + 1
        self.state.attempt_failed(entry.id, str(exc), retry_at=self.clock() + delay, in_doubt=exc.in_doubt)
        log.warning(
            "notification queued until %s answers: %s",
            self.sender.name,
            exc,
            extra={
                "receiver": self.sender.name,
                "entry": entry.id,
                "kind": entry.kind.value,
                "attempts": attempts,
                "retry_in_s": round(delay, 1),
                "in_doubt": exc.in_doubt,
                "scope": exc.scope or "receiver",
            },
        )
        return outcome

    async def _look_for(self, entry: OutboxEntry, thread_ts: str | None) -> _Lookup:
        """Whether an in-doubt post reached Slack: record it, or say to post again or to wait."""
        assert entry.attempt_started_at is not None
        now = self.clock()
        settles_at = entry.attempt_started_at + self.settings.in_doubt_settle_s
        settled = now >= settles_at
        if not self.sender.capabilities.read_back or entry.marker is None:
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
        except SendError as exc:
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


class FanOut:
    """Every receiver's delivery in turn: each has its own rows, so one that must wait (or
    breaks) holds only its own queue; a failure of the state file stops them all."""

    def __init__(self, deliveries: list[OutboxDelivery]) -> None:
        self.deliveries = deliveries

    @property
    def stuck(self) -> str | None:
        """Why a receiver is stuck (the first that is), ``None`` while none is."""
        return next((d.stuck for d in self.deliveries if d.stuck is not None), None)

    async def flush(self) -> None:
        for delivery in self.deliveries:
            try:
                await delivery.flush()
            except StateError:
                raise
            except Exception:  # one receiver's bug must not silence the others
                log.exception("delivering to %s failed; the other receivers go on", delivery.sender.target)
