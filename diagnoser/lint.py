"""``diagnose rules lint``: every query of every rule evaluated once against a live Prometheus.

Schema problems are found when rules load; this finds what only a server can: PromQL that does
not parse, functions the server lacks, and a range query where an instant one is needed.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from diagnoser.checks.promql import AbsentParams, PromqlParams, TrendParams, limit_query, trend_query
from diagnoser.config import Settings
from diagnoser.models import SourceError
from diagnoser.ruleset import Rule, RuleSet, resolve_condition
from diagnoser.sources.prometheus import PrometheusSource
from diagnoser.templating import MissingVariable

__all__ = ["lint_queries"]


async def lint_queries(ruleset: RuleSet, settings: Settings) -> list[str]:
    """One line per query that the configured Prometheus rejects, naming file, rule and field."""
    source = PrometheusSource(settings.prometheus, metric_overrides=settings.metrics)
    try:
        checks = [check for rule in ruleset for check in _queries(rule, settings)]
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


def _queries(rule: Rule, settings: Settings) -> list[tuple[str, str]]:
    # An unset signal still gets a syntactically valid metric name, so its query is checked too.
    variables = rule.variables(
        settings, signals={"queue_length": "diagnoser_lint_unset_signal", **settings.signals}
    )
    found: list[tuple[str, str]] = []
    for section, conditions in (("when", rule.when), ("evidence", rule.evidence)):
        for index, condition in enumerate(conditions):
            try:
                resolved = resolve_condition(condition.kind, condition.raw_params, variables)
            except MissingVariable:
                continue
            where = f"{rule.path}: rule {rule.id}: field {section}[{index}].{condition.kind.name}.query"
            if isinstance(resolved, PromqlParams | AbsentParams):
                found.append((where, resolved.query))
            elif isinstance(resolved, TrendParams):
                found.append((where, trend_query(resolved)))
                if resolved.limit:
                    found.append((where.replace(".query", ".limit"), limit_query(resolved)))
    return found
