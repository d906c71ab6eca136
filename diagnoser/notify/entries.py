"""What a Slack message says for a queued notification: the outbox entry's kind picks the layout.

The daemon decides and queues notifications (:class:`~diagnoser.daemon.state.OutboxEntry`); the
outbox delivery renders each one with :func:`render_entry` when it sends it, a pure function of
the entry, so a message sent again after a restart reads exactly as it first would have. The time
shown is when the notification was decided, not when Slack finally took it. ::

    message = render_entry(entry)
    client.chat_postMessage(channel="#oncall", text=message.text, blocks=message.blocks)
"""

from __future__ import annotations

from datetime import UTC, datetime

from diagnoser.daemon.state import NotificationKind, OutboxEntry
from diagnoser.models import Diagnosis
from diagnoser.notify.slack import (
    SlackMessage,
    render_alert_report,
    render_finding,
    render_repeat,
    render_resolved,
    render_severity_change,
)

__all__ = ["render_entry"]


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
