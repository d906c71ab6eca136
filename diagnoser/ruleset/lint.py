"""``diagnose rules lint``: what only a careful reader or a live Prometheus finds in rule files.

Schema problems are found when rules load. Lint adds:

- static checks, always: a rule that names a metric of the signal catalogue directly (it then
  misses every other convention: name the signal instead), and a title, summary or
  recommendation field naming a label the rule's series may lack (``{namespace}`` on series
  scraped outside Kubernetes: use ``{subject}``);
- with a Prometheus, every query evaluated once: PromQL that does not parse, functions the server
  lacks, a range query where an instant one is needed. A signal query is checked as instantiated
  for every convention of the catalogue, present or not.
"""

from __future__ import annotations

import asyncio
import re
import string
from datetime import UTC, datetime

from diagnoser.config import Settings
from diagnoser.models import SourceError
from diagnoser.ruleset import Condition, Rule, RuleSet, resolve_condition
from diagnoser.ruleset.templating import MissingVariable, optional_clauses
from diagnoser.signals import load_catalogue
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["lint_queries", "lint_static"]

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_BY = re.compile(r"\bby\s*\(([^()]*)\)")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
#: Values every finding has besides its labels.
_ALWAYS = {
    *("value", "threshold", "detail", "count", "subject", "caveats", "window", "confirm_window"),
    *("slo.p99_ms", "slo.error_ratio"),
}
#: Labels a signal query's answers always carry: the scrape job (as ``service`` and ``job``).
_SIGNAL_LABELS = {"service", "job"}
#: Labels that depend on how a target is scraped: absent outside Kubernetes.
_SCRAPE_DEPENDENT = {"namespace", "pod", "container", "node"}


def lint_static(ruleset: RuleSet, settings: Settings) -> list[str]:
    """Problems found without a Prometheus, one line each naming file, rule and field."""
    catalogue = load_catalogue(tuple(settings.signal_files))
    catalogue_metrics = catalogue.metric_names()
    problems: list[str] = []
    for rule in ruleset:
        for where, query in _raw_queries(rule, settings):
            named = sorted(_metric_names(query) & catalogue_metrics)
            if named:
                problems.append(
                    f"{where}: names {', '.join(named)} directly: refer to the signal instead "
                    "(signals/*.yaml) so that every naming convention is covered"
                )
        problems.extend(_missing_placeholders(rule))
    return problems


def _metric_names(query: str) -> set[str]:
    without_strings = _STRING.sub('""', query)
    without_grouping = _LABEL_LISTS.sub("", without_strings)
    return set(_NAME.findall(without_grouping))


def _raw_queries(rule: Rule, settings: Settings) -> list[tuple[str, str]]:
    return [(where, query) for where, query, kind in _queries(rule, settings) if kind != "signal"]


def _first_labels(rule: Rule) -> set[str] | None:
    """Labels the first condition's rows are sure to have; ``None`` when unknown (not PromQL)."""
    first: Condition = rule.when[0]
    query = first.raw_params.get("query") if isinstance(first.raw_params, dict) else None
    if first.kind.name == "signal":
        templates = [str(query)] if query else [str(a) for a in first.raw_params.get("any_of") or []]
        grouped = {label for t in templates for group in _BY.findall(t) for label in _split(group)}
        return (grouped - _SCRAPE_DEPENDENT) | _SIGNAL_LABELS
    if first.kind.name == "promql" and isinstance(query, str) and "without" not in query:
        groups = _BY.findall(query)
        if groups:
            return {label for group in groups for label in _split(group)}
    return None


def _split(group: str) -> list[str]:
    return [label.strip() for label in group.split(",") if label.strip()]


def _missing_placeholders(rule: Rule) -> list[str]:
    labels = _first_labels(rule)
    if labels is None:
        return []
    named = {c.name for c in (*rule.when, *rule.evidence) if c.name}
    known = _ALWAYS | set(rule.compute) | {f"params.{p}" for p in rule.params} | {"slo.p99_seconds"}
    known |= named | {f"{n}_count" for n in named} | {f"{n}_detail" for n in named}
    if rule.group_by:
        labels |= set(rule.group_by)
    problems = []
    for field_name in ("title", "summary", "recommendation"):
        text = optional_clauses(getattr(rule, field_name))
        for _, name, _, _ in string.Formatter().parse(text):
            if name is None or name in known or name in labels:
                continue
            problems.append(
                f"{rule.path}: rule {rule.id}: field {field_name}: {{{name}}} may be missing from the "
                f"series (sure to be there: {', '.join(sorted(labels))}); use {{subject}} or a named value"
            )
    return problems


async def lint_queries(ruleset: RuleSet, settings: Settings) -> list[str]:
    """One line per query that the configured Prometheus rejects, naming file, rule and field."""
    source = PrometheusSource(settings.prometheus, metric_overrides=settings.metrics)
    try:
        checks = [(where, query) for rule in ruleset for where, query, _ in _queries(rule, settings)]
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


def _queries(rule: Rule, settings: Settings) -> list[tuple[str, str, str]]:
    """``(where, PromQL, kind)`` for every query a rule can send; signals under every convention."""
    # An unset signal still gets a syntactically valid metric name, so its query is checked too.
    variables = rule.variables(
        settings, signals={"queue_length": "diagnoser_lint_unset_signal", **settings.signals}
    )
    catalogue = load_catalogue(tuple(settings.signal_files))
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
