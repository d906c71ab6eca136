"""The outbox's contract: a queued notification, the store that keeps it, and what its message says.

The daemon decides and queues notifications in its state store; the delivery
(:mod:`diagnoser.notify.delivery`) sends them in order through an :class:`OutboxStore`, and renders
each one with :func:`render_entry` when it sends it, a pure function of the entry, so a message sent
again after a restart reads exactly as it first would have. The time shown is when the notification
was decided, not when Slack finally took it. An entry's payload is typed per kind
(:mod:`diagnoser.notify.payloads`); it is parsed when first read, so one that no longer parses is
dead-lettered by the delivery instead of blocking the queue. ::

    message = render_entry(entry)
    client.chat_postMessage(channel="#oncall", text=message.text, blocks=message.blocks)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from diagnoser.models import Finding
from diagnoser.notify.incident_render import render_digest, render_incident, render_incident_reply
from diagnoser.notify.payloads import (
    AlertReportPayload,
    DigestPayload,
    FindingPayload,
    IncidentPayload,
    NotificationKind,
    Payload,
    parse_payload,
)
from diagnoser.notify.slack import (
    SlackMessage,
    render_alert_report,
    render_finding,
    render_repeat,
    render_resolved,
    render_severity_change,
)

__all__ = ["IncidentThread", "NotificationKind", "OutboxEntry", "OutboxStore", "render_entry", "render_reply"]


@dataclass(frozen=True)
class OutboxEntry:
    """One queued notification: what to say and, for threading, which incident it belongs to."""

    id: int
    fingerprint: str | None
    kind: NotificationKind
    raw: dict[str, Any]
    created_at: float
    attempts: int
    marker: str | None = None
    next_attempt_at: float = 0.0
    attempt_started_at: float | None = None
    last_error: str | None = None
    incident_id: int | None = None
    #: The receiver it is for (``None``: the first, or the only sender).
    receiver: str | None = None
    _parsed: list[Payload] = field(default_factory=list, compare=False, repr=False)

    @property
    def payload(self) -> Payload:
        """The typed payload (:class:`pydantic.ValidationError` when the stored one does not parse)."""
        if not self._parsed:
            self._parsed.append(parse_payload(self.kind, self.raw))
        return self._parsed[0]

    @property
    def in_doubt(self) -> bool:
        """True when an earlier post may have reached Slack without its answer reaching us."""
        return self.attempt_started_at is not None

    @property
    def finding(self) -> Finding | None:
        """The finding it is about: an incident's lead (``None`` for reports and digests)."""
        if self.kind in (NotificationKind.alert_report, NotificationKind.digest):
            return None
        payload = self.payload
        if isinstance(payload, IncidentPayload):
            return payload.view.lead
        return payload.finding if isinstance(payload, FindingPayload) else None


@dataclass(frozen=True)
class IncidentThread:
    """Where an incident's messages are: its own message (to edit) and the thread replies go in."""

    channel: str | None
    message_ts: str | None
    thread_ts: str | None
    #: 1: its first message reached the channel; -1: it was dead-lettered; 0: not yet.
    landed: int
    #: The incident has cleared (resolved) since.
    cleared: bool = False


class OutboxStore(Protocol):
    """What the delivery needs of the store that keeps the outbox (the daemon's state file)."""

    def pending(self, limit: int = 100) -> list[OutboxEntry]: ...

    def begin_attempt(self, entry_id: int, *, marker: str, now: float | None = None) -> None: ...

    def attempt_failed(
        self, entry_id: int, error: str, *, retry_at: float, in_doubt: bool, count_attempt: bool = False
    ) -> None: ...

    def dead_letter(
        self, entry_id: int, error: str, *, reason: str = "", now: float | None = None
    ) -> None: ...

    def mark_sent(
        self, entry_id: int, *, channel: str | None = None, ts: str | None = None, starts_thread: bool = False
    ) -> None: ...

    def reset_backoff(self, *, except_id: int) -> None: ...

    def retry_dead_letters(
        self, *, older_than_s: float = 0.0, max_retries: int | None = None, now: float | None = None
    ) -> int: ...

    def thread_of(self, fp: str) -> tuple[str | None, str | None]: ...

    def incident_thread(self, incident_id: int) -> IncidentThread | None: ...

    def remember(self, key: str, value: str) -> None: ...

    def recall(self, key: str) -> str | None: ...


def render_entry(entry: OutboxEntry) -> SlackMessage:
    """The Slack message for a queued notification (pure; the time shown is when it was decided).

    For an incident it is the incident's own message (posted first, edited after); what a
    change says in its thread is :func:`render_reply`.
    """
    at = datetime.fromtimestamp(entry.created_at, UTC)
    payload = entry.payload
    if isinstance(payload, AlertReportPayload):
        return render_alert_report(payload.diagnosis, alert=payload.alert, scope=payload.scope)
    if isinstance(payload, DigestPayload):
        return render_digest(payload, at=at)
    if isinstance(payload, IncidentPayload):
        return render_incident(payload.view, at=at, joined_url=payload.joined_url)
    return _render_legacy(entry.kind, payload, at)


def render_reply(entry: OutboxEntry) -> SlackMessage | None:
    """The thread reply of an incident's change, or ``None`` when the change is an edit only."""
    payload = entry.payload
    if not isinstance(payload, IncidentPayload) or entry.kind is NotificationKind.new or payload.note is None:
        return None
    at = datetime.fromtimestamp(entry.created_at, UTC)
    return render_incident_reply(entry.kind.value, payload, at=at)


def _render_legacy(kind: NotificationKind, payload: Payload, at: datetime) -> SlackMessage:
    """An entry an older version queued about one finding."""
    assert isinstance(payload, FindingPayload), f"a {kind} entry without a finding"
    finding = payload.finding
    if kind is NotificationKind.resolved:
        return render_resolved(finding, at=at)
    if kind is NotificationKind.repeat:
        return render_repeat(finding, at=at)
    if kind is NotificationKind.severity_changed:
        return render_severity_change(finding, previous=str(payload.previous_severity), at=at)
    return render_finding(finding, at=at)
