"""``diagnose rules lint``: what only a careful reader or a live Prometheus finds in rule files.

Schema problems are found when rules load. Lint adds:

- static checks, always: a query the PromQL parser cannot read, a subquery spanning fewer than
  two of its steps (one point on Prometheus 3, whose ranges are left-open), a rule that names a metric of
  the signal catalogue directly (it then misses every other convention: name the signal
  instead), and a title, summary or recommendation field naming a label the rule's series may
  lack (``{namespace}`` on series scraped outside Kubernetes: use ``{subject}``);
- with a Prometheus, every query evaluated once: PromQL that does not parse, functions the server
  lacks, a range query where an instant one is needed. A signal query is checked as instantiated
  for every convention of the catalogue, present or not.
"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from diagnoser.config import PrometheusSettings
from diagnoser.errors import PromqlSyntaxError
from diagnoser.models import SourceError
from diagnoser.promql import format_duration, grouping_labels, metric_names, short_subqueries
from diagnoser.ruleset import Condition, Rule, RuleSet, resolve_condition
from diagnoser.ruleset.templating import (
    MissingVariable,
    RuleVariables,
    optional_clauses,
    resolve_placeholders,
)
from diagnoser.signals import Catalogue, load_catalogue
from diagnoser.signals.expand import DERIVED_LABELS, grouping_labels_of
from diagnoser.sources.prometheus import PrometheusSource

if TYPE_CHECKING:
    from diagnoser.config import Settings

__all__ = ["LintInputs", "lint_queries", "lint_static", "rule_queries"]

#: Values every finding has besides its labels.
_ALWAYS = {
    *("value", "threshold", "detail", "count", "subject", "caveats", "window", "confirm_window"),
    *("slo.p99_ms", "slo.error_ratio"),
}
#: Labels a signal query's answers always carry: the scrape job (as ``service`` and ``job``).
_SIGNAL_LABELS = {"service", "job"}
#: Labels that depend on how a target is scraped: absent outside Kubernetes.
_SCRAPE_DEPENDENT = {"namespace", "pod", "container", "node"}


@dataclass(frozen=True)
class LintInputs:
    """What linting reads of the settings, taken once: the rules' variables, the signals, the
    catalogue, and the Prometheus that :func:`lint_queries` asks (with its metric renames)."""

    variables: RuleVariables
    signals: Mapping[str, str]
    catalogue: Catalogue
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    renames: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> LintInputs:
        # An unset signal still gets a syntactically valid metric name, so its query is checked too.
        signals = {"queue_length": "diagnoser_lint_unset_signal", **settings.signals}
        catalogue = load_catalogue(tuple(settings.signal_files))
        variables = RuleVariables.from_settings(settings)
        return cls(variables, signals, catalogue, settings.prometheus, dict(settings.metrics))

    def variables_of(self, rule: Rule) -> dict[str, object]:
        return rule.variables(self.variables, signals=self.signals)


def lint_static(ruleset: RuleSet, lint: LintInputs) -> list[str]:
    """Problems found without a Prometheus, one line each naming file, rule and field."""
    catalogue_metrics = lint.catalogue.metric_names()
    problems: list[str] = []
    for rule in ruleset:
        for where, query in _raw_queries(rule, lint):
            try:
                named = sorted(metric_names(query) & catalogue_metrics)
            except PromqlSyntaxError as exc:
                problems.append(f"{where}: {exc}")
                continue
            problems.extend(
                f"{where}: a subquery of {format_duration(span)} at {format_duration(step)} steps holds one "
                "point on Prometheus 3 (ranges are left-open): span at least two steps"
                for span, step in short_subqueries(query)
            )
            if named:
                problems.append(
                    f"{where}: names {', '.join(named)} directly: refer to the signal instead "
                    "(signals/*.yaml) so that every naming convention is covered"
                )
        problems.extend(_missing_placeholders(rule, lint))
    return problems


def _raw_queries(rule: Rule, lint: LintInputs) -> list[tuple[str, str]]:
    return [(where, query) for where, query, kind in _queries(rule, lint) if kind != "signal"]


def _first_labels(rule: Rule, lint: LintInputs) -> set[str] | None:
    """Labels the first condition's rows are sure to have; ``None`` when unknown (not PromQL)."""
    first: Condition = rule.when[0]
    if first.kind.name not in ("signal", "promql") or not isinstance(first.raw_params, dict):
        return None
    try:
        params = resolve_placeholders(dict(first.raw_params), lint.variables_of(rule))
    except MissingVariable:
        return None
    query = params.get("query")
    try:
        if first.kind.name == "signal":
            templates = [str(query)] if query else [_template(a) for a in params.get("any_of") or []]
            grouped = {label for t in templates for label in grouping_labels_of(t).get("by", [])}
            return (grouped - _SCRAPE_DEPENDENT) | _SIGNAL_LABELS
        clauses = grouping_labels(query) if isinstance(query, str) else {}
    except ValueError:  # bad PromQL is reported as such, by lint or when the rule loads
        return None
    if "without" not in clauses and clauses.get("by"):
        return set(clauses["by"])
    return None


def _template(alternative: object) -> str:
    """An ``any_of`` entry's query: written as a string or as ``{query: ..., what: ...}``."""
    if isinstance(alternative, dict):
        return str(alternative.get("query", ""))
    return str(alternative)


def _missing_placeholders(rule: Rule, lint: LintInputs) -> list[str]:
    labels = _first_labels(rule, lint)
    if labels is None:
        return []
    named = {c.name for c in (*rule.when, *rule.evidence) if c.name}
    known = _ALWAYS | set(rule.compute) | {f"params.{p}" for p in rule.params} | {"slo.p99_seconds"}
    known |= named | {f"{n}_count" for n in named} | {f"{n}_detail" for n in named}
    known |= {f"{n}_setting" for n in named}
    if rule.onset is not None:
        known |= {"since", "baseline_at"}
    if rule.group_by:
        labels |= set(rule.group_by)
    known |= {derived for label in labels for derived in DERIVED_LABELS.get(label, ())}
    problems = []
    for field_name in ("title", "summary", "recommendation"):
        text = optional_clauses(getattr(rule, field_name))
        for _, name, _, _ in string.Formatter().parse(text):
            if name is None or name in known or name in labels:
                continue
            if name.partition(".")[0] in named:  # a label of a named condition's top row, optional
                continue
            problems.append(
                f"{rule.path}: rule {rule.id}: field {field_name}: {{{name}}} may be missing from the "
                f"series (sure to be there: {', '.join(sorted(labels))}); use {{subject}} or a named value"
            )
    return problems


async def lint_queries(ruleset: RuleSet, lint: LintInputs) -> list[str]:
    """One line per query that the configured Prometheus rejects, naming file, rule and field."""
    source = PrometheusSource(lint.prometheus, metric_overrides=dict(lint.renames))
    try:
        checks = [(where, query) for rule in ruleset for where, query, _ in _queries(rule, lint)]
        now = datetime.now(UTC)
        # One question first: a Prometheus that cannot be reached (or is not one) is one problem,
        # not one per query.
        reachable = await source.query("vector(1)", now, share=False)
        if isinstance(reachable, SourceError):
            return [f"{reachable.message}: {len(checks)} queries not checked"]
        results = await asyncio.gather(*(source.query(query, now) for _, query in checks))
    finally:
        await source.aclose()
    return [
        f"{where}: {result.message}"
        for (where, _), result in zip(checks, results, strict=True)
        if isinstance(result, SourceError)
    ]


def rule_queries(rule: Rule, lint: LintInputs) -> list[tuple[str, str, str]]:
    """``(where, PromQL, kind)`` for every query a rule can send; signals under every convention."""
    return _queries(rule, lint)


def _queries(rule: Rule, lint: LintInputs) -> list[tuple[str, str, str]]:
    variables, catalogue = lint.variables_of(rule), lint.catalogue
    found: list[tuple[str, str, str]] = []
    for section, conditions in (("when", rule.when), ("evidence", rule.evidence)):
        for index, condition in enumerate(conditions):
            try:
                resolved = resolve_condition(
                    condition.kind, condition.raw_params, variables, catalogue=catalogue
                )
            except MissingVariable:
                continue
            kind = condition.kind.name
            where = f"{rule.path}: rule {rule.id}: field {section}[{index}].{kind}.query"
            for alternative, query in condition.kind.queries_of(resolved, catalogue):
                if alternative.startswith("."):  # another field of the condition
                    found.append((where.replace(".query", alternative), query, kind))
                else:
                    found.append((where + alternative, query, kind))
    return found
