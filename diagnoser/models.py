"""The data diagnoser produces: evidence, findings, source errors and the diagnosis.

These models are the output contract (``diagnose now --format json``): field names and the
cause vocabulary are stable, sinks (console, Markdown, Slack) render them as pure functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_serializer,
    field_validator,
    model_validator,
)

from diagnoser.numbers import format_measure

__all__ = [
    "CAUSES",
    "SELF_EXPLAINED",
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
    "evidence_unit",
    "finding_identity",
    "format_measure",
    "service_of",
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
        # A server's own workers or threads all busy at its configured maximum (Apache's
        # MaxRequestWorkers, Varnish's thread_pool_max): new requests wait for one.
        "worker_saturation",
    }
)

#: Symptoms: what users feel. Causes are ranked by whether they explain an active symptom.
SYMPTOMS: frozenset[str] = frozenset({"latency_slo_breach", "error_rate_breach", "target_unreachable"})

#: Symptoms that are their own cause, with what they explain: a target that is down needs no
#: other rule to say why its clients fail, so it leads its incident (never "no cause found yet").
SELF_EXPLAINED: Mapping[str, tuple[str, ...]] = {
    "target_unreachable": ("error_rate_breach", "latency_slo_breach", "load_shedding"),
}


class Severity(StrEnum):
    """How urgent a finding is. Ordered: critical > warning > info."""

    critical = "critical"
    warning = "warning"
    info = "info"

    @property
    def rank(self) -> int:
        return {"critical": 2, "warning": 1, "info": 0}[self.value]


FindingKind = Literal["cause", "symptom"]


def service_of(labels: Mapping[str, str]) -> str:
    """The service a set of labels names: ``service``, else ``job``, else ``""``."""
    return labels.get("service") or labels.get("job") or ""


def finding_identity(rule_id: str, cause: str, labels: Mapping[str, str]) -> str:
    """Stable identity of a finding across runs: its rule, cause and identifying labels.

    Measured values, titles, severity and evidence change from run to run; they are not part of
    it. The daemon's state, silences and the outbox all name a finding by this.
    """
    key = json.dumps([rule_id, cause, sorted(labels.items())], separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:24]


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
    #: The setting that configures the measured value, as its library spells it
    #: (``SetMaxOpenConns``), where the catalogue knows it.
    setting: str | None = None
    #: The rule condition's name (``pending``, ``max``), or ``value`` for its first condition.
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _computed_text(cls, data: Any) -> Any:
        # ``text`` is derived (see below): a dumped row read back drops it rather than refusing it.
        if isinstance(data, dict) and "text" in data:
            data = {k: v for k, v in data.items() if k != "text"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def text(self) -> str:
        """The row as one readable line, as the console, Markdown and Slack show it (in the JSON too)."""
        return self.line()

    @property
    def annotation(self) -> str:
        """Detail, convention and caveat in one line for renderers ("" when there are none)."""
        parts = [self.detail or "", f"via {self.convention}" if self.convention else "", self.caveat or ""]
        return "; ".join(part for part in parts if part)

    def short(self, said: str = "") -> str:
        """:meth:`line` without labels nor source (``waiting: 30 requests waiting for a connection
        (threshold 0)``)."""
        return self.line(self.labels, said, source=False, convention=False)

    @property
    def reads(self) -> str:
        """What the row measures, in words (``waiting``, ``hold time``, ``latency p99``; "" when unnamed)."""
        name = self.name or ""
        for suffix, _ in _NAME_UNITS:
            if name.endswith(suffix) and name not in _EVIDENCE_NAMES:
                name = name.removesuffix(suffix)
                break
        return _EVIDENCE_NAMES.get(name, name.replace("_", " ")) or _field_name(self)

    def line(
        self,
        omit: Mapping[str, str] | None = None,
        said: str = "",
        *,
        source: bool = True,
        convention: bool = True,
    ) -> str:
        """One readable line: what it measures, the value with its unit, the threshold, what tells it apart.

        ``waiting: 139.5 requests waiting for a connection (threshold 0) · pool feature-store``;
        labels equal to ``omit``'s (the finding's own), and a detail or caveat ``said`` already
        holds (the finding's summary and the rows shown before this one), are left out.
        """
        unit = evidence_unit(self)
        what = self.reads
        parts: list[str] = []
        if self.value is not None:
            value = format_measure(self.value, unit)
            # A short wordy detail says what the value counts ("requests waiting for a connection");
            # one with numbers of its own is a note, after it.
            detail = self.detail or ""
            wordy = 0 < len(detail) <= 60 and not any(c.isdigit() or c == "\n" for c in detail)
            phrase = self.detail if wordy else ""
            parts.append(f"{value} {phrase}".rstrip())
            if self.threshold is not None:
                parts.append(f"(threshold {format_measure(self.threshold, unit)})")
        elif self.detail:
            parts.append(self.detail)
        text = (f"{what}: " if what else "") + " ".join(parts) if parts else what or self.source
        shown = {k: v for k, v in sorted(self.labels.items()) if (omit or {}).get(k) != v}
        if shown:
            text += " · " + ", ".join(f"{k} {v}" for k, v in shown.items())
        # A caveat the finding already says (its summary, an earlier row: ``said``) is said once.
        caveat = self.caveat if self.caveat and self.caveat not in said else ""
        extra = [f"via {self.convention}" if self.convention and convention else "", caveat]
        if self.value is not None and self.detail and not parts[0].endswith(self.detail):
            extra.insert(0, "" if self.detail in said else self.detail)
        extra = [e for e in extra if e]
        return text + (f" ({'; '.join(extra)})" if extra else "") + (f" [{self.source}]" if source else "")

    @field_serializer("value", "threshold")
    def _json_safe(self, value: float | None) -> float | None:
        # JSON has no NaN/Inf; a non-finite measurement is reported as null.
        return _finite_or_none(value)


#: Readable names of the evidence names rules use most (others: underscores become spaces).
_EVIDENCE_NAMES = {
    "value": "",
    "pending": "waiting",
    "waiting": "waiting",
    "used": "in use",
    "max": "limit",
    "timeouts_per_s": "timeouts",
    "uses_per_s": "uses",
    "hold_s": "hold time",
    "error_ratio": "error ratio",
    "p99_seconds": "p99",
    "p99_ms": "p99",
}
_NAME_UNITS = (
    ("_per_s", "/s"),
    ("_seconds", "s"),
    ("_ms", "ms"),
    ("_s", "s"),
    ("_ratio", "ratio"),
    ("_bytes", "bytes"),
    ("_percent", "%"),
)


def evidence_unit(row: Evidence) -> str:
    """The unit of an evidence row's value, from its name or its metric's (``""`` when unknown)."""
    for suffix, unit in _NAME_UNITS:
        if (row.name or "").endswith(suffix):
            return unit
    shares = row.threshold is not None and 0 < row.threshold <= 1 and 0 <= (row.value or 0) <= 1.5
    ratio = "ratio" if "/" in row.query and shares else ""  # a share against a share: a part over a whole
    if row.source != "prometheus" or not row.query:
        # A probe field (``latency_ms.p99``) or another source's named field; a probe count per
        # finished (or sent) requests is a share of them, whatever its threshold.
        if row.source == "probe" and re.search(r" / (finished|sent|completed)\b", row.query):
            return "ratio"
        fields = [t.split(".")[0] for t in row.query.replace("/", " ").split()]
        found = {unit for f in fields for suffix, unit in _NAME_UNITS if f.endswith(suffix)}
        return found.pop() if len(found) == 1 else ratio
    try:
        from diagnoser.promql.syntax import metric_names

        names = metric_names(row.query)
    except Exception:  # not PromQL (a signal template): no unit known
        return ratio
    bases = [_base_name(name) for name in names]
    units = {unit for base in bases for suffix, unit in _NAME_UNITS if base.endswith(suffix)}
    if "histogram_quantile" in row.query:
        return units.pop() if len(units) == 1 else ""
    if "rate(" in row.query or "increase(" in row.query:
        return "/s" if not units else ""
    return units.pop() if len(units) == 1 else ratio


def _base_name(name: str) -> str:
    """A metric's name without the suffixes of a counter or a histogram's series."""
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        name = name.removesuffix(suffix)
    return name


#: Probe fields whose part alone says what they count (``failures.timeout``: ``timeout``).
_COUNT_FIELDS = ("failures", "status_counts")


def _field_name(row: Evidence) -> str:
    """``latency p99`` for a probe's ``latency_ms.p99``, ``empty body, empty json`` for a sum of
    failure kinds, ``error ratio``: what a row measures when it has no name."""
    if row.source == "prometheus":
        return ""
    # A probe row's query reads ``probe <target>: <field>[ / <per>] <op> <threshold>``.
    _, _, after = row.query.partition(": ")
    field = after.split(" ", 1)[0] if row.source == "probe" else ""
    if not field:
        tokens = row.query.split()
        field = next((t for t in tokens if t.count(".") == 1 and t.replace(".", "_").isidentifier()), "")
    names = []
    for term in field.split("+"):
        base, _, part = term.partition(".")
        if not part:
            names.append(base)
            continue
        for suffix, _unit in _NAME_UNITS:
            base = base.removesuffix(suffix)
        names.append(part if base in _COUNT_FIELDS else f"{base} {part}")
    return ", ".join(name.replace("_", " ").strip() for name in names if name)


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
    #: The onset: when the signal behind the finding left its baseline, as the rule detected it
    #: from the series (``None`` when the rule cannot tell). "Since when" in texts, the baseline
    #: window's end, and the incident's opened time all start here.
    since: datetime | None = None
    explains: list[str] = Field(default_factory=list, exclude=True)

    @property
    def identity(self) -> str:
        """The finding's stable identity (:func:`finding_identity`)."""
        return finding_identity(self.rule_id, self.cause, self.labels)

    @property
    def service(self) -> str:
        """The service it is about: its ``service`` label, else its ``job`` (``""`` when neither).

        The one answer for grouping, routing, scope and the capacity bottleneck alike.
        """
        return service_of(self.labels)

    @property
    def leads_as_cause(self) -> bool:
        """A cause, or a symptom that is its own cause (:data:`SELF_EXPLAINED`)."""
        return self.kind == "cause" or self.cause in SELF_EXPLAINED

    @property
    def explained_causes(self) -> tuple[str, ...]:
        """What it explains: its rule's ``explains``, and a self-explained symptom's own list."""
        return (*self.explains, *SELF_EXPLAINED.get(self.cause, ()))

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
    #: The rules this error affected, in a report's collapsed entries: those it kept from running
    #: (:attr:`Diagnosis.rules_not_run`: never read as "clear") and those it left without a
    #: piece of their evidence.
    rules: list[str] = Field(default_factory=list)

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

    @property
    def identity(self) -> str:
        """The identity of the finding it kept quiet (:func:`finding_identity`)."""
        return finding_identity(self.rule_id, self.cause, self.labels)

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
    def rules_not_run(self) -> dict[str, str]:
        """Each rule that could not run in this diagnosis (its source failed, it threw, the
        deadline cut it short), with the error that stopped it: its silence is no evidence."""
        if self.coverage is not None:
            failed = [r for r in self.coverage.rules if r.status == "error"]
            return {r.rule_id: f"{r.source}: {r.reason or 'error'}" for r in failed}
        return {rule: str(error) for error in self.errors for rule in error.rules}

    @property
    def exit_code(self) -> int:
        """0 when nothing at warning or above, 1 when something is."""
        return 1 if any(f.is_actionable for f in self.findings) else 0
