"""The data diagnoser produces: evidence, findings, source errors and the diagnosis.

These models are the output contract (``diagnose now --format json``): field names and the
cause vocabulary are stable, sinks (console, Markdown, Slack) render them as pure functions.
"""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

__all__ = [
    "CAUSES",
    "SYMPTOMS",
    "Diagnosis",
    "Evidence",
    "Finding",
    "FindingKind",
    "Severity",
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
        "pvc_pending",
        "es_fielddata_text",
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

    @field_validator("message")
    @classmethod
    def _no_credentials(cls, value: str) -> str:
        # A client library's error may quote the URL it was given, password and all; every
        # report, log line and Slack message about a failing source starts from this text.
        from diagnoser.redact import scrub_text

        return scrub_text(value)

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


class Diagnosis(BaseModel):
    """Everything one evaluation produced, findings ordered most important first."""

    model_config = ConfigDict(extra="forbid")

    evaluated_at: datetime
    findings: list[Finding] = Field(default_factory=list)
    errors: list[SourceError] = Field(default_factory=list)
    probe: dict[str, Any] | None = None

    @field_serializer("evaluated_at")
    def _rfc3339(self, value: datetime) -> str:
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def exit_code(self) -> int:
        """0 when nothing at warning or above, 1 when something is."""
        return 1 if any(f.is_actionable for f in self.findings) else 0
