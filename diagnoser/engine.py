"""The engine: evaluate every rule concurrently under one deadline, turn holds into findings, rank.

Failures are data here. A rule whose source fails yields an error entry (and one
``source_unavailable`` finding per failing source), a rule that throws yields an error entry, a
rule that misses the deadline is cancelled and reported; the other rules' findings stand.

Within a rule, the first ``when`` condition decides *what* the finding is about: each of its
evidence rows (or each group of rows, with ``group_by``) is a candidate, and the other
conditions must each have a row whose labels agree with the candidate's on every label they
share. That makes ``pool used >= 95 %`` and ``requests waiting > 0`` hold for the same pool,
while a label-less condition (``absent``) holds for all candidates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from diagnoser.checks import CheckContext, CheckResult
from diagnoser.config import Settings
from diagnoser.errors import SourceNotConfigured
from diagnoser.models import Diagnosis, Evidence, Finding, Severity, SourceError
from diagnoser.recommend import ExpressionError, evaluate_expression
from diagnoser.ruleset import Condition, Rule, RuleSet, resolve_condition
from diagnoser.sources import Sources
from diagnoser.templating import MissingVariable, format_text

__all__ = ["RuleOutcome", "attach_source_errors", "diagnose", "evaluate_rule", "rank_findings", "subject_of"]

log = logging.getLogger(__name__)

#: Findings one rule may produce in one run; more are summarised, not listed.
MAX_FINDINGS_PER_RULE = 50
#: Evidence rows shown per condition of one finding.
MAX_EVIDENCE_PER_CONDITION = 10


@dataclass
class RuleOutcome:
    """What evaluating one rule produced."""

    rule_id: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0


async def diagnose(
    rules: RuleSet | Iterable[Rule],
    settings: Settings,
    sources: Sources,
    *,
    at: datetime | None = None,
    probe: Mapping[str, Any] | None = None,
    record: list[RuleOutcome] | None = None,
) -> Diagnosis:
    """Evaluate ``rules`` against ``sources`` as of ``at`` (default: now) and rank the findings.

    ``record``, when given, receives every rule's :class:`RuleOutcome` (for coverage).
    """
    at = at or datetime.now(UTC)
    rule_list = list(rules)
    tasks = {
        asyncio.create_task(evaluate_rule(rule, settings, sources, at), name=f"rule:{rule.id}"): rule
        for rule in rule_list
    }
    outcomes: list[RuleOutcome] = []
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=settings.deadline_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for task, rule in tasks.items():
            if task in pending:
                outcomes.append(
                    RuleOutcome(
                        rule.id,
                        errors=[
                            SourceError(
                                source=rule.sources[0] if rule.sources else "engine",
                                # No rule id in the text: one cause, one entry (rules counted).
                                message="no answer before the diagnosis deadline",
                                rule_id=rule.id,
                            )
                        ],
                    )
                )
            else:
                outcomes.append(task.result())
    if record is not None:
        record.extend(outcomes)
    findings = _without_yielding([f for outcome in outcomes for f in outcome.findings], rule_list)
    errors = _collapse_errors([e for outcome in outcomes for e in outcome.errors])
    findings.extend(_unavailable_findings(errors, settings))
    return Diagnosis(
        evaluated_at=at,
        findings=rank_findings(findings),
        errors=errors,
        probe=dict(probe) if probe is not None else None,
    )


async def evaluate_rule(rule: Rule, settings: Settings, sources: Sources, at: datetime) -> RuleOutcome:
    """Evaluate one rule; never raises (a bug in a check becomes an error entry)."""
    started = time.perf_counter()
    outcome = RuleOutcome(rule.id)
    try:
        await _evaluate(rule, settings, sources, at, outcome)
    except SourceNotConfigured as exc:
        outcome.skipped = f"source {exc.source} not configured"
    except MissingVariable as exc:
        outcome.skipped = str(exc)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # one failing rule never stops the others
        log.exception("rule %s failed", rule.id)
        outcome.errors.append(
            SourceError(
                source="engine",
                message=f"rule {rule.id} failed: {type(exc).__name__}: {exc}",
                rule_id=rule.id,
            )
        )
    outcome.seconds = time.perf_counter() - started
    return outcome


async def _evaluate(
    rule: Rule, settings: Settings, sources: Sources, at: datetime, outcome: RuleOutcome
) -> None:
    params = rule.params_for(settings)
    variables = rule.variables(settings)
    ctx = CheckContext(at=at, settings=settings, sources=sources, variables=variables)
    conditions = (*rule.when, *rule.evidence)
    for condition in conditions:
        # Fail fast and quietly on unset signals or unconfigured sources, before any query.
        _resolve(rule, condition, variables)
        for name in condition.kind.reads:
            ctx.require(sources.get(name), name)
    when_results: Sequence[CheckResult] = await asyncio.gather(
        *(condition.kind.run(_resolve(rule, condition, variables), ctx) for condition in rule.when)
    )
    for result in when_results:
        if isinstance(result, SourceError):
            outcome.errors.append(result.model_copy(update={"rule_id": rule.id}))
    if any(isinstance(r, SourceError) or not r for r in when_results):
        return
    # Evidence is only worth its queries once the rule holds: a healthy run stays cheap.
    evidence_results: Sequence[CheckResult] = await asyncio.gather(
        *(condition.kind.run(_resolve(rule, condition, variables), ctx) for condition in rule.evidence)
    )
    for result in evidence_results:
        if isinstance(result, SourceError):
            # A missing piece of evidence weakens the finding but does not cancel it.
            outcome.errors.append(result.model_copy(update={"rule_id": rule.id}))
    rows_by_condition: list[list[Evidence]] = [
        r if not isinstance(r, SourceError) else [] for r in (*when_results, *evidence_results)
    ]
    candidates = _candidates(rule, rows_by_condition[0])
    emitted = 0
    for labels, primary_rows in candidates:
        matched = _match_conditions(primary_rows[0].labels, rows_by_condition[1:])
        if any(not rows for rows in matched[: len(rule.when) - 1]):
            continue
        if emitted == MAX_FINDINGS_PER_RULE:
            outcome.findings[-1].summary += f" (and {len(candidates) - emitted} more, not listed)"
            break
        outcome.findings.append(
            _finding(
                rule, settings, params, labels, primary_rows, list(zip(conditions[1:], matched, strict=True))
            )
        )
        emitted += 1


def _without_yielding(findings: list[Finding], rules: Sequence[Rule]) -> list[Finding]:
    """Drop a finding whose rule yields to another rule that found the same thing (same labels)."""
    yields = {rule.id: set(rule.yields_to) for rule in rules if rule.yields_to}
    if not yields:
        return findings
    kept = []
    for finding in findings:
        stronger = yields.get(finding.rule_id, set())
        if any(
            other.rule_id in stronger and _agrees(_identity(finding), _identity(other)) for other in findings
        ):
            continue
        kept.append(finding)
    return kept


def _identity(finding: Finding) -> dict[str, str]:
    return {k: v for k, v in finding.labels.items() if k not in ("job",)}


def subject_of(labels: Mapping[str, str]) -> str:
    """How a report names what a finding is about: ``namespace/service``, or what the labels allow.

    Series scraped outside Kubernetes have no namespace, some have no service or job: the
    summary still reads naturally instead of printing a placeholder.
    """
    service = labels.get("service") or labels.get("job")
    namespace = labels.get("namespace")
    if service:
        return f"{namespace}/{service}" if namespace else service
    return labels.get("instance") or labels.get("pool") or labels.get("pod") or "an unlabelled series"


def _resolve(rule: Rule, condition: Condition, variables: Mapping[str, Any]) -> Any:
    try:
        return resolve_condition(condition.kind, condition.raw_params, variables)
    except ValidationError as exc:
        # Config can make valid-at-load parameters invalid (a non-numeric rule_params value).
        raise ValueError(
            f"{condition.label} parameters invalid after substitution: {exc.errors()[0]['msg']}"
        ) from exc


def _candidates(rule: Rule, rows: list[Evidence]) -> list[tuple[dict[str, str], list[Evidence]]]:
    if rule.group_by is None:
        return [(dict(row.labels), [row]) for row in rows]
    groups: dict[tuple[str, ...], list[Evidence]] = {}
    for row in rows:
        groups.setdefault(tuple(row.labels.get(k, "") for k in rule.group_by), []).append(row)
    return [
        ({k: v for k, v in zip(rule.group_by, key, strict=True) if v}, group_rows)
        for key, group_rows in groups.items()
    ]


def _agrees(labels: Mapping[str, str], other: Mapping[str, str]) -> bool:
    return all(other[k] == v for k, v in labels.items() if k in other)


def _match_conditions(
    labels: Mapping[str, str], rows_by_condition: Sequence[list[Evidence]]
) -> list[list[Evidence]]:
    return [[row for row in rows if _agrees(labels, row.labels)] for rows in rows_by_condition]


def _finding(
    rule: Rule,
    settings: Settings,
    params: Mapping[str, Any],
    labels: dict[str, str],
    primary_rows: list[Evidence],
    others: list[tuple[Condition, list[Evidence]]],
) -> Finding:
    primary = max(primary_rows, key=lambda r: r.value if r.value is not None else float("-inf"))
    values: dict[str, Any] = {f"params.{k}": v for k, v in params.items()}
    values.update(
        {
            "slo.p99_ms": settings.slo.p99_ms,
            "slo.error_ratio": settings.slo.error_ratio,
            "window": settings.window,
            "confirm_window": settings.effective_confirm_window,
        }
    )
    values.update(primary.labels)
    values.update(labels)
    values["subject"] = subject_of({**primary.labels, **labels})
    notes = list(dict.fromkeys(r.caveat for r in primary_rows if r.caveat))
    values.update(
        value=primary.value, threshold=primary.threshold, detail=primary.detail, count=len(primary_rows)
    )
    if rule.when[0].name:
        values[rule.when[0].name] = primary.value
    for condition, rows in others:
        if condition.name:
            finite = [r.value for r in rows if r.value is not None]
            values[condition.name] = max(finite) if finite else None
            values[f"{condition.name}_count"] = len(rows)
            if rows and rows[0].detail:
                values[f"{condition.name}_detail"] = rows[0].detail
        notes.extend(r.caveat for r in rows[:1] if r.caveat and r.caveat not in notes)
    if notes:
        values["caveats"] = " Note: " + "; ".join(notes) + "."
    problems: list[str] = []
    for name, expression in rule.compute.items():
        try:
            values[name] = evaluate_expression(expression, values)
        except ExpressionError as exc:
            values[name] = None
            if not exc.missing:  # a value the library does not export is not a problem to report
                problems.append(f"{name} not computed: {exc}")
    shown = MAX_EVIDENCE_PER_CONDITION
    evidence = [_named(row, rule.when[0].name or "value") for row in primary_rows[:shown]] + [
        _named(row, condition.label) for condition, rows in others for row in rows[:shown]
    ]
    recommendation = format_text(rule.recommendation, values)
    if problems:
        recommendation = (recommendation + " " if recommendation else "") + "(" + "; ".join(problems) + ")"
    return Finding(
        rule_id=rule.id,
        cause=rule.cause,
        kind=rule.kind,
        severity=rule.severity,
        title=format_text(rule.title, values),
        summary=format_text(rule.summary, values),
        evidence=evidence,
        recommendation=recommendation,
        runbook_url=rule.runbook_url(settings.runbook_base_url),
        labels={**settings.context_labels, **rule.labels, **labels},
        explains=list(rule.explains),
    )


def _named(row: Evidence, name: str) -> Evidence:
    return row if row.name else row.model_copy(update={"name": name})


def _collapse_errors(errors: list[SourceError]) -> list[SourceError]:
    """One entry per (source, message), saying how many rules it affected."""
    counts: dict[tuple[str, str], list[str]] = {}
    for error in errors:
        counts.setdefault((error.source, error.message), []).append(error.rule_id or "")
    collapsed = []
    for (source, message), rule_ids in counts.items():
        affected = len({r for r in rule_ids if r})
        suffix = f" ({affected} rules affected)" if affected > 1 else ""
        collapsed.append(SourceError(source=source, message=message + suffix))
    return collapsed


def _unavailable_findings(errors: list[SourceError], settings: Settings) -> list[Finding]:
    by_source: dict[str, list[SourceError]] = {}
    for error in errors:
        if error.source != "engine":
            by_source.setdefault(error.source, []).append(error)
    findings = []
    for source, source_errors in sorted(by_source.items()):
        first = source_errors[0].message
        more = f" (+{len(source_errors) - 1} more errors)" if len(source_errors) > 1 else ""
        findings.append(
            Finding(
                rule_id=f"sources/{source}-unavailable",
                cause="source_unavailable",
                kind="cause",
                severity=Severity.warning,
                title=f"{source} could not be read",
                summary=f"{first}{more}",
                evidence=[Evidence(source=source, query="", detail=e.message) for e in source_errors[:5]],
                recommendation=(
                    f"Rules that need {source} were not evaluated: the diagnosis is incomplete. "
                    f"Check that {source} is reachable from diagnoser and that its credentials are valid."
                ),
                runbook_url=f"{settings.runbook_base_url}sources/source-unavailable.md",
                labels={**settings.context_labels, "source": source},
            )
        )
    return findings


def attach_source_errors(diagnosis: Diagnosis, errors: list[SourceError], settings: Settings) -> Diagnosis:
    """Add errors met outside rule evaluation (a source that could not be built) to ``diagnosis``."""
    new_errors = [e for e in errors if e not in diagnosis.errors]
    known_sources = {f.labels.get("source") for f in diagnosis.findings if f.cause == "source_unavailable"}
    findings = list(diagnosis.findings)
    findings.extend(
        f for f in _unavailable_findings(new_errors, settings) if f.labels.get("source") not in known_sources
    )
    return diagnosis.model_copy(
        update={"errors": [*diagnosis.errors, *new_errors], "findings": rank_findings(findings)}
    )


def rank_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most important first: causes that explain an active symptom, symptoms, other causes; info last.

    Among causes that explain a symptom, one on the same service (namespace and job) as an
    active symptom comes before one elsewhere; then by severity, then by rule id for stability.
    """
    findings = list(findings)
    symptoms = [f for f in findings if f.kind == "symptom" and f.is_actionable]
    active = {f.cause for f in symptoms}
    services = {_service(f) for f in symptoms} - {("", "")}

    def key(finding: Finding) -> tuple[bool, int, int, int, str]:
        if finding.kind == "cause" and active.intersection(finding.explains):
            group = 0
        elif finding.kind == "symptom":
            group = 1
        else:
            group = 2
        same_service = 0 if _service(finding) in services else 1
        return (
            finding.severity == Severity.info,
            group,
            same_service,
            -finding.severity.rank,
            finding.rule_id,
        )

    return sorted(findings, key=key)


def _service(finding: Finding) -> tuple[str, str]:
    labels = finding.labels
    return labels.get("namespace", ""), labels.get("service") or labels.get("job", "")
