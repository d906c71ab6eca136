"""``diagnose rules export --recording``: a pack's recorded conditions as a Prometheus rule group.

Every signal condition (or ``any_of`` alternative) that names a ``record:`` is resolved with the
pack's defaults (``${window}``, ``${confirm_window}``, ``${params.*}``, as configured) and expanded
under every convention of the catalogue; each expansion becomes one recording rule::

    - record: diag:namespace_service_pool:pool_utilisation:ratio
      expr: max by (...) (quantile_over_time(...)) / max by (...) (max_over_time(...) > 0)
      labels: {diag_convention: "1", diag_query: 3f2a...}
    - record: diag:recorded:present
      expr: vector(1)
      labels: {diag_convention: "1", diag_query: 3f2a..., diag_record: diag:...}

The expressions are the rules' own, which aggregate first (``sum by (...)`` of each ``rate``
before a division, ``sum by (le, ...)`` inside ``histogram_quantile``) so that a query-frontend
(Mimir's, Thanos') can shard them. Histograms are read both ways, native or classic, so one
group serves Prometheus 2 and 3 whichever kind the server holds. Families recognised only by
their shape (:mod:`diagnoser.signals.infer`) have no convention in the catalogue: with
``--prometheus-url`` the export recognises them on that server first and records them too, each
under the same ``diag:*`` name as the catalogued conventions of its signal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagnoser.checks.signal import SignalParams, templates_of
from diagnoser.errors import PromqlSyntaxError
from diagnoser.promql import numbers_as_numbers, read_histograms
from diagnoser.ruleset.schema import RuleSet, resolve_condition
from diagnoser.ruleset.templating import MissingVariable, RuleVariables
from diagnoser.signals import Catalogue, expansions
from diagnoser.signals.recorded import CONVENTION, PRESENT, fingerprint
from diagnoser.sources.prometheus import rewrite_metric_names

__all__ = ["GROUP", "Recorded", "recorded_conditions", "recording_group"]

#: The rule group's name.
GROUP = "diagnoser"


@dataclass(frozen=True)
class Recorded:
    """One recording rule: a rule's condition under one convention."""

    rule_id: str
    record: str
    convention: str
    #: The expanded query the engine would send (its fingerprint is ``diag_query``).
    query: str
    #: The expression recorded: ``query`` with metric renames, histograms read either way.
    expr: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.query)


def recorded_conditions(
    ruleset: RuleSet,
    variables: RuleVariables,
    catalogue: Catalogue,
    *,
    signals: Mapping[str, str] | None = None,
    renames: Mapping[str, str] | None = None,
) -> list[Recorded]:
    """Every recorded condition of the pack, once per convention it expands to, in rule order."""
    found: list[Recorded] = []
    seen: set[tuple[str, str]] = set()
    for rule in sorted(ruleset, key=lambda r: r.id):
        namespace = rule.variables(variables, signals=signals)
        for condition in (*rule.when, *rule.evidence):
            if condition.kind.name != "signal":
                continue
            try:
                params = resolve_condition(
                    condition.kind, condition.raw_params, namespace, catalogue=catalogue
                )
            except MissingVariable:
                continue
            assert isinstance(params, SignalParams)
            for alternative in templates_of(params):
                if alternative.record is None:
                    continue
                for expansion in expansions(alternative.query, catalogue):
                    key = (alternative.record, expansion.query)
                    if key in seen:  # two rules reading one query record it once
                        continue
                    seen.add(key)
                    found.append(
                        Recorded(
                            rule_id=rule.id,
                            record=alternative.record,
                            convention=expansion.convention.name,
                            query=expansion.query,
                            expr=_expression(expansion.query, renames or {}),
                        )
                    )
    return found


def _expression(query: str, renames: Mapping[str, str]) -> str:
    renamed = rewrite_metric_names(query, dict(renames))
    try:
        return numbers_as_numbers(read_histograms(renamed, lambda base: "both"))
    except PromqlSyntaxError:  # pragma: no cover - the rule's query parsed when it loaded
        return renamed


def recording_group(recorded: list[Recorded], *, interval: str | None = None) -> dict[str, Any]:
    """The Prometheus rule file (``groups:``) recording ``recorded``, each with its heartbeat."""
    rules: list[dict[str, Any]] = []
    for item in recorded:
        labels = {"diag_convention": CONVENTION, "diag_query": item.fingerprint}
        rules.append({"record": item.record, "expr": item.expr, "labels": labels})
        heartbeat = {**labels, "diag_record": item.record}
        rules.append({"record": PRESENT, "expr": "vector(1)", "labels": heartbeat})
    group: dict[str, Any] = {"name": GROUP}
    if interval:
        group["interval"] = interval
    group["rules"] = rules
    return {"groups": [group]}
