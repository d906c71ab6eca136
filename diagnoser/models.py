"""The data diagnoser produces: evidence, findings, source errors and the diagnosis.

These models are the output contract (``diagnose now --format json``): field names and the
cause vocabulary are stable, sinks (console, Markdown, Slack) render them as pure functions.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

__all__ = [
    "CAUSES",
    "SYMPTOMS",
    "Coverage",
    "CoverageStatus",
    "Diagnosis",
    "Evidence",
    "Finding",
    "FindingKind",
    "RuleCoverage",
    "Severity",
    "SilencedFinding",
    "SourceCoverage",
    "SourceError",
]

#: Stable cause vocabulary: JSON output, Slack, tests and users' automation rely on it.
CAUSES: frozenset[str] = frozenset(
    {
        "connection_pool_exhaustion",
        "dependency_cross_zone",
        "dependency_slow",
        "metrics_server_missing",
        "hpa_scale_limited",
        "queue_backlog",
        "slow_pod_startup",
        "node_cpu_saturation",
        "cpu_throttling",
        "memory_leak",
        "oom_killed",
        "empty_success_response",
        "truncated_response",
        "load_shedding",
        "deadline_exceeded",
        "es_thread_pool_rejection",
        "es_heap_pressure",
        "es_expensive_query",
        "es_hot_threads",
        "es_shard_sizing",
        "tcp_connection_churn",
        "tls_handshake_overhead",
        "config_mount_failure",
        "duplicate_scrape",
        "source_unavailable",
        "crash_loop",
        "image_pull_failure",
        "pvc_pending",
        "es_fielddata_text",
        "no_data",
        # A server or proxy at its configured connection maximum (connection_pool_exhaustion is
        # a client's own pool).
        "connection_limit_reached",
    }
)

#: Symptoms: what users feel. Causes are ranked by whether they explain an active symptom.
SYMPTOMS: frozenset[str] = frozenset({"latency_slo_breach", "error_rate_breach", "target_unreachable"})


class Severity(StrEnum):
    """How urgent a finding is. Ordered: critical > warning > info."""

    critical = "critical"
    warning = "warning"
    info = "info"

    @property
    def rank(self) -> int:
        return {"critical": 2, "warning": 1, "info": 0}[self.value]


FindingKind = Literal["cause", "symptom"]


def _finite_or_none(value: float | None) -> float | None:
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return value


class Evidence(BaseModel):
    """One measured fact behind a finding: what was asked, of which source, and the answer."""

    model_config = ConfigDict(extra="forbid")

    source: str
    query: str
    labels: dict[str, str] = Field(default_factory=dict)
    value: float | None = None
    threshold: float | None = None
    detail: str | None = None
    #: For a signal, the naming convention whose series answered (``go-redis-redisotel``).
    convention: str | None = None
    #: What a reader must know about this measurement (``use time includes the wait``).
    caveat: str | None = None
    #: The rule condition's name (``pending``, ``max``), or ``value`` for its first condition.
    name: str | None = None

    @property
    def annotation(self) -> str:
        """Detail, convention and caveat in one line for renderers ("" when there are none)."""
        parts = [self.detail or "", f"via {self.convention}" if self.convention else "", self.caveat or ""]
        return "; ".join(part for part in parts if part)

    @field_serializer("value", "threshold")
    def _json_safe(self, value: float | None) -> float | None:
        # JSON has no NaN/Inf; a non-finite measurement is reported as null.
        return _finite_or_none(value)


class Finding(BaseModel):
    """A named cause or symptom, with the evidence for it and what to do next."""

    model_config = ConfigDict(extra="forbid")

    rule_id: str
    cause: str
    kind: FindingKind
    severity: Severity
    title: str
    summary: str
    evidence: list[Evidence] = Field(default_factory=list)
    recommendation: str = ""
    runbook_url: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    explains: list[str] = Field(default_factory=list, exclude=True)

    @property
    def is_actionable(self) -> bool:
        """True for warning and critical findings: the ones that set exit code 1."""
        return self.severity.rank >= Severity.warning.rank


class SourceError(BaseModel):
    """A source that could not answer: down, slow, unauthorized, or returning garbage."""

    model_config = ConfigDict(extra="forbid")

    source: str
    message: str
    rule_id: str | None = Field(default=None, exclude=True)
    #: ``endpoint``: the source itself is unusable this run (down, stuck, not the API it should be);
    #: ``deadline``: the diagnosis deadline cut a rule short. Not in the JSON contract: it only
    #: lets an endpoint failure absorb the deadline entries it caused (one cause, one entry).
    scope: Literal["query", "endpoint", "deadline"] = Field(default="query", exclude=True)

    @field_validator("message")
    @classmethod
    def _no_credentials(cls, value: str) -> str:
        # A client library's error may quote the URL it was given, password and all; every
        # report, log line and Slack message about a failing source starts from this text.
        from diagnoser.redact import scrub_text

        return scrub_text(value)

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


#: What happened to one rule (or one source) in a run.
CoverageStatus = Literal["evaluated", "no_data", "skipped", "error", "silenced"]


class RuleCoverage(BaseModel):
    """One rule's part in a run: evaluated, without data (naming the metrics), skipped, error, silenced."""

    model_config = ConfigDict(extra="forbid")

    rule_id: str
    source: str
    status: CoverageStatus
    #: Why it was skipped, the error, or the silence's comment.
    reason: str | None = None
    #: For ``no_data``: the metrics the rule needs, none of which exist at the instant.
    missing_metrics: list[str] = Field(default_factory=list)


class SourceCoverage(BaseModel):
    """One source's part in a run, with how many of its rules ended in each status."""

    model_config = ConfigDict(extra="forbid")

    source: str
    status: Literal["evaluated", "no_data", "skipped", "error"]
    rules: dict[str, int] = Field(default_factory=dict)
    reason: str | None = None


class SilencedFinding(BaseModel):
    """A finding a configured silence kept out of the report: listed, so never lost."""

    model_config = ConfigDict(extra="forbid")

    rule_id: str
    cause: str
    severity: Severity
    summary: str
    labels: dict[str, str] = Field(default_factory=dict)
    comment: str
    until: datetime

    @field_serializer("until")
    def _rfc3339(self, value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Coverage(BaseModel):
    """What a run looked at: the answer to "is no finding good news, or no data?"."""

    model_config = ConfigDict(extra="forbid")

    #: Rules by status, e.g. ``{"evaluated": 22, "no_data": 9, "skipped": 4}``.
    counts: dict[str, int] = Field(default_factory=dict)
    summary: str = ""
    sources: list[SourceCoverage] = Field(default_factory=list)
    rules: list[RuleCoverage] = Field(default_factory=list)
    #: False when the metric names could not be read: ``no_data`` was not assessed.
    metrics_checked: bool = False
    #: Findings that configured silences kept out of ``findings``, with each silence's comment.
    silenced: list[SilencedFinding] = Field(default_factory=list)
    #: Findings left out by the command's filters (--severity, --cause, --rule, --namespace).
    filtered_out: int = 0


class Diagnosis(BaseModel):
    """Everything one evaluation produced, findings ordered most important first."""

    model_config = ConfigDict(extra="forbid")

    evaluated_at: datetime
    findings: list[Finding] = Field(default_factory=list)
    errors: list[SourceError] = Field(default_factory=list)
    probe: dict[str, Any] | None = None
    coverage: Coverage | None = None

    @field_serializer("evaluated_at")
    def _rfc3339(self, value: datetime) -> str:
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def exit_code(self) -> int:
        """0 when nothing at warning or above, 1 when something is."""
        return 1 if any(f.is_actionable for f in self.findings) else 0
