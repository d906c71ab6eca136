"""The outbox's contract: a queued notification, the store that keeps it, and what its message says.

The daemon decides and queues notifications in its state store; the delivery
(:mod:`diagnoser.notify.delivery`) sends them in order through an :class:`OutboxStore`, and renders
each one with :func:`render_entry` when it sends it, a pure function of the entry, so a message sent
again after a restart reads exactly as it first would have. The time shown is when the notification
was decided, not when Slack finally took it. ::

    message = render_entry(entry)
    client.chat_postMessage(channel="#oncall", text=message.text, blocks=message.blocks)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from diagnoser.models import Diagnosis, Finding
from diagnoser.notify.slack import (
    SlackMessage,
    render_alert_report,
    render_finding,
    render_repeat,
    render_resolved,
    render_severity_change,
)

__all__ = ["NotificationKind", "OutboxEntry", "OutboxStore", "render_entry"]


class NotificationKind(StrEnum):
    """Why a message is sent; the Slack renderer picks its layout from it."""

    new = "new"
    #: Still there after the cooldown: a reminder in the same thread.
    repeat = "repeat"
    severity_changed = "severity_changed"
    resolved = "resolved"
    #: A diagnosis requested by an Alertmanager alert (not tied to one finding).
    alert_report = "alert_report"


@dataclass(frozen=True)
class OutboxEntry:
    """One queued notification: what to say and, for threading, which finding it belongs to."""

    id: int
    fingerprint: str | None
    kind: NotificationKind
    payload: dict[str, Any]
    created_at: float
    attempts: int
    marker: str | None = None
    next_attempt_at: float = 0.0
    attempt_started_at: float | None = None
    last_error: str | None = None

    @property
    def in_doubt(self) -> bool:
        """True when an earlier post may have reached Slack without its answer reaching us."""
        return self.attempt_started_at is not None

    @property
    def finding(self) -> Finding | None:
        raw = self.payload.get("finding")
        return Finding.model_validate(raw) if raw is not None else None


class OutboxStore(Protocol):
    """What the delivery needs of the store that keeps the outbox (the daemon's state file)."""

    def pending(self, limit: int = 100) -> list[OutboxEntry]: ...

    def begin_attempt(self, entry_id: int, *, marker: str, now: float | None = None) -> None: ...

    def attempt_failed(
        self, entry_id: int, error: str, *, retry_at: float, in_doubt: bool, count_attempt: bool = False
    ) -> None: ...

    def dead_letter(self, entry_id: int, error: str, *, now: float | None = None) -> None: ...

    def mark_sent(
        self, entry_id: int, *, channel: str | None = None, ts: str | None = None, starts_thread: bool = False
    ) -> None: ...

    def thread_of(self, fp: str) -> tuple[str | None, str | None]: ...

    def remember(self, key: str, value: str) -> None: ...

    def recall(self, key: str) -> str | None: ...


def render_entry(entry: OutboxEntry) -> SlackMessage:
    """The Slack message for a queued notification (pure; the time shown is when it was decided)."""
    at = datetime.fromtimestamp(entry.created_at, UTC)
    if entry.kind is NotificationKind.alert_report:
        diagnosis = Diagnosis.model_validate(entry.payload["diagnosis"])
        return render_alert_report(
            diagnosis,
            alert=str(entry.payload.get("alert", "an alert")),
            scope=dict(entry.payload.get("scope") or {}),
        )
    finding = entry.finding
    assert finding is not None, f"outbox entry {entry.id} of kind {entry.kind} has no finding"
    if entry.kind is NotificationKind.resolved:
        return render_resolved(finding, at=at)
    if entry.kind is NotificationKind.repeat:
        return render_repeat(finding, at=at)
    if entry.kind is NotificationKind.severity_changed:
        return render_severity_change(finding, previous=str(entry.payload.get("previous_severity")), at=at)
    return render_finding(finding, at=at)
