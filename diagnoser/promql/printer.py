"""PromQL from a syntax tree, written the way people write it, with rewrites applied on the way.

``promql-parser``'s own printer is not used: it drops a subquery's default step (``x[5m:]``
becomes the range ``x[5m]``), loses sub-second durations and does not escape quotes in label
values, each of which changes what Prometheus answers. This one writes every node the parser
makes, keeps the parentheses the query had (they are nodes of the tree) and prints
``max by (pool) (x{a="b"}[5m])`` style: a printed query parses back to the same tree.

:class:`Hooks` carries the rewrites of :mod:`diagnoser.promql.rewrite` and
:mod:`diagnoser.promql.histograms`: replacement text for a selector or for any node, new names
for grouping labels (or labels left out of one clause), and nodes whose value is multiplied by a
factor.

Names outside the legacy character set (Prometheus 3's UTF-8 names: ``http.server.duration``,
``service.name``) are printed quoted, the way Prometheus 3 reads them:
``{"http.server.duration_bucket", "http.route"="/x"}``, ``sum by ("http.route") (...)``. A name
is never rejected for its characters: only how it is written depends on them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import promql_parser as pp

from diagnoser.promql.duration import format_duration
from diagnoser.promql.syntax import match_op

__all__ = [
    "Hooks",
    "format_number",
    "is_legacy_label",
    "is_legacy_metric",
    "is_vector",
    "label_name",
    "may_carry_type",
    "quote",
    "render",
    "selector_text",
]

_LEGACY_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def is_legacy_metric(name: str) -> bool:
    """True when ``name`` needs no quotes as a metric name (``[a-zA-Z_:][a-zA-Z0-9_:]*``)."""
    return _LEGACY_METRIC.fullmatch(name) is not None


def is_legacy_label(name: str) -> bool:
    """True when ``name`` needs no quotes as a label name (``[a-zA-Z_][a-zA-Z0-9_]*``)."""
    return _LEGACY_LABEL.fullmatch(name) is not None


def label_name(name: str) -> str:
    """A label name as PromQL writes it: bare when it can be, else quoted (``"http.route"``)."""
    return name if is_legacy_label(name) else quote(name)


@dataclass(frozen=True)
class Hooks:
    """Rewrites applied while printing; the defaults print the tree as it is."""

    #: Text for a selector's metric and matchers (``None``: print it as written).
    selector: Callable[[pp.VectorSelector], str | None] = lambda _: None
    #: The name to print for a label of a ``by``/``without``/``on``/``ignoring``/``group_*`` clause.
    #: A grouping label's name, or names: a normalised label some conventions spell several ways
    #: (``db_system`` as ``db_system_name`` or ``db_system``) groups by each of them.
    label: Callable[[str], str | tuple[str, ...]] = lambda name: name
    #: ``id`` of a node -> factors: the node is printed as ``(<node> * factor)``, once per factor.
    scale: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    #: ``id`` of a node -> the text printed in its place (before any factor of ``scale``).
    text: Mapping[int, str] = field(default_factory=dict)
    #: ``id`` of an aggregation -> labels left out of its ``by`` clause (a native histogram's ``le``).
    drop: Mapping[int, frozenset[str]] = field(default_factory=dict)
    #: Labels added to every ``without`` and ``ignoring`` clause (Prometheus 3's ``__type__``).
    ignored: tuple[str, ...] = ()


_PLAIN = Hooks()


def render(node: pp.Expr, hooks: Hooks = _PLAIN) -> str:
    """``node`` as PromQL text, with ``hooks`` applied."""
    replaced = hooks.text.get(id(node))
    text = replaced if replaced is not None else _render(node, hooks)
    for factor in hooks.scale.get(id(node), ()):
        text = f"({text} * {format_number(factor)})"
    return text


def _render(node: pp.Expr, hooks: Hooks) -> str:
    if isinstance(node, pp.NumberLiteral):
        return format_number(node.val)
    if isinstance(node, pp.StringLiteral):
        return quote(node.val)
    if isinstance(node, pp.VectorSelector):
        return _selector(node, hooks) + _modifiers(node.offset, node.at)
    if isinstance(node, pp.MatrixSelector):
        inner = node.vector_selector
        return f"{_selector(inner, hooks)}[{_duration(node.range)}]" + _modifiers(inner.offset, inner.at)
    if isinstance(node, pp.SubqueryExpr):
        step = _duration(node.step) if node.step is not None else ""
        assert node.range is not None  # a subquery always has its range
        ranged = f"{render(node.expr, hooks)}[{_duration(node.range)}:{step}]"
        return ranged + _modifiers(node.offset, node.at)
    if isinstance(node, pp.Call):
        return f"{node.func.name}({', '.join(render(arg, hooks) for arg in node.args)})"
    if isinstance(node, pp.AggregateExpr):
        return _aggregate(node, hooks)
    if isinstance(node, pp.BinaryExpr):
        both_vectors = (
            bool(hooks.ignored)
            and is_vector(node.lhs)
            and is_vector(node.rhs)
            and (may_carry_type(node.lhs) or may_carry_type(node.rhs))
        )
        operator = f"{node.op}{_matching(node.modifier, hooks, both_vectors)}"
        return f"{render(node.lhs, hooks)} {operator} {render(node.rhs, hooks)}"
    if isinstance(node, pp.UnaryExpr):
        return f"-{render(node.expr, hooks)}"
    if isinstance(node, pp.ParenExpr):
        return f"({render(node.expr, hooks)})"
    raise TypeError(f"cannot print a {type(node).__name__} node")


def _selector(node: pp.VectorSelector, hooks: Hooks) -> str:
    replaced = hooks.selector(node)
    if replaced is not None:
        return replaced
    name = str(node.name or "")
    matchers = [m for m in node.matchers.matchers if not (name and m.name == "__name__")]
    if not name:
        # A UTF-8 name goes first inside the braces, quoted: {"http.server.duration", a="b"}.
        named = next((m for m in matchers if _names_metric(m) and not is_legacy_metric(m.value)), None)
        if named is not None:
            matchers = [m for m in matchers if m is not named]
            inner = [quote(named.value), *(_matcher(m) for m in matchers)]
            if node.matchers.or_matchers:
                raise ValueError("a quoted metric name cannot be combined with 'or' between matchers")
            return "{" + ", ".join(inner) + "}"
    groups = [", ".join(_matcher(m) for m in matchers)] if matchers else []
    groups += [", ".join(_matcher(m) for m in alternative) for alternative in node.matchers.or_matchers]
    if not groups:
        return name
    return f"{name}{{{' or '.join(groups)}}}"


def selector_text(metric: str, matchers: Sequence[tuple[str, str, str]] = ()) -> str:
    """A selector from a metric name and ``(label, op, value)`` matchers, quoted where names need it:
    ``x{a="b"}``, or ``{"http.server.duration", "http.route"="/x"}`` for a UTF-8 name."""
    inner = [f"{label_name(label)}{op}{quote(value)}" for label, op, value in matchers]
    if not is_legacy_metric(metric):
        return "{" + ", ".join([quote(metric), *inner]) + "}"
    return f"{metric}{{{', '.join(inner)}}}" if inner else metric


def _names_metric(matcher: pp.Matcher) -> bool:
    return matcher.name == "__name__" and match_op(matcher) == "="


def _matcher(matcher: pp.Matcher) -> str:
    return f"{label_name(matcher.name)}{match_op(matcher)}{quote(matcher.value)}"


def _modifiers(offset: timedelta | None, at: pp.AtModifier | None) -> str:
    text = ""
    if offset is not None:
        seconds = offset.total_seconds()
        text += f" offset {'-' if seconds < 0 else ''}{format_duration(abs(seconds))}"
    if at is not None:
        if at.type == pp.AtModifierType.Start:
            text += " @ start()"
        elif at.type == pp.AtModifierType.End:
            text += " @ end()"
        elif at.at is not None:
            text += f" @ {format_number(at.at.timestamp())}"
    return text


def _aggregate(node: pp.AggregateExpr, hooks: Hooks) -> str:
    operands = [node.expr] if node.param is None else [node.param, node.expr]
    arguments = ", ".join(render(operand, hooks) for operand in operands)
    modifier = node.modifier
    if modifier is None:
        return f"{node.op}({arguments})"
    clause = "by" if modifier.type == pp.AggModifierType.By else "without"
    dropped = hooks.drop.get(id(node), frozenset()) if clause == "by" else frozenset()
    labels = [label for label in modifier.labels if label not in dropped]
    if clause == "without":
        labels += [label for label in hooks.ignored if label not in labels]
    return f"{node.op} {clause} ({_labels(labels, hooks)}) ({arguments})"


#: Functions whose value is a scalar, not a vector.
_SCALAR_FUNCTIONS = frozenset({"scalar", "time", "pi"})


def is_vector(node: pp.Expr) -> bool:
    """Whether ``node``'s value is an instant vector (vector matching applies between two)."""
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        return is_vector(node.expr)
    if isinstance(node, pp.BinaryExpr):
        return is_vector(node.lhs) or is_vector(node.rhs)
    if isinstance(node, pp.Call):
        return node.func.name not in _SCALAR_FUNCTIONS
    return isinstance(node, pp.VectorSelector | pp.AggregateExpr)


#: Aggregations whose answers are whole input series (all their labels).
_SELECTING_AGGREGATIONS = frozenset({"topk", "bottomk", "limitk", "limit_ratio"})


def may_carry_type(node: pp.Expr) -> bool:
    """Whether ``node``'s answers can carry a series' ``__type__``/``__unit__``: not an
    aggregation ``by`` other labels (nor one of all), whose answers have only those."""
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        return may_carry_type(node.expr)
    if isinstance(node, pp.BinaryExpr):
        return may_carry_type(node.lhs) or may_carry_type(node.rhs)
    if isinstance(node, pp.AggregateExpr) and str(node.op) not in _SELECTING_AGGREGATIONS:
        modifier = node.modifier
        if modifier is None:
            return False
        if modifier.type == pp.AggModifierType.By:
            return any(label in ("__type__", "__unit__") for label in modifier.labels)
    return True


def _matching(modifier: pp.BinModifier | None, hooks: Hooks, both_vectors: bool = False) -> str:
    # Between two vectors with no clause, every label is matched: the ignored ones are added as
    # an ``ignoring`` clause (a gauge divided by a counter must not fail on their __type__).
    if modifier is None or modifier.matching is None:
        bare = " bool" if modifier is not None and modifier.return_bool else ""
        if both_vectors and hooks.ignored and (modifier is None or modifier.group_labels is None):
            return f"{bare} ignoring ({_labels(list(hooks.ignored), hooks)})"
        if modifier is None:
            return ""
    text = " bool" if modifier.return_bool else ""
    if modifier.matching is not None:
        clause = "on" if modifier.matching.type == pp.LabelModifierType.Include else "ignoring"
        labels = list(modifier.matching.labels)
        if clause == "ignoring":
            labels += [label for label in hooks.ignored if label not in labels]
        text += f" {clause} ({_labels(labels, hooks)})"
    if modifier.group_labels is not None:
        side = "group_left" if modifier.card == pp.VectorMatchCardinality.ManyToOne else "group_right"
        text += f" {side} ({_labels(modifier.group_labels, hooks)})"
    return text


def _labels(labels: list[str], hooks: Hooks) -> str:
    names: list[str] = []
    for label in labels:
        renamed = hooks.label(label)
        names.extend(
            name for name in ((renamed,) if isinstance(renamed, str) else renamed) if name not in names
        )
    return ", ".join(label_name(name) for name in names)


def _duration(value: timedelta) -> str:
    return format_duration(value.total_seconds())


def format_number(value: float) -> str:
    """A number as PromQL reads it back exactly: ``3600``, ``0.95``, ``1e-09``, ``Inf``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    return text.removesuffix(".0")


def quote(value: str) -> str:
    """A label value or string argument as a double-quoted PromQL string."""
    return json.dumps(value, ensure_ascii=False)
