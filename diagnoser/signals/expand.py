"""Turn a rule's query over signals into PromQL for each convention a Prometheus holds.

A rule writes PromQL with signal references and normalised label names::

    max by (namespace, service, pool) (avg_over_time({{pool.used}}[5m]))
      / max by (namespace, service, pool) (avg_over_time({{pool.max}}[5m]))

For each convention that has every signal referenced (and whose metrics exist), the query is
instantiated on its syntax tree (:mod:`diagnoser.promql`: each reference stands in as a
placeholder metric while the query is parsed): each ``{{signal}}``
(``{{signal:bucket|sum|count}}`` for a histogram's series) becomes that convention's selector;
label names in ``by``, ``without``, ``on``, ``ignoring`` and ``group_*`` clauses become the
convention's (``pool`` -> ``db_client_connection_pool_name``,
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
from functools import lru_cache

from diagnoser.errors import PromqlSyntaxError
from diagnoser.promql import Replacement, grouping_labels, held, parse, rewrite
from diagnoser.signals.catalogue import Catalogue, Convention, Form
from diagnoser.signals.holdings import Holdings, resolve_all

__all__ = [
    "DERIVED_LABELS",
    "Expansion",
    "expansions",
    "grouping_labels_of",
    "normalise_labels",
    "references",
    "required_metrics",
    "validate_template",
]

#: A reference to a signal: diagnoser's template syntax around PromQL, not PromQL itself.
_REF = re.compile(r"\{\{\s*([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)\s*(?::\s*(bucket|sum|count)\s*)?\}\}")
#: The metric name a reference stands in as while the query is parsed (``__signal_ref_0``...).
_PLACEHOLDER = "__signal_ref_"


@dataclass(frozen=True)
class Expansion:
    """A rule query instantiated for one convention."""

    convention: Convention
    query: str
    #: Caveats of the forms used (``use time includes pool wait``).
    notes: tuple[str, ...] = ()
    #: The settings that configure the values of the forms used (``SetMaxOpenConns``).
    settings: tuple[str, ...] = ()


def references(template: str) -> list[tuple[str, str | None]]:
    """The ``(signal, part)`` pairs a query refers to, in order of appearance."""
    return list(_placeholders(template)[1])


@lru_cache(maxsize=512)
def _placeholders(template: str) -> tuple[str, tuple[tuple[str, str | None], ...]]:
    """``template`` as PromQL, each reference a placeholder metric; the references in order."""
    refs: list[tuple[str, str | None]] = []

    def placeholder(match: re.Match[str]) -> str:
        refs.append((match.group(1), match.group(2)))
        return f"{_PLACEHOLDER}{len(refs) - 1}"

    return _REF.sub(placeholder, template), tuple(refs)


def _promql(template: str) -> str:
    """The template's PromQL (placeholders for references); ``ValueError`` if it does not parse."""
    text = _placeholders(template)[0]
    try:
        parse(text)
    except PromqlSyntaxError as exc:
        flat = " ".join(template.split())
        raise ValueError(f"the query does not parse as PromQL ({exc.reason}): {flat}") from exc
    return text


def validate_template(template: str, catalogue: Catalogue) -> None:
    """Raise ``ValueError`` for an unknown signal, a histogram read without its part, or bad PromQL."""
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
    _promql(template)


def grouping_labels_of(template: str) -> dict[str, list[str]]:
    """The labels of a template's ``by``/``without``/``on``/... clauses, by clause (normalised names)."""
    return grouping_labels(_promql(template))


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
    template: str, catalogue: Catalogue, present: set[str] | frozenset[str] | Holdings | None = None
) -> list[Expansion]:
    """The query for each convention that has its signals (and, given ``present``, its metrics).

    Given :class:`~diagnoser.signals.holdings.Holdings`, an OpenTelemetry convention is matched
    in whichever OTLP spelling the server holds (:func:`~diagnoser.signals.holdings.resolve`);
    two conventions that then read the same series with the same labels give one expansion.
    """
    held_now: Holdings | None = None
    names: set[str] | frozenset[str] | None = None
    if isinstance(present, Holdings):
        held_now, names = present, present.names
    else:
        names = present
    candidates: list[tuple[Convention, Convention, tuple[str, ...], tuple[object, ...]]] = []
    for catalogued in catalogue.conventions:
        for convention in resolve_all(catalogued, held_now) if held_now is not None else [catalogued]:
            needed = required_metrics(template, convention)
            # A histogram's series count as present when the family is held as a native histogram:
            # the source reads them as such (diagnoser.promql.read_histograms).
            if needed is None or (names is not None and not all(held(name, names) for name in needed)):
                continue
            metrics = tuple(sorted(needed))
            reads: tuple[object, ...] = (
                metrics, tuple(sorted(convention.labels.items())), _forms_read(template, convention)
            )  # fmt: skip
            candidates.append((catalogued, convention, metrics, reads))
    # A convention that names the series as they are beats one that reaches the same series by
    # another OTLP spelling (otel-http-client-js's http_client_request_duration over otel-http-client's).
    exact = {metrics for catalogued, convention, metrics, _ in candidates if convention is catalogued}
    found = []
    seen: set[tuple[object, ...]] = set()
    for catalogued, convention, metrics, reads in candidates:
        if reads in seen or (convention is not catalogued and metrics in exact):
            continue
        seen.add(reads)
        # What the convention reads is part of the key: claims (signals.claims) and OTLP spellings
        # give conventions of one name different forms at different instants.
        key = (template, convention.name, reads)
        expansion = catalogue.expanded.get(key)
        if expansion is None:
            expansion = catalogue.expanded[key] = _expand(template, convention)
        found.append(expansion)
    return found


def _forms_read(template: str, convention: Convention) -> tuple[object, ...]:
    return tuple(
        (convention.forms[name].metric, convention.forms[name].matchers) for name, _ in references(template)
    )


def _expand(template: str, convention: Convention) -> Expansion:
    text, refs = _placeholders(template)
    _promql(template)
    notes: list[str] = []
    settings: list[str] = []
    replacements: dict[str, Replacement] = {}
    for index, (name, part) in enumerate(refs):
        form = convention.forms[name]
        if form.note and form.note not in notes:
            notes.append(form.note)
        if form.setting and form.setting not in settings:
            settings.append(form.setting)
        replacements[f"{_PLACEHOLDER}{index}"] = Replacement(
            metric=_series(form, part),
            matchers=form.matchers,
            # A count is a number of observations: only durations are scaled.
            scale=form.scale if part != "count" else 1.0,
            buckets=part == "bucket",
        )
    query = rewrite(text, replacements.get, lambda label: _source_labels(convention, label))
    return Expansion(convention=convention, query=query, notes=tuple(notes), settings=tuple(settings))


#: Normalised labels that name a database, and the labels OpenTelemetry's semantic conventions spell
#: them with in either generation (``db.system.name`` since 1.30, ``db.system`` before;
#: ``db.namespace`` since 1.26, ``db.name`` before), newest first. A rule grouping by them reads
#: whichever a convention's series carry, without each entry having to say so.
DATABASE_LABELS: dict[str, tuple[str, ...]] = {
    "db_system": ("db_system_name", "db_system"),
    "db_name": ("db_namespace", "db_name"),
}
#: Labels the normalisation derives from another one a rule groups by: a database peer named by
#: system and name keeps its address as ``peer_address`` (:func:`_database_labels`).
DERIVED_LABELS: dict[str, tuple[str, ...]] = {"peer": ("peer_address",)}


def _source_labels(convention: Convention, label: str) -> str | tuple[str, ...]:
    if label in convention.labels or label not in DATABASE_LABELS:
        return convention.source_label(label)
    return DATABASE_LABELS[label]


def _database_labels(labels: Mapping[str, str], out: dict[str, str]) -> None:
    """``db_system`` and ``db_name`` from whichever spelling the series carry, and a database peer
    named by them (``postgresql database inventory``) rather than by its address, which is kept
    as ``peer_address``."""
    for normalised, spellings in DATABASE_LABELS.items():
        value = next((labels[s] for s in spellings if labels.get(s)), None)
        if value and normalised not in out:
            out[normalised] = value
    system, name = out.get("db_system"), out.get("db_name")
    if not system or "peer" not in out or out["peer"] == name:
        return
    if out["peer"] == system:  # the convention names the peer by its system already
        if name:
            out["peer"] = f"{system} database {name}"
        return
    address = out.pop("peer")
    port = out.pop("peer_port", None)
    out["peer_address"] = f"{address}:{port}" if port else address
    out["peer"] = f"{system} database {name}" if name else system


def normalise_labels(
    labels: Mapping[str, str], convention: Convention, identities: Mapping[str, tuple[str, str | None]] = {}
) -> dict[str, str]:
    """An answer's labels under their normalised names (``job`` is kept beside ``service``).

    A ``job`` of ``namespace/name`` is how Prometheus' OTLP receiver writes an OpenTelemetry
    resource's ``service.namespace`` and ``service.name``: the service is the name, and the
    namespace the namespace where the series carry none of their own. ``identities`` (``job`` ->
    service and namespace, read from ``target_info``: :mod:`diagnoser.signals.target_info`) says
    so where a slash in either makes the ``job`` ambiguous.
    """
    out: dict[str, str] = {}
    for key, value in labels.items():
        normalised = convention.normalised_label(key)
        if normalised is not None:
            out[normalised] = value
            if key != "job":
                continue
        out.setdefault(key, value)
    if "peer" in convention.labels:
        _database_labels(labels, out)
    job = labels.get("job", "")
    if out.get("service") == job and "/" in job and convention.otel:
        known = identities.get(job)
        if known is not None:
            name, namespace = known
        elif job.count("/") == 1:
            namespace, _, name = job.partition("/")
        else:
            return out
        out["service"] = name
        if namespace:
            out.setdefault("namespace", namespace)
    return out


def metric_names_in(queries: Iterable[str]) -> set[str]:
    """Signal names referenced by any of ``queries`` (for reports of what was looked for)."""
    return {name for query in queries for name, _ in references(query)}
