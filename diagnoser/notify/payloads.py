"""What a queued notification says, one typed model per kind, parsed back from the state file.

The daemon decides about *incidents* (:mod:`diagnoser.daemon.reconcile`): a cause and the
symptoms it explains, or a symptom alone. Every notification about one carries an
:class:`IncidentView`, the incident as it was when the notification was decided, so a message
rendered after a restart (or a chat.update sent late) says what was true then. ::

    payload = parse_payload(NotificationKind.new, json.loads(row))
    assert isinstance(payload, IncidentPayload)
    print(payload.view.lead.cause)
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from diagnoser.models import Diagnosis, Evidence, Finding, Severity
from diagnoser.numbers import format_number
from diagnoser.probe.confirm import Confirmation

__all__ = [
    "AlertReportPayload",
    "CapacityReading",
    "DigestPayload",
    "DigestRow",
    "FindingPayload",
    "IncidentPayload",
    "IncidentView",
    "NotificationKind",
    "Payload",
    "dump_payload",
    "parse_payload",
]


class NotificationKind(StrEnum):
    """Why a message is sent; the renderer picks its layout and the delivery its action from it."""

    #: An incident's first message (top level, or in a digest's thread).
    new = "new"
    #: The incident's message edited in place (chat.update): a symptom joined, a number moved.
    update = "update"
    #: Still there after the cooldown: a reminder in its thread.
    repeat = "repeat"
    #: Edited in place, and a reply in its thread saying what changed.
    severity_changed = "severity_changed"
    #: A cause now explains the incident (edited, and a reply when the rate allows).
    cause_changed = "cause_changed"
    resolved = "resolved"
    #: It came back within ``daemon.reopen_within_s``: its thread is reopened.
    reopened = "reopened"
    #: Many incidents opened at once: one table message; their details go in its thread.
    digest = "digest"
    #: A diagnosis requested by an Alertmanager alert (in its incident's thread when it has one).
    alert_report = "alert_report"
    #: The confirm probe after a resolution: a reply in its thread ("p99 at 95 req/s: 2.4 s ->
    #: 140 ms, confirmed"); the message itself is not edited.
    verified = "verified"


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CapacityReading(_Payload):
    """A service's load now against the capacity on record for it (``diagnose capacity``).

    The load is the service's request rate read from Prometheus when the incident's message was
    decided; the capacity is the newest run recorded for a target that measures the service.
    """

    service: str
    #: The target the capacity run stepped (a URL).
    target: str
    capacity_rps: float
    #: Every step held up to the run's highest rate (``limit: max_rate``): a lower bound.
    at_least: bool = False
    slo_p99_ms: float
    slo_error_ratio: float
    #: When the run finished (Unix seconds).
    measured_at: float
    #: Requests per second the service serves now; ``None`` when Prometheus could not tell.
    rps_now: float | None = None

    @property
    def over(self) -> bool:
        """The load now is above the capacity on record."""
        return self.rps_now is not None and self.rps_now > self.capacity_rps

    @property
    def headroom(self) -> float | None:
        """The share of the capacity still unused (negative over it)."""
        if self.rps_now is None or self.capacity_rps <= 0:
            return None
        return 1.0 - self.rps_now / self.capacity_rps

    def text(self) -> str:
        """``at 410 req/s now; capacity 520 req/s at p99 <= 300 ms, measured 2026-12-01 14:02 UTC;
        headroom 21 %``, or ``over capacity: 610 req/s now against 520 req/s measured ...``."""
        measured = datetime.fromtimestamp(self.measured_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        capacity = f"{format_number(self.capacity_rps)} req/s"
        slo = f"p99 <= {format_number(self.slo_p99_ms)} ms"
        if self.rps_now is None:
            bound = "at least " if self.at_least else ""
            return f"capacity {bound}{capacity} at {slo}, measured {measured}; the load now could not be read"
        now = f"{format_number(self.rps_now)} req/s"
        if self.over and self.at_least:
            return (
                f"at {now} now, above the {capacity} that held {slo} when measured {measured}"
                " (the most that run tried: its capacity was not reached)"
            )
        if self.over:
            beyond = round((self.rps_now / self.capacity_rps - 1.0) * 100)
            return (
                f"over capacity: {now} now against {capacity} measured {measured} at {slo}"
                f" ({beyond} % over)"
            )
        headroom = round((self.headroom or 0.0) * 100)
        bound = "at least " if self.at_least else ""
        return (
            f"at {now} now; capacity {bound}{capacity} at {slo}, measured {measured};"
            f" headroom {bound}{headroom} %"
        )


class IncidentView(_Payload):
    """An incident as its message shows it: the lead finding and what it explains."""

    #: The cause (or, while nothing explains it, the symptom) the header names.
    lead: Finding
    #: The symptoms and secondary causes the lead explains in its scope, most important first.
    explained: list[Finding] = Field(default_factory=list)
    opened_at: float
    state: Literal["open", "resolved", "merged"] = "open"
    resolved_at: float | None = None
    #: How long it must stay clear before it is resolved (shown in the message).
    resolve_after_s: float = 0.0
    #: How many times it came back within ``reopen_within_s``.
    reopened: int = 0
    #: The cause this incident was about while its rule no longer holds (its symptoms lag, or
    #: came back without it): named as not seen now, never as the current cause.
    earlier_cause: Finding | None = None
    #: What the earlier cause's own evidence reads now (its rule no longer holds): told instead
    #: of its old numbers ("55 % of 20 connections in use now"); empty when it could not be read.
    earlier_now: list[Evidence] = Field(default_factory=list)
    #: When the lead cause was last seen clearing (resolution follows the cause, not its symptoms).
    cause_cleared_at: float | None = None
    #: Resolved while these symptoms (identities) were still there: their recovery is told after.
    lagging: list[str] = Field(default_factory=list)
    #: The load now against the capacity on record for its service, when one is on record.
    capacity: CapacityReading | None = None

    @property
    def findings(self) -> list[Finding]:
        return [self.lead, *self.explained]

    @property
    def severity(self) -> Severity:
        return max((f.severity for f in self.findings), key=lambda s: s.rank)

    @property
    def has_cause(self) -> bool:
        """A cause leads it (or a symptom that is its own cause: a target down)."""
        return self.lead.leads_as_cause

    @property
    def headline(self) -> float | None:
        """The lead's first measured value: the number the header is about."""
        top = self.lead.evidence[0] if self.lead.evidence else None
        return top.value if top is not None else None


class IncidentPayload(_Payload):
    """new, update, repeat, severity_changed, cause_changed, resolved, reopened, verified."""

    view: IncidentView
    #: What changed, for the thread reply (``None``: edit only).
    note: str | None = None
    previous_severity: str | None = None
    #: True when the incident opened in a digest: its message goes in the digest's thread.
    in_digest: bool = False
    #: Merged: the incident its findings joined (its thread is linked from this one's note).
    merged_into: int | None = None
    #: That incident's message, as a link (the receiver's permalink, filled in at delivery).
    joined_url: str | None = None
    #: ``verified``: what the confirm probe measured (``note`` is its line).
    confirmation: Confirmation | None = None


class DigestRow(_Payload):
    service: str
    cause: str
    severity: Severity
    title: str
    headline: str
    runbook_url: str = ""


class DigestPayload(_Payload):
    rows: list[DigestRow]
    incident_ids: list[int]
    opened_at: float


class AlertReportPayload(_Payload):
    diagnosis: Diagnosis
    alert: str = "an alert"
    scope: dict[str, str] = Field(default_factory=dict)


class FindingPayload(_Payload):
    """An entry queued by an older version, about one finding (still delivered as it was)."""

    finding: Finding
    previous_severity: str | None = None
    resolved_at: float | None = None


Payload = IncidentPayload | DigestPayload | AlertReportPayload | FindingPayload


def parse_payload(kind: NotificationKind, raw: dict[str, Any]) -> Payload:
    """The typed payload of a stored entry; :class:`pydantic.ValidationError` when it is not one."""
    if kind is NotificationKind.alert_report:
        return AlertReportPayload.model_validate(raw)
    if kind is NotificationKind.digest:
        return DigestPayload.model_validate(raw)
    if "finding" in raw and "view" not in raw:
        return FindingPayload.model_validate(raw)
    return IncidentPayload.model_validate(raw)


def dump_payload(payload: Payload) -> str:
    """The stored form of a payload (JSON)."""
    return payload.model_dump_json()
