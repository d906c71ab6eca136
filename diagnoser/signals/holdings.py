"""What a Prometheus holds at an instant, as conventions are matched against it: metric names,
and for the UTF-8 names that spell a catalogued OpenTelemetry metric, their label names.

A catalogued OpenTelemetry convention is written once (``http_server_request_duration_seconds``,
``http_response_status_code``); a Prometheus fed through OTLP or a UTF-8 exposition may hold it as
``http.server.request.duration`` with ``http.response.status_code``. :func:`holdings` reads the
label names of just those families (one ``/api/v1/labels`` call each, none on a Prometheus with
legacy names only), and :func:`resolve` gives the convention as held: each form's metric as the
server spells it, and its labels (grouping labels, matchers, the labels answers are normalised
from) as the series carry them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property

from diagnoser.models import SourceError
from diagnoser.promql import HISTOGRAM_PARTS, held, is_legacy_metric, selector_text
from diagnoser.signals.catalogue import Catalogue, Convention, Form
from diagnoser.signals.otlp import escape_label, escape_metric
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["Holdings", "holdings", "resolve", "resolve_all"]


@dataclass(frozen=True)
class Holdings:
    """Metric names present, and the label names of the UTF-8 families among them."""

    names: frozenset[str]
    labels: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: Escaped name -> the present names that escape to it and are not it (``http.server...``).
    escaped: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: :func:`resolve_all`'s answers, by convention (kept with it, so its id cannot be reused):
    #: every rule's expansions resolve the same conventions against the same holdings.
    _resolved: dict[int, tuple[Convention, list[Convention]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @cached_property
    def utf8_names(self) -> frozenset[str]:
        """The present names that only a UTF-8 name can spell (``http.server.request.duration``)."""
        return frozenset(name for name in self.names if not is_legacy_metric(name))

    @classmethod
    def of(cls, names: Iterable[str], labels: Mapping[str, frozenset[str]] | None = None) -> Holdings:
        """Holdings of ``names``, indexed by escaped name once."""
        index: dict[str, list[str]] = {}
        for name in names:
            if "__" not in name and is_legacy_metric(name):
                continue  # escapes to itself
            escaped = escape_metric(name)
            if escaped != name:
                index.setdefault(escaped, []).append(name)
        return cls(frozenset(names), labels or {}, {k: tuple(sorted(v)) for k, v in index.items()})

    def spelt(self, spellings: frozenset[str]) -> list[str]:
        """Present names whose escaped form is one of ``spellings`` (histogram parts included)."""
        found = {name for s in spellings for name in self.escaped.get(s, ())}
        found.update(s for s in spellings if s in self.names)
        return sorted(found)


async def holdings(
    source: PrometheusSource, catalogue: Catalogue, names: set[str], at: datetime, lookback_s: float
) -> Holdings:
    """The holdings at ``at``: ``names`` and, for UTF-8 spellings of catalogued OpenTelemetry
    metrics, their label names (a family whose labels cannot be read keeps the catalogue's).
    Computed once per instant and shared, like the names."""

    async def ask() -> Holdings:
        plain = Holdings.of(names)
        wanted = catalogue.otel_spellings()
        candidates = sorted(
            name
            for escaped, spelt in plain.escaped.items()
            if escaped in wanted
            for name in spelt
            if not is_legacy_metric(name)
        )
        if not candidates:
            return plain
        answers = await asyncio.gather(
            *(source.label_names(selector_text(name), at, lookback_s) for name in candidates)
        )
        labels = {
            n: frozenset(a)
            for n, a in zip(candidates, answers, strict=True)
            if not isinstance(a, SourceError)
        }
        return replace(plain, labels=labels)

    return await source.shared(("holdings", at.timestamp(), lookback_s, len(names), id(catalogue)), ask)

def resolve(convention: Convention, held_now: Holdings) -> Convention:
    """``convention`` as the server holds it: for an OpenTelemetry convention whose names are not
    there as written, each form's metric in the spelling that is there and its labels as they are
    named on those series. Any other convention comes back as it is."""
    if not convention.otel or all(held(f.metric, held_now.names) for f in convention.forms.values()):
        return convention
    forms: dict[str, Form] = {}
    label_names: set[str] = set()
    for signal, form in convention.forms.items():
        spelt = form if held(form.metric, held_now.names) else _spelt(form, held_now)
        forms[signal] = spelt
        for series in (spelt.metric, *(f"{spelt.metric}{p}" for p in HISTOGRAM_PARTS)):
            label_names |= held_now.labels.get(series, frozenset())
    if all(forms[signal] is form for signal, form in convention.forms.items()):
        return convention  # nothing held under another spelling: the convention as written
    if not label_names:
        return replace(convention, forms=forms)
    by_escape = {escape_label(name): name for name in sorted(label_names)}

    def own(label: str) -> str:
        return label if label in label_names else by_escape.get(label, label)

    forms = {
        signal: replace(form, matchers=tuple((own(label), op, value) for label, op, value in form.matchers))
        for signal, form in forms.items()
    }
    labels = {normalised: own(label) for normalised, label in convention.labels.items()}
    return replace(convention, forms=forms, labels=labels)


def resolve_all(convention: Convention, held_now: Holdings) -> list[Convention]:
    """Every spelling of ``convention`` the server holds, each whole: one Prometheus may scrape a
    service that writes UTF-8 names and another (or an older SDK) that writes escaped ones, and
    each must be read in its own spelling, never one form in each (:func:`resolve` on either half)."""
    if not convention.otel:
        return [convention]
    known = held_now._resolved.get(id(convention))
    if known is not None and known[0] is convention:
        return known[1]
    found = _resolve_all(convention, held_now)
    held_now._resolved[id(convention)] = (convention, found)
    return found


def _resolve_all(convention: Convention, held_now: Holdings) -> list[Convention]:
    utf8 = held_now.utf8_names
    if not utf8:
        return [resolve(convention, held_now)]
    legacy_spelt = {
        name for form in convention.forms.values() for name in held_now.spelt(form.spellings)
        if is_legacy_metric(name)
    }  # fmt: skip
    views = (
        Holdings.of(held_now.names - utf8, held_now.labels),
        Holdings.of(held_now.names - legacy_spelt, held_now.labels),
    )
    found: list[Convention] = []
    for view in views:
        resolved = resolve(convention, view)
        if resolved not in found:
            found.append(resolved)
    return found


def _spelt(form: Form, held_now: Holdings) -> Form:
    """The form with its metric as present: the base name of the first spelling found (a
    histogram part's ``_bucket``... taken off when the form itself names no part)."""
    own_part = next((p for p in HISTOGRAM_PARTS if form.metric.endswith(p)), "")
    for name in held_now.spelt(form.spellings):
        part = next((p for p in HISTOGRAM_PARTS if name.endswith(p)), "")
        if own_part and part != own_part:
            continue
        base = name if own_part or not part else name[: -len(part)]
        return form if base == form.metric else replace(form, metric=base)
    return form
