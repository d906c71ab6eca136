"""Evaluate every rule concurrently under one deadline and turn what holds into findings.

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
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from diagnoser.checks import CheckContext, CheckResult
from diagnoser.config.parts import FindingStyle
from diagnoser.engine.config import DiagnosisConfig
from diagnoser.engine.onset import Onset, find_onsets
from diagnoser.engine.rank import (
    AgreeingRows,
    agrees,
    collapse_errors,
    rank_findings,
    unavailable_findings,
    without_yielding,
)
from diagnoser.errors import NoDataFound, SourceNotConfigured
from diagnoser.models import Diagnosis, Evidence, Finding, SourceError, service_of
from diagnoser.promql import duration_seconds
from diagnoser.ruleset import Condition, Rule, RuleSet, resolve_condition
from diagnoser.ruleset.expressions import ExpressionError, evaluate_expression
from diagnoser.ruleset.templating import MissingVariable, RuleVariables, format_text
from diagnoser.signals import Catalogue
from diagnoser.sources import Sources
from diagnoser.stable_labels import stable_labels

__all__ = [
    "MAX_FINDINGS_PER_RULE",
    "RuleOutcome",
    "diagnose",
    "evaluate",
    "evaluate_rule",
    "subject_of",
]

log = logging.getLogger(__name__)

#: Findings one rule may produce in one run; more are summarised, not listed.
MAX_FINDINGS_PER_RULE = 50
#: Evidence rows shown per condition of one finding.
MAX_EVIDENCE_PER_CONDITION = 10


@dataclass(frozen=True)
class RuleInputs:
    """What evaluating a rule reads of the configuration, taken once per run."""

    variables: RuleVariables
    style: FindingStyle


@dataclass
class RuleOutcome:
    """What evaluating one rule produced."""

    rule_id: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)
    skipped: str | None = None
    #: Why the rule had no data, when a check said so (:class:`~diagnoser.errors.NoDataFound`).
    no_data: str | None = None
    seconds: float = 0.0


async def diagnose(
    rules: RuleSet | Iterable[Rule],
    config: DiagnosisConfig,
    sources: Sources,
    *,
    at: datetime | None = None,
    errors: Sequence[SourceError] = (),
    record: list[RuleOutcome] | None = None,
) -> Diagnosis:
    """Evaluate ``rules`` against ``sources`` as of ``at`` (default: now) and rank the findings.

    Evaluation and ranking only, for library use: no silences, coverage or no-data finding.
    Every command goes through :func:`~diagnoser.engine.run.run_diagnosis`, which has them.

    ``errors`` are source failures met before evaluation (a source that could not be built, a
    probe that could not run): they are reported with the rules' own, the same way.
    ``record``, when given, receives every rule's :class:`RuleOutcome` (for coverage).
    """
    diagnosis = await evaluate(rules, config, sources, at=at, errors=errors, record=record)
    return diagnosis.model_copy(update={"findings": rank_findings(diagnosis.findings)})


async def evaluate(
    rules: RuleSet | Iterable[Rule],
    config: DiagnosisConfig,
    sources: Sources,
    *,
    at: datetime | None = None,
    errors: Sequence[SourceError] = (),
    record: list[RuleOutcome] | None = None,
    deadline_s: float | None = None,
) -> Diagnosis:
    """:func:`diagnose` without the ranking, for a pipeline that silences first and ranks once.

    The rules are evaluated with ``config``'s variables, catalogue and window; ``deadline_s``
    is what is left of the run's deadline (default: ``config.deadline_s``).
    """
    inputs = RuleInputs(config.variables, config.style)
    ctx = CheckContext(
        at=at or datetime.now(UTC),
        sources=sources,
        catalogue=config.catalogue,
        window=config.window,
    )
    rule_list = list(rules)
    # Every answer of the run is shared by the rules that ask it, however many the run asks.
    with sources.holding_answers():
        tasks = {
            asyncio.create_task(evaluate_rule(rule, inputs, ctx), name=f"rule:{rule.id}"): rule
            for rule in rule_list
        }
        outcomes = await _outcomes(tasks, deadline_s if deadline_s is not None else config.deadline_s)
    if record is not None:
        record.extend(outcomes)
    findings = without_yielding([f for outcome in outcomes for f in outcome.findings], rule_list)
    reported = collapse_errors([*errors, *(e for outcome in outcomes for e in outcome.errors)])
    findings.extend(unavailable_findings(reported, inputs.style))
    return Diagnosis(
        evaluated_at=ctx.at,
        findings=findings,
        errors=reported,
        probe=sources.probe.model_dump(mode="json") if sources.probe is not None else None,
    )


async def _outcomes(tasks: Mapping[asyncio.Task[RuleOutcome], Rule], within_s: float) -> list[RuleOutcome]:
    """Every rule's outcome; a rule still running after ``within_s`` seconds is cancelled and reported."""
    if not tasks:
        return []
    _, pending = await asyncio.wait(tasks, timeout=within_s)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    outcomes: list[RuleOutcome] = []
    for task, rule in tasks.items():
        if task not in pending:
            outcomes.append(task.result())
            continue
        missed = SourceError(
            source=rule.sources[0] if rule.sources else "engine",
            # No rule id in the text: one cause, one entry (rules counted).
            message="no answer before the diagnosis deadline",
            rule_id=rule.id,
            scope="deadline",
        )
        outcomes.append(RuleOutcome(rule.id, errors=[missed]))
    return outcomes


async def evaluate_rule(rule: Rule, inputs: RuleInputs, ctx: CheckContext) -> RuleOutcome:
    """Evaluate one rule as ``ctx`` says (instant, sources, catalogue); never raises (a bug in a
    check becomes an error entry). ``inputs`` resolve the rule's parameters and texts."""
    started = time.perf_counter()
    outcome = RuleOutcome(rule.id)
    try:
        await _evaluate(rule, inputs, ctx, outcome)
    except SourceNotConfigured as exc:
        outcome.skipped = f"source {exc.source} not configured"
    except NoDataFound as exc:
        outcome.no_data = str(exc)
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


async def _evaluate(rule: Rule, inputs: RuleInputs, ctx: CheckContext, outcome: RuleOutcome) -> None:
    params = rule.params_for(inputs.variables)
    variables = rule.variables(inputs.variables)
    conditions = (*rule.when, *rule.evidence)
    for condition in conditions:
        # Fail fast and quietly on unset signals or unconfigured sources, before any query.
        _resolve(condition, variables, ctx.catalogue)
        for name in condition.kind.reads:
            ctx.require(ctx.sources.get(name), name)
    # The first condition names the candidates; the others, and the evidence, are read only for
    # them (a row of another service's job never agrees with one: :func:`narrowed`), and not at
    # all when it names none. At a million series that is most of what a diagnosis reads.
    first = await rule.when[0].kind.run(_resolve(rule.when[0], variables, ctx.catalogue), ctx)
    if isinstance(first, SourceError):
        outcome.errors.append(first.model_copy(update={"rule_id": rule.id}))
    if isinstance(first, SourceError) or not first:
        return
    candidates = _candidates(rule, list(first))
    among = narrowed(ctx, candidates)
    more_when: Sequence[CheckResult] = await asyncio.gather(
        *(c.kind.run(_resolve(c, variables, ctx.catalogue), among) for c in rule.when[1:])
    )
    for result in more_when:
        if isinstance(result, SourceError):
            outcome.errors.append(result.model_copy(update={"rule_id": rule.id}))
    if any(isinstance(r, SourceError) or not r for r in more_when):
        return
    when_rows = [AgreeingRows(rows) for rows in more_when if not isinstance(rows, SourceError)]
    holding = [
        (labels, primary_rows, matched)
        for labels, primary_rows in candidates
        for matched in [[rows.agreeing(primary_rows[0].labels) for rows in when_rows]]
        if all(matched)
    ]
    if not holding:
        return
    # Evidence is only worth its queries once the rule holds: a healthy run stays cheap. Evidence
    # read before the onset waits for the onsets.
    scope = narrowed(ctx, [(labels, primary_rows) for labels, primary_rows, _ in holding])
    evidence_results: Sequence[CheckResult] = await asyncio.gather(
        *(_run_now(c, variables, scope) for c in rule.evidence)
    )
    for result in evidence_results:
        if isinstance(result, SourceError):
            # A missing piece of evidence weakens the finding but does not cancel it.
            outcome.errors.append(result.model_copy(update={"rule_id": rule.id}))
    evidence_rows = [AgreeingRows(r if not isinstance(r, SourceError) else []) for r in evidence_results]
    kept = []
    for labels, primary_rows, matched in holding:
        seen = [rows.agreeing(primary_rows[0].labels) for rows in evidence_rows]
        others = list(zip(conditions[1:], [*matched, *seen], strict=True))
        kept.append(_Candidate(labels, primary_rows, others))
    if rule.onset is not None and kept:
        kept = await _with_onsets(rule, inputs, params, scope, kept, outcome)
    if len(kept) > MAX_FINDINGS_PER_RULE:
        kept.sort(key=_furthest_first)  # the listed ones are the worst, whatever the answers' order
    emitted = 0
    for candidate in kept:
        if emitted == MAX_FINDINGS_PER_RULE:
            outcome.findings[-1].summary += f" (and {len(kept) - emitted} more, not listed)"
            break
        finding = _finding(rule, inputs, params, candidate)
        if finding is None:
            continue
        outcome.findings.append(finding)
        emitted += 1


def _furthest_first(candidate: _Candidate) -> tuple[float, list[tuple[str, str]]]:
    """Candidates by how far their first row is past its threshold, then by their labels."""
    row = candidate.primary_rows[0]
    beyond = 0.0
    if row.value is not None and row.threshold is not None and math.isfinite(row.value - row.threshold):
        beyond = abs(row.value - row.threshold)
    return (-beyond, sorted(candidate.labels.items()))


#: The most services a rule's further conditions and evidence are narrowed to; more are read whole.
MAX_NARROWED_JOBS = 100


def narrowed(
    ctx: CheckContext, candidates: Sequence[tuple[Mapping[str, str], Sequence[Evidence]]]
) -> CheckContext:
    """``ctx`` reading only the series of the candidates' jobs (:attr:`CheckContext.narrowed_to`).

    A row agrees with a candidate when they agree on every label they share (what
    :class:`AgreeingRows` looks up, against each candidate's first row), so a row carrying another
    ``job`` is never used: the queries may leave those series out. Candidates without a ``job``
    (a node's, a namespace's) leave the queries whole."""
    jobs = set()
    for _, rows in candidates:
        job = rows[0].labels.get("job") if rows else None
        if not job:
            return ctx
        jobs.add(job)
    if not jobs or len(jobs) > MAX_NARROWED_JOBS:
        return ctx
    return replace(ctx, narrowed_to=("job", frozenset(jobs)))


async def _run_now(condition: Condition, variables: Mapping[str, Any], ctx: CheckContext) -> CheckResult:
    if condition.at == "before_onset":
        return []
    return await condition.kind.run(_resolve(condition, variables, ctx.catalogue), ctx)


async def _with_onsets(
    rule: Rule,
    inputs: RuleInputs,
    params: Mapping[str, Any],
    ctx: CheckContext,
    candidates: list[_Candidate],
    outcome: RuleOutcome,
) -> list[_Candidate]:
    """The candidates with their onsets (:mod:`diagnoser.engine.onset`), and the evidence read
    just before each onset (``at: before_onset``) in place of the empty rows read at the instant."""
    spec = rule.onset
    assert spec is not None
    variables = rule.variables(inputs.variables)
    signal = rule.onset_condition or rule.when[0]
    resolved_signal = _resolve(signal, variables, ctx.catalogue)

    async def rows_at(instant: datetime) -> list[Evidence] | None:
        try:
            result = await signal.kind.run(resolved_signal, ctx.earlier(instant))
        except NoDataFound:
            return []  # nothing to hold there (before the series began)
        return None if isinstance(result, SourceError) else list(result)

    onsets = await find_onsets(
        rows_at,
        [_holding(rule, inputs, params, candidate) for candidate in candidates],
        ctx.at,
        duration_seconds(spec.lookback),
        duration_seconds(spec.resolution),
    )
    before = [c for c in rule.evidence if c.at == "before_onset"]
    instants = sorted({o.before for o in onsets if o is not None})
    read: dict[tuple[int, datetime], list[Evidence]] = {}
    if before and instants:
        plan = [(index, instant) for index, _ in enumerate(before) for instant in instants]
        resolved = [_resolve(condition, variables, ctx.catalogue) for condition in before]
        results = await asyncio.gather(
            *(before[index].kind.run(resolved[index], ctx.earlier(instant)) for index, instant in plan)
        )
        for key, result in zip(plan, results, strict=True):
            if isinstance(result, SourceError):
                outcome.errors.append(result.model_copy(update={"rule_id": rule.id}))
                continue
            read[key] = result
    timed: list[_Candidate] = []
    for candidate, onset in zip(candidates, onsets, strict=True):
        others = candidate.others
        if onset is not None and before:
            subject = candidate.primary_rows[0].labels
            others = [
                (condition, rows)
                if condition.at != "before_onset"
                else (condition, _agreeing(read.get((before.index(condition), onset.before), []), subject))
                for condition, rows in others
            ]
        timed.append(replace(candidate, others=others, onset=onset))
    return timed


def _holding(
    rule: Rule, inputs: RuleInputs, params: Mapping[str, Any], candidate: _Candidate
) -> Callable[[Sequence[Evidence]], bool]:
    """Whether the onset's signal holds for ``candidate`` in some rows: a row with its labels, and
    above its own threshold (``onset.above``, over the finding's values as known at the instant)."""
    subject = candidate.primary_rows[0].labels
    threshold: float | None = None
    if rule.onset is not None and rule.onset.above is not None:
        values = _template_values(rule, inputs.variables, params, candidate)
        _compute(rule, values)
        try:
            threshold = float(evaluate_expression(rule.onset.above, values))
        except (ExpressionError, TypeError, ValueError):
            return lambda rows: True  # no threshold to tell by: no onset is found (held throughout)

    def holds(rows: Sequence[Evidence]) -> bool:
        return any(agrees(subject, row.labels) and _above(row.value, threshold) for row in rows)

    return holds


def _above(value: float | None, threshold: float | None) -> bool:
    return threshold is None or (value is not None and value > threshold)


def _agreeing(rows: list[Evidence], labels: Mapping[str, str]) -> list[Evidence]:
    return [row for row in rows if agrees(labels, row.labels)]


def subject_of(labels: Mapping[str, str]) -> str:
    """How a report names what a finding is about: ``namespace/service``, or what the labels allow.

    Series scraped outside Kubernetes have no namespace, some have no service or job: the
    summary still reads naturally instead of printing a placeholder.
    """
    service = service_of(labels)
    namespace = labels.get("namespace")
    if service:
        return f"{namespace}/{service}" if namespace else service
    return labels.get("instance") or labels.get("pool") or labels.get("pod") or "an unlabelled series"


def _resolve(condition: Condition, variables: Mapping[str, Any], catalogue: Catalogue) -> Any:
    try:
        return resolve_condition(condition.kind, condition.raw_params, variables, catalogue=catalogue)
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


@dataclass(frozen=True)
class _Candidate:
    """What one finding is about: its labels, the first condition's rows, the others' matching rows."""

    labels: dict[str, str]
    primary_rows: list[Evidence]
    others: list[tuple[Condition, list[Evidence]]]
    onset: Onset | None = None


def _finding(
    rule: Rule, inputs: RuleInputs, params: Mapping[str, Any], candidate: _Candidate
) -> Finding | None:
    """The finding for one candidate; ``None`` when one of the rule's ``require`` does not hold."""
    labels, primary_rows, others = candidate.labels, candidate.primary_rows, candidate.others
    values = _template_values(rule, inputs.variables, params, candidate)
    problems = _compute(rule, values)
    if not _required(rule, values):
        return None
    shown = MAX_EVIDENCE_PER_CONDITION
    evidence = [_named(row, primary_name(rule)) for row in primary_rows[:shown]] + [
        _named(row, condition.label) for condition, rows in others for row in rows[:shown]
    ]
    recommendation = format_text(rule.recommendation, values)
    if problems:
        recommendation = (recommendation + " " if recommendation else "") + "(" + "; ".join(problems) + ")"
    return inputs.style.finding(
        rule_id=rule.id,
        # What the finding is about, never what changes every scrape (an error text, a port).
        labels=stable_labels({**rule.labels, **labels}),
        cause=rule.cause,
        kind=rule.kind,
        severity=rule.severity,
        title=format_text(rule.title, values),
        summary=format_text(rule.summary, values),
        evidence=evidence,
        recommendation=recommendation,
        since=candidate.onset.since if candidate.onset is not None else None,
        explains=list(rule.explains),
    )


def _template_values(
    rule: Rule, variables: RuleVariables, params: Mapping[str, Any], candidate: _Candidate
) -> dict[str, Any]:
    """What a finding's templates and ``compute`` expressions can name."""
    labels, primary_rows, others = candidate.labels, candidate.primary_rows, candidate.others
    primary = max(primary_rows, key=lambda r: r.value if r.value is not None else float("-inf"))
    values: dict[str, Any] = {f"params.{k}": v for k, v in params.items()}
    values.update(variables.template_values())
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
            values.update(_labels_beyond(condition.name, rows, labels))
            if rows and rows[0].detail:
                values[f"{condition.name}_detail"] = rows[0].detail
            if rows and rows[0].setting:
                values[f"{condition.name}_setting"] = rows[0].setting
        notes.extend(r.caveat for r in rows[:1] if r.caveat and r.caveat not in notes)
    if notes:
        values["caveats"] = " Note: " + "; ".join(notes) + "."
    if candidate.onset is not None:
        # In the instant's own zone (UTC for an instant given as one).
        values["since"] = candidate.onset.since.strftime("%H:%M")
        values["baseline_at"] = candidate.onset.before.strftime("%H:%M")
    return values


def _labels_beyond(name: str, rows: Sequence[Evidence], labels: Mapping[str, str]) -> dict[str, str]:
    """``NAME.label`` for each label of a condition's top row that the finding itself lacks.

    An evidence query grouped finer than its rule (by route, say) names where the worst of it is:
    ``{?worst.route on {worst.route}?}``.
    """
    ranked = [r for r in rows if r.value is not None]
    if not ranked:
        return {}
    top = max(ranked, key=lambda r: r.value if r.value is not None else float("-inf"))
    return {f"{name}.{key}": value for key, value in top.labels.items() if key not in labels}


def _compute(rule: Rule, values: dict[str, Any]) -> list[str]:
    """Evaluate the rule's ``compute`` expressions into ``values``; what could not be computed."""
    problems: list[str] = []
    for name, expression in rule.compute.items():
        try:
            values[name] = evaluate_expression(expression, values)
        except ExpressionError as exc:
            values[name] = None
            if not exc.missing:  # a value the library does not export is not a problem to report
                problems.append(f"{name} not computed: {exc}")
    return problems


def _required(rule: Rule, values: Mapping[str, Any]) -> bool:
    """Whether every ``require`` expression holds; one that cannot be evaluated does not."""
    for expression in rule.require:
        try:
            if not evaluate_expression(expression, values):
                return False
        except ExpressionError:
            return False
    return True


#: Thresholds from the SLO name what the first condition measures, and its unit.
_SLO_MEASURES = {"slo.p99_seconds": "p99_seconds", "slo.p99_ms": "p99_ms", "slo.error_ratio": "error_ratio"}
#: A ``${params.min_...}`` threshold of these names compares a share (0..1).
_SHARE_PARAM = re.compile(r"params\.(?:(?:min|max)_\w*(?:ratio|share|utili[sz]ation)|near)")


def primary_name(rule: Rule) -> str:
    """The name of the rows of a rule's first condition: its own name, else what its threshold says
    it measures (``p99_seconds`` against ``${slo.p99_seconds}``, ``error_ratio``), else its cause
    (``connection_limit_reached_ratio`` for a share). Probe rows keep ``value``: their field names
    say what they read. A report never shows a bare number with nothing to say what it is.
    """
    condition = rule.when[0]
    if condition.name:
        return condition.name
    if condition.kind.name == "probe":
        return "value"
    threshold = condition.raw_params.get("threshold") if isinstance(condition.raw_params, Mapping) else None
    placeholder = (
        re.fullmatch(r"\$\{\s*([\w.]+)\s*\}", threshold.strip()) if isinstance(threshold, str) else None
    )
    if placeholder and placeholder.group(1) in _SLO_MEASURES:
        return _SLO_MEASURES[placeholder.group(1)]
    if placeholder and _SHARE_PARAM.fullmatch(placeholder.group(1)):
        return f"{rule.cause}_ratio"
    return rule.cause


def _named(row: Evidence, name: str) -> Evidence:
    return row if row.name else row.model_copy(update={"name": name})
