"""The capacity report: every step measured, the capacity found, why it stops there, and what broke.

``CapacityReport.model_dump(mode="json")`` is the ``diagnose capacity --format json`` contract::

    {"target", "slo": {"p99_ms", "error_ratio"},
     "steps": [{"rate", "achieved_rate", "duration_s", "latency_ms": {"p50", "p90", "p99", "max"},
                "error_ratio", "held", "findings": [causes],
                "unsustainable": {"cause": "backlog" | "schedule", ...} | null, ...}],
     "capacity_rps", "limit": "latency" | "errors" | "max_rate" | "aborted",
     "bottleneck": {"kind": "cause" | "load_shedding", "cause", "rule_id", "summary",
                    "recommendation", "runbook_url", "first_seen_at_rate", "evidence"} | null,
     "findings": [as in diagnose now]}

The steps are listed in the order they ran (the search is not monotonic once it narrows the
knee); every renderer reads these same fields, so the table, Markdown and JSON views cannot
disagree.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from diagnoser.models import Evidence, Finding, SourceError

__all__ = [
    "Bottleneck",
    "CapacityReport",
    "CapacityStep",
    "Limit",
    "SloTarget",
    "StepLatency",
    "Unsustainable",
]


class Limit(StrEnum):
    """Why the capacity is what it is."""

    #: The next step's p99 went over the SLO.
    latency = "latency"
    #: The next step's error ratio went over the limit (or the probe's abort rule stopped it).
    errors = "errors"
    #: Every step up to the highest allowed rate held: the capacity is at least that.
    max_rate = "max_rate"
    #: Stopped before an answer (Ctrl-C, or the step budget ran out).
    aborted = "aborted"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SloTarget(_Strict):
    p99_ms: float
    error_ratio: float


class StepLatency(_Strict):
    """Latency from the intended send time (no coordinated omission), in milliseconds."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


class Unsustainable(_Strict):
    """Why a step reached no steady state (:mod:`diagnoser.capacity.sustain`): its p99 measures
    its length, not its rate."""

    #: ``backlog``: the requests in flight grew through the step (the service answered fewer
    #: than it was sent); ``schedule``: the sender fell further and further behind its schedule.
    cause: Literal["backlog", "schedule"]
    #: Requests in flight when the step stopped sending (``backlog``).
    in_flight: int | None = None
    #: How far behind its schedule the sender was at the step's end, in seconds (``schedule``).
    behind_s: float | None = None
    #: How fast it grew: requests per second (``backlog``), seconds per second (``schedule``).
    growth_per_s: float | None = None

    @property
    def text(self) -> str:
        """``unsustainable (backlog 412 in flight, growing)``: what the report shows for its p99."""
        if self.cause == "backlog":
            return f"unsustainable (backlog {self.in_flight} in flight, growing)"
        return f"unsustainable (send schedule behind by {self.behind_s:g} s)"


class CapacityStep(_Strict):
    """One open-loop step at a constant rate, judged against the SLO."""

    rate: float
    achieved_rate: float
    #: Answers per second while the step ran: the offered rate when the service keeps up, about
    #: its capacity when it does not (the search aims its next step with it).
    served_rate: float | None = None
    duration_s: float
    latency_ms: StepLatency = Field(default_factory=StepLatency)
    error_ratio: float
    held: bool
    #: Why a step did not hold; ``None`` when it held or was interrupted. An unsustainable step
    #: fails on ``latency`` (unless it failed on errors): its latency grew without bound.
    failed_on: Literal["latency", "errors"] | None = None
    #: Set when the step reached no steady state: the report shows this instead of its p99.
    unsustainable: Unsustainable | None = None
    #: The step stopped before its planned end because its verdict could no longer change.
    stopped_early: bool = False
    #: False for a step over the latency SLO while the service kept up: it was run again, and
    #: only that second run counts.
    counted: bool = True
    sent: int = 0
    failures: int = 0
    #: Causes and symptoms the rule pack found as of the step's end (empty without Prometheus).
    findings: list[str] = Field(default_factory=list)
    #: Of those, the ones absent at the closest lower-rate step: what this rate added.
    new_findings: list[str] = Field(default_factory=list)
    started_at: datetime
    ended_at: datetime

    @field_serializer("started_at", "ended_at")
    def _rfc3339(self, value: datetime) -> str:
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


class Bottleneck(_Strict):
    """What gave way at the knee.

    ``kind`` ``cause``: the rule pack's cause that appeared between the last step that held and
    the first that failed. ``load_shedding``: no such cause, but the first failing step's errors
    were mostly the server refusing work (HTTP 503 or 429, gRPC ``UNAVAILABLE`` or
    ``RESOURCE_EXHAUSTED``): it sheds load at about the rate it still answered (no rule, no runbook).
    """

    kind: Literal["cause", "load_shedding"] = "cause"
    cause: str
    rule_id: str | None = None
    summary: str
    recommendation: str
    runbook_url: str | None = None
    #: The lowest rate from which the cause was present at every evaluated step up to the knee.
    first_seen_at_rate: float
    evidence: list[Evidence] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)


class CapacityReport(_Strict):
    """Everything ``diagnose capacity`` measured and concluded. Field names are the JSON contract."""

    target: str
    slo: SloTarget
    steps: list[CapacityStep] = Field(default_factory=list)
    #: The highest rate that held the SLO below the first that failed; ``None`` if none held.
    capacity_rps: float | None = None
    limit: Limit
    bottleneck: Bottleneck | None = None
    #: The full findings of the first failing step, most important first.
    findings: list[Finding] = Field(default_factory=list)
    errors: list[SourceError] = Field(default_factory=list)
    #: Plain-language remarks: why no bottleneck is named, a cap that bounded the search...
    notes: list[str] = Field(default_factory=list)
    max_rate: float
    expect_rps: float | None = None
    #: Whether a rule pack was evaluated at each step (a Prometheus was configured).
    evidence_checked: bool = False

    @property
    def first_failing_step(self) -> CapacityStep | None:
        failing = [s for s in self.steps if s.failed_on is not None and s.counted]
        return min(failing, key=lambda s: s.rate) if failing else None

    @property
    def exit_code(self) -> int:
        """0 when the capacity meets ``expect_rps`` (if given) or nothing broke below max rate; else 1."""
        if self.expect_rps is not None:
            return 0 if self.capacity_rps is not None and self.capacity_rps >= self.expect_rps else 1
        return 0 if self.limit is Limit.max_rate else 1
