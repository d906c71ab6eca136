"""A query narrowed to some values of one label, where that changes none of the answers it keeps.

Once a rule's first condition names its candidates (the services whose p99 is over the SLO), its
other conditions and its evidence are only read for rows that agree with a candidate, and a row
whose ``job`` is another service's never does. Asked whole, those conditions read every series of
their families (at a million series, most of the time a diagnosis spends); narrowed, they read
the candidates' series alone::

    restrict("sum by (job) (rate(x_sum[5m])) / on (job) sum by (job) (rate(x_count[5m]))", "job", {"cart"})
    # 'sum by (job) (rate(x_sum{job=~"cart|"}[5m])) / on (job) sum by (job) (rate(x_count{job=~"cart|"}[5m]))'

A selector is narrowed only where the label reaches the answers unchanged from it, so every answer
the narrowed query drops would have carried another value of the label, and every answer it keeps
is computed from the same series as before. Through each node the label is followed the way
Prometheus builds its result's labels:

- functions keep their argument's labels, except ``label_replace``/``label_join`` writing the label,
  and ``absent``, ``absent_over_time``, ``scalar``, ``vector`` (which answer from no series' labels);
- an aggregation keeps the label only when it groups by it (``by`` naming it, ``without`` not), so
  each group, ``topk`` and ``quantile`` included, is computed from series of one value;
- between two vectors the label reaches the answer from a side when the match is on it (``on``
  naming it, ``ignoring`` not, or no clause): then both sides, since matched pairs share it.
  Otherwise from the side whose labels the answer keeps: the left of ``and``/``unless``, the many side
  of ``group_left``/``group_right`` (the one side when the group clause copies the label), and
  from neither of a one-to-one arithmetic match or an ``or`` that matches on other labels.

The matcher is ``label=~"a|b|"``: the empty alternative keeps the series without the label, whose
answers agree with every candidate. Values are escaped for RE2.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from functools import lru_cache

import promql_parser as pp

from diagnoser.promql.printer import Hooks, is_vector, label_name, quote, render, selector_text
from diagnoser.promql.syntax import children, match_op, parse, selector_name

__all__ = ["restrict", "restricted_to_one"]

#: Functions whose answer does not carry the labels of their arguments' series.
_NO_LABELS_FROM_ARGUMENTS = frozenset({"absent", "absent_over_time", "scalar", "vector", "time", "pi"})
#: Functions that write the label named by their second argument.
_LABEL_WRITERS = frozenset({"label_replace", "label_join"})
_SET_OPERATORS = frozenset({"and", "or", "unless"})


def restrict(query: str, label: str, values: Collection[str]) -> str:
    """``query`` with ``label=~"<values>|"`` on every selector whose ``label`` reaches its answers
    unchanged; ``query`` itself when none does. Raises :class:`PromqlSyntaxError` if it does not parse."""
    return _restrict(query, label, tuple(sorted(set(values))))


@lru_cache(maxsize=4096)
def _restrict(query: str, label: str, values: tuple[str, ...]) -> str:
    tree = parse(query)
    narrowed: set[int] = set()
    stack: list[pp.Expr] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, pp.VectorSelector):
            narrowed.add(id(node))
            continue
        stack.extend(_carrying(node, label))
    if not narrowed:
        return query
    matcher = _matcher(label, values)

    def selector(node: pp.VectorSelector) -> str | None:
        if id(node) not in narrowed or node.matchers.or_matchers:
            return None  # ``{a="1" or b="2"}``: left as it is (a matcher would bind to one side only)
        name = selector_name(node)
        own = [(m.name, match_op(m), m.value) for m in node.matchers.matchers if not (name and _names(m))]
        if name:
            return selector_text(name, [*own, matcher])
        return "{" + ", ".join(f"{label_name(k)}{op}{quote(v)}" for k, op, v in (*own, matcher)) + "}"

    return render(tree, Hooks(selector=selector))


def _matcher(label: str, values: Collection[str]) -> tuple[str, str, str]:
    return (label, "=~", "|".join([*(re.escape(value) for value in sorted(set(values))), ""]))


def restricted_to_one(query: str, label: str, values: Collection[str], value: str) -> str:
    """``query`` as :func:`restrict` narrowed it to ``values``, narrowed to ``value`` alone instead:
    what a row of ``value`` is read by (evidence shows it, without the other candidates)."""
    label_, op, alternation = _matcher(label, values)
    _, _, own = _matcher(label, [value])
    written = f"{label_name(label_)}{op}{quote(alternation)}"
    return query.replace(written, f"{label_name(label_)}{op}{quote(own)}")


def _names(matcher: pp.Matcher) -> bool:
    return bool(matcher.name == "__name__")


def _carrying(node: pp.Expr, label: str) -> list[pp.Expr]:
    """The sub-expressions of ``node`` whose ``label`` reaches ``node``'s answers unchanged."""
    if isinstance(node, pp.MatrixSelector | pp.SubqueryExpr | pp.ParenExpr | pp.UnaryExpr):
        return children(node)
    if isinstance(node, pp.Call):
        name = node.func.name
        if name in _NO_LABELS_FROM_ARGUMENTS:
            return []
        if name in _LABEL_WRITERS and _written(node) == label:
            return []
        # Only the vector or range arguments: a quantile's phi, a clamp's bound, carry no series.
        return [arg for arg in node.args if not isinstance(arg, pp.NumberLiteral | pp.StringLiteral)]
    if isinstance(node, pp.AggregateExpr):
        modifier = node.modifier
        if modifier is None:
            return []
        grouped = label in modifier.labels
        keeps = grouped if modifier.type == pp.AggModifierType.By else not grouped
        return [node.expr] if keeps else []
    if isinstance(node, pp.BinaryExpr):
        return _binary_carrying(node, label)
    return []


def _written(call: pp.Call) -> str | None:
    args = list(call.args)
    target = args[1] if len(args) > 1 else None
    return target.val if isinstance(target, pp.StringLiteral) else None


def _binary_carrying(node: pp.BinaryExpr, label: str) -> list[pp.Expr]:
    left, right = node.lhs, node.rhs
    if not (is_vector(left) and is_vector(right)):
        # A vector and a scalar: the vector's labels are the answer's.
        return [side for side in (left, right) if is_vector(side)]
    modifier = node.modifier
    matching = modifier.matching if modifier is not None else None
    if matching is None:
        on_label = True  # every label is matched
    elif matching.type == pp.LabelModifierType.Include:
        on_label = label in matching.labels
    else:
        on_label = label not in matching.labels
    if on_label:
        return [left, right]
    operator = str(node.op)
    if operator in _SET_OPERATORS:
        return [left] if operator in ("and", "unless") else []
    card = modifier.card if modifier is not None else None
    copied = modifier is not None and modifier.group_labels is not None and label in modifier.group_labels
    if card == pp.VectorMatchCardinality.ManyToOne:
        return [right] if copied else [left]
    if card == pp.VectorMatchCardinality.OneToMany:
        return [left] if copied else [right]
    return []  # one-to-one on other labels: the answer keeps only those
