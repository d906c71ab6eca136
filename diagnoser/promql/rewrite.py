"""Rewriting PromQL on its syntax tree: selectors renamed or replaced, grouping labels renamed.

Two uses: the ``metrics:`` overrides of the config (:func:`rename_metrics`: an exporter's name ->
the installed one, a histogram's ``_bucket``/``_count``/``_sum`` following its base name), and
signal expansion, which puts a convention's selector where a rule wrote a signal, renames the
labels of ``by``/``on``/... clauses and scales values in another unit to seconds where they are
read (:func:`rewrite` with a :class:`Replacement` per selector)::

    rename_metrics("sum(rate(h_bucket[5m])) by (le)", {"h": "x"})
    # 'sum by (le) (rate(x_bucket[5m]))'

A rewritten query is printed from the tree (:mod:`diagnoser.promql.printer`), so its layout is
the printer's; a query nothing applies to comes back as written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache

import promql_parser as pp

from diagnoser.errors import ExpressionError
from diagnoser.promql.printer import (
    Hooks,
    is_vector,
    label_name,
    may_carry_type,
    quote,
    render,
    selector_text,
)
from diagnoser.promql.syntax import grouping_labels, match_op, metric_names, parse, selector_name, walk

__all__ = [
    "NUMERIC_LABELS",
    "TYPE_AND_UNIT_LABELS",
    "Replacement",
    "number_spellings",
    "numbers_as_numbers",
    "rename_metrics",
    "rewrite",
    "without_type_and_unit",
]

#: Labels Prometheus 3 adds with its type-and-unit-labels feature: metadata, not identity.
TYPE_AND_UNIT_LABELS = ("__type__", "__unit__")

#: Labels whose values are numbers: a classic bucket's bound and a summary's quantile. Prometheus 3
#: writes them as OpenMetrics floats on scrape (``1`` becomes ``1.0``), 2.x as the client wrote them,
#: the OTLP receiver without a fraction (``1``).
NUMERIC_LABELS = ("le", "quantile")

_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


@dataclass(frozen=True)
class Replacement:
    """What a selector becomes: another metric, matchers added before its own, a factor for its values."""

    metric: str
    #: ``(label, op, value)`` matchers, e.g. ``("state", "=", "used")``.
    matchers: tuple[tuple[str, str, str], ...] = ()
    #: Values are multiplied by this where they are read: around the function applied to the
    #: range (``(rate(x[5m]) * 0.001)``) or around the instant selector itself.
    scale: float = 1.0
    #: The series are a histogram's buckets: the factor goes around ``histogram_quantile``.
    buckets: bool = False


def rewrite(
    query: str,
    replace: Callable[[str], Replacement | None],
    labels: Callable[[str], str | tuple[str, ...]] | None = None,
) -> str:
    """``query`` with each selector of metric ``m`` replaced by ``replace(m)`` (unless ``None``).

    ``labels`` renames the labels of ``by``, ``without``, ``on``, ``ignoring`` and ``group_*``
    clauses. Raises :class:`ExpressionError` when ``query`` does not parse, or when buckets to
    scale are not read by ``histogram_quantile``.
    """
    tree = parse(query)
    chosen: dict[int, tuple[pp.VectorSelector, Replacement]] = {}
    scale: dict[int, tuple[float, ...]] = {}

    def visit(node: pp.Expr, ancestors: tuple[pp.Expr, ...]) -> None:
        if not isinstance(node, pp.VectorSelector):
            return
        name = selector_name(node)
        replacement = replace(name) if name is not None else None
        if replacement is None:
            return
        chosen[id(node)] = (node, replacement)
        if replacement.scale != 1.0:
            target = id(_value_node(node, ancestors, replacement.buckets))
            scale[target] = (*scale.get(target, ()), replacement.scale)

    walk(tree, visit)

    def selector(node: pp.VectorSelector) -> str | None:
        found = chosen.get(id(node))
        return _replaced(found[0], found[1]) if found is not None else None

    return render(tree, Hooks(selector=selector, label=labels or _same, scale=scale))


def _same(label: str) -> str:
    return label


def _replaced(node: pp.VectorSelector, replacement: Replacement) -> str:
    own = [(m.name, match_op(m), m.value) for m in node.matchers.matchers if m.name != "__name__"]
    return selector_text(replacement.metric, [*replacement.matchers, *own])


def _value_node(node: pp.VectorSelector, ancestors: tuple[pp.Expr, ...], buckets: bool) -> pp.Expr:
    """Where a selector's value is read: the quantile over buckets, the range's function, or itself."""
    if buckets:
        for ancestor in reversed(ancestors):
            if isinstance(ancestor, pp.Call) and ancestor.func.name == "histogram_quantile":
                return ancestor
        raise ExpressionError("a histogram's buckets in another unit must be read by histogram_quantile")
    if ancestors and isinstance(ancestors[-1], pp.MatrixSelector):
        if len(ancestors) > 1 and isinstance(ancestors[-2], pp.Call):
            return ancestors[-2]
        return ancestors[-1]
    return node


def rename_metrics(query: str, overrides: Mapping[str, str]) -> str:
    """Rename metrics in ``query`` per ``overrides`` (exporter name -> installed name).

    A histogram or counter's series follow their base name: overriding
    ``http_server_request_duration_seconds`` renames its ``_bucket``, ``_count`` and ``_sum``.
    String literals and label names are left alone; a query with nothing to rename comes back
    unchanged. :class:`ExpressionError` when there are overrides and ``query`` does not parse.
    """
    if not overrides:
        return query
    return _rename(query, tuple(sorted(overrides.items())))


@lru_cache(maxsize=1024)
def _rename(query: str, overrides: tuple[tuple[str, str], ...]) -> str:
    table = dict(overrides)

    def renamed(name: str) -> str | None:
        if name in table:
            return table[name]
        for suffix in _HISTOGRAM_SUFFIXES:
            base = name.removesuffix(suffix)
            if base != name and base in table:
                return table[base] + suffix
        return None

    if all(renamed(name) is None for name in metric_names(query)):
        return query

    def replace(name: str) -> Replacement | None:
        new = renamed(name)
        return Replacement(metric=new) if new is not None else None

    return rewrite(query, replace)


@lru_cache(maxsize=1024)
def without_type_and_unit(query: str) -> str:
    """``query`` with Prometheus 3's ``__type__`` and ``__unit__`` added to each ``without`` and
    ``ignoring`` clause, and as an ``ignoring`` clause between two vectors matched on every label,
    so that a series' type and unit never split an aggregation or a join (``gauge / counter``
    answers nothing on a 3.x with type-and-unit labels otherwise; a no-op where the server has no
    such labels); unchanged when it has none of these."""
    clauses = grouping_labels(query)
    if "without" not in clauses and "ignoring" not in clauses and not _bare_vector_matching(parse(query)):
        return query
    return render(parse(query), Hooks(ignored=TYPE_AND_UNIT_LABELS))


def _bare_vector_matching(tree: pp.Expr) -> bool:
    found: list[bool] = []

    def visit(node: pp.Expr, ancestors: tuple[pp.Expr, ...]) -> None:
        if isinstance(node, pp.BinaryExpr) and (node.modifier is None or node.modifier.matching is None):
            sides = (node.lhs, node.rhs)
            found.append(all(is_vector(n) for n in sides) and any(may_carry_type(n) for n in sides))

    walk(tree, visit)
    return any(found)


def number_spellings(value: str) -> tuple[str, ...]:
    """Every way a server writes the number ``value`` as a label value (``value`` first), or just
    ``value`` when it is not a number: Go's shortest form (client_golang, Prometheus 2.x), the same
    with Prometheus 3's ``.0`` on a whole number, and the fixed-point form OTLP's translation
    writes. ``"1"`` -> ``("1", "1.0")``; ``"1e+06"`` -> ``("1e+06", "1000000", "1000000.0")``."""
    try:
        number = float(value)
    except ValueError:
        return (value,)
    if math.isnan(number):
        return (value,)
    if math.isinf(number):
        return tuple(dict.fromkeys((value, "+Inf" if number > 0 else "-Inf")))
    shortest = _go_shortest(number)
    fixed = format(Decimal(repr(number)).normalize(), "f")
    spellings = [value, shortest, fixed]
    spellings += [f"{text}.0" for text in (shortest, fixed) if not any(c in text for c in "e.")]
    return tuple(dict.fromkeys(spellings))


def _go_shortest(number: float) -> str:
    """``number`` as Go's ``strconv.FormatFloat(number, 'g', -1, 64)`` writes it: the shortest
    digits, in exponent form (``1e+06``, ``1.5e-05``) below 1e-4 and from 1e6."""
    exact = Decimal(repr(abs(number))).normalize()
    sign = "-" if number < 0 else ""
    exponent = exact.adjusted()
    if number == 0 or -4 <= exponent < 6:
        return sign + format(exact, "f")
    digits = "".join(str(d) for d in exact.as_tuple().digits)
    mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'+' if exponent >= 0 else '-'}{abs(exponent):02d}"


def numbers_as_numbers(query: str) -> str:
    """``query`` with each ``le``/``quantile`` matcher on a number matching every spelling of it:
    ``x_bucket{le="1"}`` -> ``x_bucket{le=~"1|1\\.0"}`` (``!=`` -> ``!~``), so that Prometheus 3's
    ``1.0``, 2.x's ``1`` and OTLP's ``1`` are one bound. Unchanged when there is none to widen."""
    if not any(label in query for label in NUMERIC_LABELS):
        return query
    return _numbers_as_numbers(query)


@lru_cache(maxsize=1024)
def _numbers_as_numbers(query: str) -> str:
    tree = parse(query)
    widened: dict[int, str] = {}

    def visit(node: pp.Expr, ancestors: tuple[pp.Expr, ...]) -> None:
        if not isinstance(node, pp.VectorSelector) or node.matchers.or_matchers:
            return
        matchers = [m for m in node.matchers.matchers if not (node.name and m.name == "__name__")]
        texts, changed = [], False
        for matcher in matchers:
            op = match_op(matcher)
            spellings = number_spellings(matcher.value) if matcher.name in NUMERIC_LABELS else ()
            if op in ("=", "!=") and len(spellings) > 1:
                pattern = "|".join(re.escape(spelling) for spelling in spellings)
                texts.append(f"{label_name(matcher.name)}{'=~' if op == '=' else '!~'}{quote(pattern)}")
                changed = True
            else:
                texts.append(f"{label_name(matcher.name)}{op}{quote(matcher.value)}")
        if not changed:
            return
        name = str(node.name or "")
        if not name:  # a UTF-8 name stays first and quoted: {"http.server.duration", le="1"}
            named = next((m for m in matchers if m.name == "__name__" and match_op(m) == "="), None)
            if named is not None:
                name = quote(named.value)
                texts.pop(matchers.index(named))
                widened[id(node)] = "{" + ", ".join([name, *texts]) + "}"
                return
        widened[id(node)] = f"{name}{{{', '.join(texts)}}}"

    walk(tree, visit)
    if not widened:
        return query
    return render(tree, Hooks(selector=lambda node: widened.get(id(node))))
