"""Parsing PromQL into a syntax tree, and what a query's tree says.

``promql-parser`` (a Rust port of Prometheus' own parser) builds the tree. :func:`parse` caches
trees by query text, since every evaluation parses the same queries again; a cached tree is shared,
so nothing here or in :mod:`diagnoser.promql.rewrite` modifies one. A query the parser cannot
read raises :class:`~diagnoser.errors.PromqlSyntaxError` naming the query::

    metric_names('sum by (le) (rate(x_bucket{job="a"}[5m]))')   # {"x_bucket"}
    grouping_labels("max by (pool) (x) / on (pool) y")          # {"by": ["pool"], "on": ["pool"]}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

import promql_parser as pp

from diagnoser.errors import PromqlSyntaxError

__all__ = [
    "Expr",
    "children",
    "grouping_labels",
    "is_selector",
    "match_op",
    "metric_names",
    "parse",
    "parse_selector",
    "reach_seconds",
    "selector_name",
    "short_subqueries",
    "walk",
]

Expr = pp.Expr
#: Matcher operators and how they are written (the parser's enums cannot be dictionary keys).
_MATCH_OPS = (
    (pp.MatchOp.Equal, "="), (pp.MatchOp.NotEqual, "!="), (pp.MatchOp.Re, "=~"), (pp.MatchOp.NotRe, "!~"),
)  # fmt: skip


def match_op(matcher: pp.Matcher) -> str:
    """How ``matcher``'s operator is written: ``=``, ``!=``, ``=~`` or ``!~``."""
    return next(text for op, text in _MATCH_OPS if op == matcher.op)


@lru_cache(maxsize=2048)
def parse(query: str) -> pp.Expr:
    """The syntax tree of ``query``, shared (do not modify it); :class:`PromqlSyntaxError` if unreadable."""
    try:
        return pp.parse(query)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise PromqlSyntaxError(query, str(exc)) from exc


def _one(node: Any) -> list[pp.Expr]:
    return [node.expr]


#: Each node type's sub-expressions, in the order they are written (a lookup by exact type: the
#: parser makes no subclasses, and every evaluation walks every query's tree).
_CHILDREN: dict[type, Callable[[Any], list[pp.Expr]]] = {
    pp.BinaryExpr: lambda node: [node.lhs, node.rhs],
    pp.AggregateExpr: lambda node: [node.expr] if node.param is None else [node.param, node.expr],
    pp.Call: lambda node: list(node.args),
    pp.MatrixSelector: lambda node: [node.vector_selector],
    pp.ParenExpr: _one,
    pp.UnaryExpr: _one,
    pp.SubqueryExpr: _one,
}


def children(node: pp.Expr) -> list[pp.Expr]:
    """The sub-expressions of ``node``, in the order they are written."""
    found = _CHILDREN.get(type(node))
    return found(node) if found is not None else []


def walk(node: pp.Expr, visit: Callable[[pp.Expr, tuple[pp.Expr, ...]], None]) -> None:
    """Call ``visit(node, ancestors)`` on ``node`` and every node below it, parents first."""
    stack: list[tuple[pp.Expr, tuple[pp.Expr, ...]]] = [(node, ())]
    while stack:
        current, ancestors = stack.pop()
        visit(current, ancestors)
        below = (*ancestors, current)
        stack.extend((child, below) for child in reversed(children(current)))


def _selectors(node: pp.Expr) -> Iterator[pp.VectorSelector]:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, pp.VectorSelector):
            yield current
        else:
            stack.extend(children(current))


def selector_name(selector: pp.VectorSelector) -> str | None:
    """The metric a selector reads: its name, or an equality matcher on ``__name__``."""
    if selector.name:
        return str(selector.name)
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__" and matcher.op == pp.MatchOp.Equal:
            return str(matcher.value)
    return None


@lru_cache(maxsize=2048)
def metric_names(query: str) -> frozenset[str]:
    """Metric names ``query`` selects (not functions, keywords, label names or strings)."""
    return frozenset(name for s in _selectors(parse(query)) if (name := selector_name(s)) is not None)


def grouping_labels(query: str) -> dict[str, list[str]]:
    """Label names of every ``by``, ``without``, ``on``, ``ignoring`` and ``group_*`` clause, by clause."""
    found: dict[str, list[str]] = {}

    def visit(node: pp.Expr, _: tuple[pp.Expr, ...]) -> None:
        if isinstance(node, pp.AggregateExpr) and node.modifier is not None:
            clause = "by" if node.modifier.type == pp.AggModifierType.By else "without"
            found.setdefault(clause, []).extend(node.modifier.labels)
        elif isinstance(node, pp.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                clause = "on" if matching.type == pp.LabelModifierType.Include else "ignoring"
                found.setdefault(clause, []).extend(matching.labels)
            if node.modifier.group_labels is not None:
                left = node.modifier.card == pp.VectorMatchCardinality.ManyToOne
                side = "group_left" if left else "group_right"
                found.setdefault(side, []).extend(node.modifier.group_labels)

    walk(parse(query), visit)
    return found


def is_selector(query: str) -> bool:
    """True when ``query`` is one instant selector (``x{a="b"}``), with no offset or ``@``."""
    try:
        node = parse(query)
    except PromqlSyntaxError:
        return False
    return isinstance(node, pp.VectorSelector) and node.offset is None and node.at is None


def parse_selector(text: str) -> tuple[str, list[tuple[str, str, str]]]:
    """A named selector's metric and its matchers as ``(label, op, value)``; ``ValueError`` otherwise."""
    node = parse(text)
    name = selector_name(node) if isinstance(node, pp.VectorSelector) else None
    if not isinstance(node, pp.VectorSelector) or name is None or node.offset or node.at:
        raise ValueError(f"{text!r} is not a metric selector like name or name{{label=\"value\"}}")
    if node.matchers.or_matchers:
        raise ValueError(f"{text!r}: 'or' between matchers is not supported")
    own = [m for m in node.matchers.matchers if not (m.name == "__name__" and match_op(m) == "=")]
    return name, [(m.name, match_op(m), m.value) for m in own]




@lru_cache(maxsize=2048)
def reach_seconds(query: str) -> float:
    """How far before the instant ``query`` reads: its longest range or subquery plus offsets."""
    furthest = 0.0

    def visit(node: pp.Expr, ancestors: tuple[pp.Expr, ...]) -> None:
        nonlocal furthest
        if not isinstance(node, pp.VectorSelector):
            return
        back = _offset_s(node.offset)
        for ancestor in ancestors:
            if isinstance(ancestor, pp.MatrixSelector):
                back += ancestor.range.total_seconds()
            elif isinstance(ancestor, pp.SubqueryExpr):
                ranged = ancestor.range.total_seconds() if ancestor.range else 0.0
                back += ranged + _offset_s(ancestor.offset)
        furthest = max(furthest, back)

    walk(parse(query), visit)
    return furthest


def _offset_s(offset: Any) -> float:
    return max(offset.total_seconds(), 0.0) if offset is not None else 0.0


def short_subqueries(query: str) -> list[tuple[float, float]]:
    """``(range, step)`` in seconds of each subquery that spans fewer than two steps. Prometheus 3
    reads ranges left-open, so ``x[1m:1m]`` holds one point and ``rate``/``deriv`` over it nothing."""
    found: list[tuple[float, float]] = []

    def visit(node: pp.Expr, _: tuple[pp.Expr, ...]) -> None:
        if isinstance(node, pp.SubqueryExpr) and node.step is not None and node.range is not None:
            span, step = node.range.total_seconds(), node.step.total_seconds()
            if step > 0 and span < 2 * step:
                found.append((span, step))

    walk(parse(query), visit)
    return found
