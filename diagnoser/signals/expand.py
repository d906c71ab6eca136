"""Turn a rule's query over signals into PromQL for each convention a Prometheus holds.

A rule writes PromQL with signal references and normalised label names::

    max by (namespace, service, pool) (avg_over_time({{pool.used}}[5m]))
      / max by (namespace, service, pool) (avg_over_time({{pool.max}}[5m]))

For each convention that has every signal referenced (and whose metrics exist), the query is
instantiated: each ``{{signal}}`` (``{{signal:bucket|sum|count}}`` for a histogram's series)
becomes that convention's selector; label names in ``by``, ``without``, ``on``, ``ignoring`` and
``group_*`` clauses become the convention's (``pool`` -> ``db_client_connection_pool_name``,
``service`` -> ``job``); and durations in another unit are scaled to seconds where the value is
read: around the function applied to the range (``rate(x_sum[5m])`` -> ``(rate(x_sum[5m]) *
0.001)``), around an instant selector, or around the ``histogram_quantile`` that reads a
histogram's buckets. Counters that an exporter types as gauges (go-redis's cumulative counts) need
no change: ``rate`` reads any series. The answers are mapped back to normalised labels by
:func:`normalise_labels`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from diagnoser.signals.catalogue import Catalogue, Convention, Form, SignalDef

__all__ = [
    "Expansion",
    "expansions",
    "normalise_labels",
    "references",
    "required_metrics",
    "validate_template",
]

_REF = re.compile(r"\{\{\s*([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)\s*(?::\s*(bucket|sum|count)\s*)?\}\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)(\s*)\(([^()]*)\)")
_RANGE_AFTER = re.compile(r"\s*\[[^\]]*\]")
_IDENT_BEFORE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*$")


@dataclass(frozen=True)
class Expansion:
    """A rule query instantiated for one convention."""

    convention: Convention
    query: str
    #: Caveats of the forms used (``use time includes pool wait``).
    notes: tuple[str, ...] = ()


def references(template: str) -> list[tuple[str, str | None]]:
    """The ``(signal, part)`` pairs a query refers to, in order of appearance."""
    return [(m.group(1), m.group(2)) for m in _REF.finditer(template)]


def validate_template(template: str, catalogue: Catalogue) -> None:
    """Raise ``ValueError`` for an unknown signal or a histogram read without its part."""
    refs = references(template)
    if not refs:
        raise ValueError("the query refers to no signal: write {{pool.used}} (or use a promql condition)")
    for name, part in refs:
        definition = catalogue.signals.get(name)
        if definition is None:
            raise ValueError(f"unknown signal {name!r}; known: {', '.join(sorted(catalogue.signals))}")
        if definition.type == "histogram" and part is None:
            raise ValueError(f"{name} is a histogram: read {{{{{name}:bucket}}}}, :sum or :count")
        if definition.type != "histogram" and part is not None:
            raise ValueError(f"{name} is a {definition.type}: it has no :{part}")


def _series(form: Form, part: str | None) -> str:
    return f"{form.metric}_{part}" if part else form.metric


def required_metrics(template: str, convention: Convention) -> set[str] | None:
    """Metric names the query needs under ``convention``; ``None`` when it lacks a signal."""
    names: set[str] = set(convention.detect)
    for name, part in references(template):
        form = convention.forms.get(name)
        if form is None:
            return None
        names.add(_series(form, part))
    return names


def expansions(
    template: str, catalogue: Catalogue, present: set[str] | None = None
) -> list[Expansion]:
    """The query for each convention that has its signals (and, given ``present``, its metrics)."""
    found = []
    for convention in catalogue.conventions:
        needed = required_metrics(template, convention)
        if needed is None or (present is not None and not needed <= present):
            continue
        found.append(_expand(template, convention, catalogue.signals))
    return found


def _expand(template: str, convention: Convention, signals: Mapping[str, SignalDef]) -> Expansion:
    # Edits on the template: (position, order, length replaced, new text), applied from the end
    # so earlier positions stay valid; at one position a replacement goes before an insertion.
    edits: list[tuple[int, int, int, str]] = []
    notes: list[str] = []
    for match in _REF.finditer(template):
        name, part = match.group(1), match.group(2)
        form = convention.forms[name]
        selector = form.selector(f"_{part}" if part else "")
        edits.append((match.start(), 1, match.end() - match.start(), selector))
        if form.note and form.note not in notes:
            notes.append(form.note)
        if form.scale != 1.0 and part != "count":
            span = _value_span(template, match.start(), match.end(), part)
            edits.append((span[1], 0, 0, f" * {form.scale:g})"))
            edits.append((span[0], 0, 0, "("))
    text = template
    for position, _, length, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:position] + new + text[position + length :]
    text = _GROUPING.sub(lambda m: _rename(m, convention), text)
    return Expansion(convention=convention, query=text, notes=tuple(notes))


def _rename(match: re.Match[str], convention: Convention) -> str:
    labels = [label.strip() for label in match.group(3).split(",") if label.strip()]
    renamed = ", ".join(convention.source_label(label) for label in labels)
    return f"{match.group(1)}{match.group(2)}({renamed})"


def _value_span(template: str, start: int, end: int, part: str | None) -> tuple[int, int]:
    """Where the scaled value is read: the quantile over buckets, the range function, or the selector."""
    if part == "bucket":
        call = _enclosing_call(template, start, name="histogram_quantile")
        if call is None:
            raise ValueError("a histogram's buckets in another unit must be read by histogram_quantile")
        return call
    ranged = _RANGE_AFTER.match(template, end)
    if ranged:
        call = _enclosing_call(template, start)
        if call is not None:
            return call
    return start, end


def _enclosing_call(template: str, position: int, *, name: str | None = None) -> tuple[int, int] | None:
    """Start and end of the innermost function call around ``position`` (or of call ``name``)."""
    depth = 0
    index = position - 1
    while index >= 0:
        char = template[index]
        if char == ")":
            depth += 1
        elif char == "(":
            if depth == 0:
                ident = _IDENT_BEFORE.search(template, 0, index)
                if ident and (name is None or ident.group(0).strip() == name):
                    closing = _matching_paren(template, index)
                    if closing is not None:
                        return ident.start(), closing + 1
                if name is None:
                    return None
            else:
                depth -= 1
        index -= 1
    return None


def _matching_paren(template: str, opening: int) -> int | None:
    depth = 0
    for index in range(opening, len(template)):
        if template[index] == "(":
            depth += 1
        elif template[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    return None


def normalise_labels(labels: Mapping[str, str], convention: Convention) -> dict[str, str]:
    """An answer's labels under their normalised names (``job`` is kept beside ``service``)."""
    out: dict[str, str] = {}
    for key, value in labels.items():
        normalised = convention.normalised_label(key)
        if normalised is not None:
            out[normalised] = value
            if key != "job":
                continue
        out.setdefault(key, value)
    return out


def metric_names_in(queries: Iterable[str]) -> set[str]:
    """Signal names referenced by any of ``queries`` (for reports of what was looked for)."""
    return {name for query in queries for name, _ in references(query)}
