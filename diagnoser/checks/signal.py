"""The ``signal`` check kind: PromQL over named signals, answered by whichever conventions exist.

::

    - signal:
        query: |
          max by (namespace, service, pool) (avg_over_time({{pool.used}}[${window}]))
          / max by (namespace, service, pool) (avg_over_time({{pool.max}}[${window}]))
        op: ">="
        threshold: 0.95
    - signal:
        any_of:                       # holds when any of these holds for the same labels
          - max by (namespace, service, pool) (avg_over_time({{pool.pending}}[${window}]))
          - sum by (namespace, service, pool) (rate({{pool.timeouts_total}}[${window}]))
        op: ">"
        threshold: 0

Before its first query the check asks Prometheus once (shared by every rule at that instant)
which metric names exist, instantiates the query for each convention present
(:func:`diagnoser.signals.expansions`), and maps the answers back to normalised labels
(``service``, ``pool``, ``namespace``, ``instance``...). When two conventions (or two
alternatives) answer for the same labels, the first in catalogue order wins, so one pool gives one
row. Each evidence row names the convention that answered and any caveat of its metrics. When no
convention is present, the check does not hold.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from diagnoser.checks.comparison import Comparison, compare, filtered, unfiltered
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.checks.top_buckets import BucketFamily, TopBuckets, capped_notes, top_buckets
from diagnoser.models import Evidence, SourceError
from diagnoser.promql import duration_seconds
from diagnoser.signals import (
    Catalogue,
    Expansion,
    expansions,
    load_catalogue,
    normalise_labels,
    validate_template,
)
from diagnoser.signals.claims import claims
from diagnoser.signals.expand import references
from diagnoser.signals.holdings import Holdings, holdings
from diagnoser.signals.recognition import recognition
from diagnoser.signals.recorded import (
    recorded_fingerprints,
    strip_recording_labels,
    substitute,
    valid_record_name,
)
from diagnoser.signals.target_info import identities
from diagnoser.sources.prometheus import PrometheusSource, Sample

__all__ = ["SignalParams", "catalogue_of", "signal_check", "templates_of"]

SOURCE = "prometheus"
#: Metric names are looked up over at least this long before the instant evaluated.
MIN_NAMES_LOOKBACK_S = 300.0


def catalogue_of(info: ValidationInfo) -> Catalogue:
    """The catalogue a condition is checked against: the validation context's (the one the
    rules load with, ``resolve_condition(..., catalogue=)``), else the shipped one."""
    context = info.context if isinstance(info.context, dict) else {}
    catalogue = context.get("catalogue")
    return catalogue if isinstance(catalogue, Catalogue) else load_catalogue()


class Alternative(BaseModel):
    """One query of ``any_of``, with what its value measures (shown as the evidence's detail)."""

    model_config = ConfigDict(extra="forbid")

    query: str
    what: str | None = None
    #: The ``diag:*`` series a ruler records this query as (:mod:`diagnoser.signals.recorded`).
    record: str | None = None

    @field_validator("query")
    @classmethod
    def _query_signals(cls, value: str, info: ValidationInfo) -> str:
        validate_template(value, catalogue_of(info))
        return value

    @field_validator("record")
    @classmethod
    def _record_name(cls, value: str | None) -> str | None:
        return _record_name(value)


def _record_name(value: str | None) -> str | None:
    if value is not None and not valid_record_name(value):
        raise ValueError(f"record {value!r} is not diag:<level>:<metric>:<operations> (a-z, 0-9, _)")
    return value


class SignalParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str | None = None
    any_of: list[Alternative] | None = None
    op: Comparison | None = None
    threshold: float | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    #: The ``diag:*`` series a ruler records ``query`` as (on ``any_of``, each alternative names its own).
    record: str | None = None

    @field_validator("query")
    @classmethod
    def _query_signals(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            validate_template(value, catalogue_of(info))
        return value

    @field_validator("any_of", mode="before")
    @classmethod
    def _alternatives(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("any_of needs at least one query")
            return [{"query": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("record")
    @classmethod
    def _record_name(cls, value: str | None) -> str | None:
        return _record_name(value)

    @model_validator(mode="after")
    def _shape(self) -> SignalParams:
        if (self.query is None) == (self.any_of is None):
            raise ValueError("give exactly one of query or any_of")
        if self.record is not None and self.any_of is not None:
            raise ValueError("record goes on each alternative of any_of")
        if (self.op is None) != (self.threshold is None):
            raise ValueError("op and threshold go together")
        return self


def templates_of(params: SignalParams) -> list[Alternative]:
    """The queries of a condition: its one query, or each of ``any_of`` in order."""
    if params.query is not None:
        return [Alternative.model_construct(query=params.query, what=None, record=params.record)]  # validated
    return list(params.any_of or [])


def signal_queries(params: SignalParams, catalogue: Catalogue) -> list[tuple[str, str]]:
    """Every query the condition can send: each alternative under every convention of the catalogue."""
    return [
        (f" ({expansion.convention.name})", expansion.query)
        for alternative in templates_of(params)
        for expansion in expansions(alternative.query, catalogue)
    ]


@check_kind("signal", params=SignalParams, reads={SOURCE}, queries=signal_queries)
async def signal_check(params: SignalParams, ctx: CheckContext) -> CheckResult:
    source: PrometheusSource = ctx.require(ctx.sources.prometheus, SOURCE)
    catalogue = ctx.catalogue
    lookback = max(MIN_NAMES_LOOKBACK_S, duration_seconds(ctx.window))
    names = await source.metric_names(ctx.names_at, lookback)
    if isinstance(names, SourceError):
        return names
    present = await holdings(source, catalogue, names, ctx.names_at, lookback)
    # The catalogue's conventions as the families' labels fit them (one query per instant, shared).
    claimed = await claims(source, catalogue, ctx.names_at, lookback)
    fitting = catalogue if isinstance(claimed, SourceError) else claimed.catalogue(catalogue)
    # The catalogue's conventions are asked at once; families no convention claims may still be
    # recognised by their shape (signals.infer, once per instant), and their inferred conventions
    # are asked as soon as that is known, without holding up the catalogue's queries.
    catalogued, inferred = await asyncio.gather(
        _ask(source, params, expansions_of(params, fitting, present), ctx),
        _ask_inferred(source, params, catalogue, present, ctx, lookback),
    )
    planned = [*catalogued, *inferred]
    tops = await _top_buckets(source, planned, params, ctx)
    pushed = any(
        expansion.convention.otel and "/" in sample.labels.get("job", "")
        for _, expansion, samples in planned
        if not isinstance(samples, SourceError)
        for sample in samples
    )
    who = await identities(source, ctx.names_at) if pushed else {}
    rows: dict[tuple[tuple[str, str], ...], Evidence] = {}

    def sent_as(query: str) -> str:
        return unfiltered(source.prepare(query, ctx.at), params.op, params.threshold)

    for alternative, expansion, samples in planned:
        if isinstance(samples, SourceError):
            return samples
        buckets = [family.selector for family in _bucket_families(alternative, expansion)]
        for sample in samples:
            if not _holds(sample.value, params):
                continue
            labels = normalise_labels(sample.labels, expansion.convention, who)
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "job"))
            notes = [*expansion.notes, *capped_notes(buckets, sample, tops)]
            rows.setdefault(
                key,
                Evidence(
                    source=SOURCE,
                    query=ctx.shown(sent_as(expansion.query), sample.labels),
                    labels=labels,
                    value=sample.value,
                    threshold=params.threshold,
                    detail=alternative.what,
                    convention=expansion.convention.name,
                    caveat="; ".join(notes) or None,
                    setting=" / ".join(expansion.settings) or None,
                ),
            )
    return list(rows.values())


Planned = list[tuple[Alternative, Expansion]]


def _bucket_families(alternative: Alternative, expansion: Expansion) -> list[BucketFamily]:
    """The classic histograms (``_bucket`` series) a quantile query of ``alternative`` reads."""
    if "histogram_quantile" not in alternative.query:
        return []
    forms = expansion.convention.forms
    return [
        BucketFamily(f"{forms[name].metric}_bucket", forms[name].matchers, forms[name].scale, None)
        for name, part in references(alternative.query)
        if part == "bucket" and name in forms
    ]


async def _top_buckets(
    source: PrometheusSource,
    planned: list[tuple[Alternative, Expansion, list[Sample] | SourceError]],
    params: SignalParams,
    ctx: CheckContext,
) -> TopBuckets:
    """The highest finite ``le`` of each classic histogram a quantile that holds was read from, for
    the jobs of its rows: asked only for quantiles that make a row, so a healthy diagnosis asks
    nothing."""
    wanted: dict[str, BucketFamily] = {}
    for alternative, expansion, samples in planned:
        if isinstance(samples, SourceError):
            continue
        holding = [s for s in samples if _holds(s.value, params)]
        if not holding:
            continue
        # A row summed over jobs (no job label) leaves only the family's own highest bound.
        summed = any("job" not in s.labels for s in holding)
        jobs = None if summed else frozenset(s.labels["job"] for s in holding)
        for family in _bucket_families(alternative, expansion):
            known = wanted.get(family.selector, replace(family, jobs=frozenset()))
            both = None if jobs is None or known.jobs is None else known.jobs | jobs
            wanted[family.selector] = replace(known, jobs=both)
    # A family's bucket layout is its own, not the instant's: read where the names were.
    return await top_buckets(source, list(wanted.values()), ctx.names_at)


def expansions_of(params: SignalParams, catalogue: Catalogue, present: Holdings) -> Planned:
    return [
        (alternative, expansion)
        for alternative in templates_of(params)
        for expansion in expansions(alternative.query, catalogue, present)
    ]


async def _ask(
    source: PrometheusSource, params: SignalParams, planned: Planned, ctx: CheckContext
) -> list[tuple[Alternative, Expansion, list[Sample] | SourceError]]:
    planned = await _recorded(source, planned, ctx)
    # Only the rows that may hold, of the series the rule still reads (a rule's candidates:
    # CheckContext.narrowed_to), and one request for every convention's expansion (the recognised
    # families can be hundreds); each row's evidence shows the query as sent.
    sent = [filtered(ctx.narrow(e.query), params.op, params.threshold) for _, e in planned]
    answers = await source.query_each(sent, ctx.at, params.timeout_s)
    return [
        (a, replace(e, query=query), _unrecorded(e, samples))
        for (a, e), query, samples in zip(planned, sent, answers, strict=True)
    ]


def _unrecorded(expansion: Expansion, samples: list[Sample] | SourceError) -> list[Sample] | SourceError:
    """The answer of a recorded series without the labels its recording adds."""
    if isinstance(samples, SourceError) or not expansion.query.startswith("diag:"):
        return samples
    return strip_recording_labels(samples)


async def _recorded(source: PrometheusSource, planned: Planned, ctx: CheckContext) -> Planned:
    """With ``prometheus.use_recorded``, each expansion whose recording a ruler writes at the
    instant (whichever rule named it) reads it instead, and the evidence shows the recorded series;
    the rest, and every expansion when the heartbeats cannot be read, ask their raw query."""
    if not source.settings.use_recorded or not planned:
        return planned
    present = await recorded_fingerprints(source, ctx.at)
    if isinstance(present, SourceError) or not present:
        return planned
    return [(a, substitute(e, present) or e) for a, e in planned]


async def _ask_inferred(
    source: PrometheusSource,
    params: SignalParams,
    catalogue: Catalogue,
    present: Holdings,
    ctx: CheckContext,
    lookback: float,
) -> list[tuple[Alternative, Expansion, list[Sample] | SourceError]]:
    recognised = await recognition(source, catalogue, ctx.names_at, lookback)
    if isinstance(recognised, SourceError) or not recognised.conventions:
        return []  # recognition is a refinement: without it the catalogue's answers stand
    only_inferred = Catalogue(
        signals=catalogue.signals, conventions=list(recognised.conventions), expanded=catalogue.expanded
    )
    return await _ask(source, params, expansions_of(params, only_inferred, present), ctx)


def _holds(value: float, params: SignalParams) -> bool:
    if math.isnan(value):
        return False
    if params.op is None or params.threshold is None:
        return True
    return compare(value, params.op, params.threshold)
