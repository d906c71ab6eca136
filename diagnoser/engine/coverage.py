"""Coverage: what a run actually looked at, so that "no findings" can be trusted.

A rule ends a run in one of five states: ``evaluated`` (its sources answered and it had data),
``no_data`` (none of the metrics it needs exist at the instant asked, a wrong ``--at`` or the
wrong Prometheus), ``skipped`` (its source is not configured, or a signal it needs is not
mapped), ``error`` (its source failed or it threw) and ``silenced`` (it found something a
configured silence covers). :func:`build_coverage` derives these from the engine's
:class:`~diagnoser.engine.RuleOutcome` list and the metric names the Prometheus holds at that
instant (one ``/api/v1/label/__name__/values`` call); :func:`no_data_finding` turns a run in which
no rule had any data into a finding of its own, so it can never pass for a healthy one.

The metrics a rule needs come from one place, :func:`metric_names_of`, which reads the metric
names off the syntax tree (:mod:`diagnoser.promql`) of its ``promql`` and ``trend`` conditions'
PromQL (``absent`` conditions look for what should be missing, so they do not count), after
``${...}`` substitution and ``metrics:`` renames::

    inputs = CoverageInputs.of(DiagnosisConfig.from_settings(settings))
    metric_names_of(rule, inputs)   # {"db_client_connection_count", "db_client_connection_max"}
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import get_args

from diagnoser.checks.probe import ProbeParams, judged
from diagnoser.config.parts import FindingStyle
from diagnoser.engine.config import DiagnosisConfig
from diagnoser.engine.evaluate import RuleOutcome
from diagnoser.errors import ExpressionError
from diagnoser.models import (
    Coverage,
    CoverageStatus,
    Evidence,
    Finding,
    RuleCoverage,
    Severity,
    SourceCoverage,
    SourceError,
)
from diagnoser.promql import metric_names
from diagnoser.ruleset import Rule, resolve_condition
from diagnoser.ruleset.templating import MissingVariable, RuleVariables
from diagnoser.signals import Catalogue
from diagnoser.sources import SourceName
from diagnoser.sources.prometheus import rewrite_metric_names

__all__ = [
    "LOOKBACK_S",
    "SOURCES",
    "build_coverage",
    "mark_silenced",
    "metric_names_in",
    "metric_names_of",
    "no_data_finding",
    "probe_shortfall",
    "summary_line",
]

#: Every source a rule can read, in the order reports list them.
SOURCES: tuple[SourceName, ...] = get_args(SourceName)
#: How far before the instant a metric counts as present (a scrape interval or a rule's window).
LOOKBACK_S = 300.0
#: The statuses a rule can end a run in, in the order counts list them.
_STATUSES: tuple[CoverageStatus, ...] = ("evaluated", "no_data", "skipped", "error", "silenced")


def metric_names_in(query: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords and label names excluded).

    Raises :class:`ExpressionError` when the query does not parse.
    """
    return set(metric_names(query))


@dataclass(frozen=True)
class CoverageInputs:
    """What coverage reads of the configuration, taken once per run: the rules' variables, the
    signal catalogue and the metric renames."""

    variables: RuleVariables
    catalogue: Catalogue
    renames: dict[str, str]

    @classmethod
    def of(cls, config: DiagnosisConfig) -> CoverageInputs:
        return cls(config.variables, config.catalogue, dict(config.sources.metrics))


def metric_names_of(rule: Rule, inputs: CoverageInputs) -> set[str]:
    """The metrics ``rule`` needs, as named in this installation; empty for non-PromQL rules.

    A condition whose ``${signals.X}`` is not configured contributes nothing (the rule is
    skipped for that reason, not for missing data).
    """
    variables = rule.variables(inputs.variables)
    catalogue = inputs.catalogue
    names: set[str] = set()
    for condition in (*rule.when, *rule.evidence):
        if not condition.kind.needs_data or (condition.kind.name == "signal" and condition not in rule.when):
            # An ``absent`` condition holds without data; a signal's evidence does not decide
            # whether its rule can hold.
            continue
        try:
            params = resolve_condition(condition.kind, condition.raw_params, variables, catalogue=catalogue)
        except (MissingVariable, ValueError):
            continue
        for _, query in condition.kind.queries_of(params, catalogue):
            try:
                names |= metric_names_in(rewrite_metric_names(query, inputs.renames))
            except ExpressionError:
                # Prometheus judges the query when it is sent (and ``rules lint`` names it); a
                # query the parser cannot read only goes uncounted here.
                continue
    return names


def probe_shortfall(
    rule: Rule, inputs: CoverageInputs, finished: int | None, *, aborted_on_errors: bool = False
) -> str | None:
    """Why ``rule``'s probe conditions had nothing to judge, or ``None`` when they had enough.

    A ``probe`` condition does not hold below its ``min_requests``: with a run that small, a
    silent rule is no data, not good news. A run the probe stopped on its error ratio is judged
    whatever its size (:func:`~diagnoser.checks.probe.judged`): its silent rules were evaluated.
    """
    if finished is None:
        return None
    variables, catalogue = rule.variables(inputs.variables), inputs.catalogue
    for condition in rule.when:
        try:
            params = resolve_condition(condition.kind, condition.raw_params, variables, catalogue=catalogue)
        except (MissingVariable, ValueError):
            continue
        if isinstance(params, ProbeParams) and not judged(
            params, finished, aborted_on_errors=aborted_on_errors
        ):
            return f"the probe finished only {finished} requests (below the rules' min_requests)"
    return None


def build_coverage(
    rules: Iterable[Rule],
    outcomes: Sequence[RuleOutcome],
    inputs: CoverageInputs,
    *,
    configured: Iterable[str],
    present_metrics: set[str] | SourceError | None,
    source_errors: Iterable[SourceError] = (),
    probe_finished: int | None = None,
    probe_aborted_on_errors: bool = False,
) -> Coverage:
    """Each rule's and each source's status in one run, before silences (:func:`mark_silenced`).

    ``present_metrics`` is what the Prometheus holds at the instant (``None``: not asked, or no
    answer in time; then ``no_data`` is not assessed).
    """
    by_id = {rule.id: rule for rule in rules}
    names = present_metrics if isinstance(present_metrics, set) else None
    entries: list[RuleCoverage] = []
    for outcome in sorted(outcomes, key=lambda o: o.rule_id):
        rule = by_id.get(outcome.rule_id)
        source = rule.sources[0] if rule is not None and rule.sources else "engine"
        probe = (probe_finished, probe_aborted_on_errors)
        entries.append(_rule_status(outcome, rule, source, inputs, names, probe))
    counts = Counter(entry.status for entry in entries)
    configured_set = set(configured)
    failed = {error.source: error.message for error in source_errors}
    for entry in entries:
        if entry.status == "error" and entry.source not in failed and entry.reason:
            failed[entry.source] = entry.reason
    sources = [
        _source_status(name, entries, configured_set, failed) for name in SOURCES if _mentions(name, entries)
    ]
    ordered = {status: counts[status] for status in _STATUSES if counts[status]}
    coverage = Coverage(counts=ordered, sources=sources, rules=entries, metrics_checked=names is not None)
    coverage.summary = summary_line(coverage)
    return coverage


def mark_silenced(coverage: Coverage, silenced: Mapping[str, str]) -> Coverage:
    """``coverage`` with each rule in ``silenced`` (rule id: the silence's comment), whose every
    finding a silence covered, marked ``silenced``; the counts and each source's tally follow.

    Only a rule with findings can be silenced, and such a rule was ``evaluated``: no source's
    status changes, so a run's coverage is built once and silences are applied once.
    """
    if not silenced:
        return coverage
    rules = [
        entry.model_copy(update={"status": "silenced", "reason": silenced[entry.rule_id]})
        if entry.rule_id in silenced
        else entry
        for entry in coverage.rules
    ]
    counts = Counter(entry.status for entry in rules)
    sources = [
        source.model_copy(update={"rules": _tally(rules, source.source)}) for source in coverage.sources
    ]
    marked = coverage.model_copy(
        update={
            "rules": rules,
            "sources": sources,
            "counts": {status: counts[status] for status in _STATUSES if counts[status]},
        }
    )
    marked.summary = summary_line(marked)
    return marked


def _tally(entries: Sequence[RuleCoverage], source: str) -> dict[str, int]:
    """How many of ``source``'s rules ended in each status."""
    return dict(sorted(Counter(entry.status for entry in entries if entry.source == source).items()))


def _rule_status(
    outcome: RuleOutcome,
    rule: Rule | None,
    source: str,
    inputs: CoverageInputs,
    names: set[str] | None,
    probe: tuple[int | None, bool],
) -> RuleCoverage:
    def entry(status: CoverageStatus, reason: str | None = None, missing: Iterable[str] = ()) -> RuleCoverage:
        return RuleCoverage(
            rule_id=outcome.rule_id,
            source=source,
            status=status,
            reason=reason,
            missing_metrics=sorted(missing),
        )

    if outcome.skipped is not None:
        return entry("skipped", outcome.skipped)
    if outcome.errors and not outcome.findings:
        return entry("error", outcome.errors[0].message)
    if outcome.no_data is not None and not outcome.findings:
        return entry("no_data", outcome.no_data)
    if rule is not None and names is not None and not outcome.findings and "prometheus" in rule.sources:
        needed = metric_names_of(rule, inputs)
        if needed and not needed & names:
            return entry("no_data", None, needed)
    if rule is not None and not outcome.findings and "probe" in rule.sources:
        shortfall = probe_shortfall(rule, inputs, probe[0], aborted_on_errors=probe[1])
        if shortfall is not None:
            return entry("no_data", shortfall)
    return entry("evaluated")


def _mentions(source: str, entries: Sequence[RuleCoverage]) -> bool:
    return any(entry.source == source for entry in entries)


def _source_status(
    source: str, entries: Sequence[RuleCoverage], configured: set[str], failed: Mapping[str, str]
) -> SourceCoverage:
    mine = Counter(entry.status for entry in entries if entry.source == source)
    rules = dict(sorted(mine.items()))
    if source not in configured:
        return SourceCoverage(source=source, status="skipped", rules=rules, reason="not configured")
    if source in failed:
        return SourceCoverage(source=source, status="error", rules=rules, reason=failed[source])
    if mine["no_data"] and not (mine["evaluated"] or mine["silenced"]):
        return SourceCoverage(source=source, status="no_data", rules=rules)
    return SourceCoverage(source=source, status="evaluated", rules=rules)


def summary_line(coverage: Coverage) -> str:
    """One line: "22 rules evaluated, 9 without data: hikaricp_*, grpc_*; 4 skipped: no elasticsearch"."""
    counts = coverage.counts
    evaluated = [r.rule_id for r in coverage.rules if r.status == "evaluated"]
    parts = [f"{_count(len(evaluated), 'rule')} evaluated{_which(evaluated)}"]
    if counts.get("no_data"):
        missing = sorted({m for r in coverage.rules if r.status == "no_data" for m in r.missing_metrics})
        why = sorted({r.reason for r in coverage.rules if r.status == "no_data" and r.reason})
        parts.append(f"{counts['no_data']} without data: {', '.join([*_metric_groups(missing), *why])}")
    elif not coverage.metrics_checked and any(
        s.source == "prometheus" and s.status != "error" for s in coverage.sources
    ):
        parts.append("metric presence not checked")
    text = ", ".join(parts)
    if counts.get("skipped"):
        skips = Counter(_skip_reason(r) for r in coverage.rules if r.status == "skipped")
        text += f"; {counts['skipped']} skipped: " + ", ".join(reason for reason, _ in skips.most_common())
    if counts.get("error"):
        failing = sorted({r.source for r in coverage.rules if r.status == "error"})
        text += f"; {counts['error']} failed: {', '.join(failing)} errors"
    if coverage.silenced:
        text += f"; {_count(len(coverage.silenced), 'finding')} silenced"
    elif counts.get("silenced"):
        text += f"; {counts['silenced']} silenced"
    if coverage.filtered_out:
        text += f"; {_count(coverage.filtered_out, 'finding')} outside the filters"
    return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _which(rule_ids: Sequence[str], limit: int = 8) -> str:
    """The rules themselves when few, else how many per family: ``(http: 3, pools: 2)``."""
    if not rule_ids:
        return ""
    if len(rule_ids) <= limit:
        return f" ({', '.join(rule_ids)})"
    families = Counter(rule_id.split("/", 1)[0] for rule_id in rule_ids)
    return " (" + ", ".join(f"{family}: {n}" for family, n in sorted(families.items())) + ")"


def _skip_reason(entry: RuleCoverage) -> str:
    reason = entry.reason or ""
    match = re.fullmatch(r"source (.+) not configured", reason)
    if match:
        return f"no {match.group(1)}"
    return reason.replace("${", "").replace("}", "") or "skipped"


def _metric_groups(names: Sequence[str], limit: int = 5) -> list[str]:
    """Metric names shortened to their families: ``hikaricp_*`` for every ``hikaricp_`` metric."""
    families: dict[str, list[str]] = {}
    for name in names:
        families.setdefault(name.split("_", 1)[0], []).append(name)
    groups = []
    for members in families.values():
        if len(members) == 1:
            groups.append(members[0])
            continue
        # The longest run of whole ``_``-separated words the family's names share.
        shared: list[str] = []
        for words in zip(*(member.split("_") for member in members), strict=False):
            if len(set(words)) != 1:
                break
            shared.append(words[0])
        groups.append("_".join(shared) + "_*")
    if len(groups) > limit:
        groups = [*groups[:limit], f"{len(groups) - limit} more"]
    return groups


def no_data_finding(coverage: Coverage, at: datetime, style: FindingStyle) -> Finding | None:
    """A ``no_data`` finding when rules went without data and none had any; otherwise ``None``."""
    counts = coverage.counts
    if not counts.get("no_data") or counts.get("evaluated") or counts.get("silenced"):
        return None
    missing = sorted({m for r in coverage.rules if r.status == "no_data" for m in r.missing_metrics})
    when = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    reasons = sorted({r.reason for r in coverage.rules if r.status == "no_data" and r.reason})
    if missing:
        where = style.prometheus_url or "Prometheus"
        source = "prometheus"
        summary = (
            f"none of the {len(missing)} metrics the rules look for exist in {where} at {when} "
            f"(or in the {LOOKBACK_S / 60:g} minutes before): {', '.join(_metric_groups(missing))}"
        )
        evidence = [
            Evidence(
                source="prometheus",
                query=f"/api/v1/label/__name__/values?start=<{when} - {LOOKBACK_S:g}s>&end={when}",
                detail="looked for: " + ", ".join(missing),
            )
        ]
        advice = (
            "Check that --at falls inside the stored data, that this Prometheus is the one scraping "
            "the service, and that metric names match your exporters (rename them under metrics: in "
            "the config)."
        )
    else:  # only the probe was short of data
        source = "probe"
        summary = "; ".join(reasons)
        evidence = [Evidence(source="probe", query="", detail=reason) for reason in reasons]
        advice = "Run the probe longer or at a higher rate (--probe-duration, --probe-rate)."
    return style.finding(
        rule_id="sources/no-data",
        labels={"source": source},
        cause="no_data",
        kind="cause",
        severity=Severity.warning,
        title="No rule had data",
        summary=summary,
        evidence=evidence,
        recommendation="The silence is not good news: nothing was measured. " + advice,
    )
