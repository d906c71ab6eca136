"""Check kinds over PromQL: ``promql`` (threshold), ``absent`` (must exist) and ``trend`` (growth).

``promql``: an instant query; each series whose value passes ``op threshold`` is evidence. With
no ``op``, every returned series is evidence (the alerting-rule style: the query filters).

``absent``: holds when the query returns no series, e.g. no metrics-server scrape target.

``trend``: ``predict_linear`` or ``deriv`` of a series over a window, compared with a fixed
threshold or with each series' own limit from a second query joined on ``join_on`` labels; memory
predicted to reach its container limit within the hour is the classic use.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from diagnoser.checks.comparison import Comparison, compare, filtered, unfiltered
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.promql import duration_seconds, is_duration, is_selector
from diagnoser.sources.prometheus import PrometheusSource, Sample

if TYPE_CHECKING:
    from diagnoser.signals import Catalogue

__all__ = ["AbsentParams", "PromqlParams", "TrendParams", "limit_query", "trend_query"]

SOURCE = "prometheus"


class PromqlParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    op: Comparison | None = None
    threshold: float | None = None
    timeout_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _op_needs_threshold(self) -> PromqlParams:
        if (self.op is None) != (self.threshold is None):
            raise ValueError("op and threshold go together")
        return self


class AbsentParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    #: What is missing, in words, for the report ("metrics-server scrape target").
    description: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)


class TrendParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    function: Literal["predict_linear", "deriv"] = "predict_linear"
    window: str = "1h"
    #: How far ahead ``predict_linear`` looks.
    horizon: str = "1h"
    #: Subquery resolution, used when ``query`` is an expression rather than a plain selector.
    resolution: str = "1m"
    op: Comparison = ">="
    threshold: float | None = None
    #: A query giving each series its own limit (``container_spec_memory_limit_bytes``).
    limit: str | None = None
    #: Labels that join ``query`` and ``limit`` series (not ``on``: YAML reads a bare on as true).
    join_on: list[str] = Field(default_factory=list)
    timeout_s: float | None = Field(default=None, gt=0)

    @field_validator("window", "horizon", "resolution")
    @classmethod
    def _duration(cls, value: str) -> str:
        if not is_duration(value):
            raise ValueError(f"{value!r} is not a PromQL duration like 5m or 1h30m")
        return value

    @model_validator(mode="after")
    def _one_bound(self) -> TrendParams:
        if (self.threshold is None) == (self.limit is None):
            raise ValueError("give exactly one of threshold or limit")
        if self.limit is not None and not self.join_on:
            raise ValueError("limit needs join_on: the labels that join a series with its limit")
        if duration_seconds(self.window) < 2 * duration_seconds(self.resolution):
            # Prometheus 3 reads ranges left-open: a subquery of one step holds one point.
            raise ValueError(f"window {self.window} spans fewer than two {self.resolution} steps")
        return self


def _prometheus(ctx: CheckContext) -> PrometheusSource:
    return ctx.require(ctx.sources.prometheus, SOURCE)


@check_kind("promql", params=PromqlParams, reads={SOURCE}, queries=lambda p, _: [("", p.query)])
async def promql(params: PromqlParams, ctx: CheckContext) -> CheckResult:
    source = _prometheus(ctx)
    # Only the rows that may hold travel back; a query PromQL cannot compare so (a scalar) is
    # asked as written.
    written = ctx.narrow(params.query)
    query = filtered(written, params.op, params.threshold)
    samples = await source.query(query, ctx.at, params.timeout_s)
    if isinstance(samples, SourceError) and query != written:
        query = written
        samples = await source.query(query, ctx.at, params.timeout_s)
    if isinstance(samples, SourceError):
        return samples
    sent = source.prepare(query, ctx.at)
    query = sent if query == written else unfiltered(sent, params.op, params.threshold)
    evidence: list[Evidence] = []
    for sample in samples:
        if params.op is None or params.threshold is None:
            if math.isnan(sample.value):
                continue
        elif not compare(sample.value, params.op, params.threshold):
            continue
        evidence.append(
            Evidence(
                source=SOURCE,
                query=ctx.shown(query, sample.labels),
                labels=sample.labels,
                value=sample.value,
                threshold=params.threshold,
                detail=_infinite_note(sample),
            )
        )
    return evidence


@check_kind(
    "absent", params=AbsentParams, reads={SOURCE}, queries=lambda p, _: [("", p.query)], needs_data=False
)
async def absent(params: AbsentParams, ctx: CheckContext) -> CheckResult:
    source = _prometheus(ctx)
    samples = await source.query(params.query, ctx.at, params.timeout_s)
    if isinstance(samples, SourceError):
        return samples
    if any(not math.isnan(s.value) for s in samples):
        return []
    what = params.description or "series"
    return [Evidence(source=SOURCE, query=source.prepare(params.query, ctx.at), detail=f"no {what} found")]


def trend_query(params: TrendParams) -> str:
    """The PromQL the trend check sends: a range over a selector, or a subquery over an expression."""
    inner = params.query.strip()
    ranged = (
        f"{inner}[{params.window}]"
        if is_selector(inner)
        else f"({inner})[{params.window}:{params.resolution}]"
    )
    if params.function == "predict_linear":
        return f"predict_linear({ranged}, {duration_seconds(params.horizon):g})"
    return f"deriv({ranged})"


def limit_query(params: TrendParams) -> str:
    """Each series' limit, one per join key; 0 and absent mean unlimited (cAdvisor's convention)."""
    on = ", ".join(params.join_on)
    return f"max by ({on}) ({params.limit}) > 0"


def trend_queries(params: TrendParams, catalogue: Catalogue) -> list[tuple[str, str]]:
    """The projection, and the limits query when the trend compares with a limit."""
    found = [("", trend_query(params))]
    if params.limit:
        found.append((".limit", limit_query(params)))
    return found


@check_kind("trend", params=TrendParams, reads={SOURCE}, queries=trend_queries)
async def trend(params: TrendParams, ctx: CheckContext) -> CheckResult:
    source = _prometheus(ctx)
    projection = ctx.narrow(trend_query(params))
    if params.limit is None:
        # Compared in Prometheus too, so only the series that may hold travel back.
        projection = filtered(projection, params.op, params.threshold)
        samples = await source.query(projection, ctx.at, params.timeout_s)
        if isinstance(samples, SourceError):
            return samples
        assert params.threshold is not None
        shown = unfiltered(source.prepare(projection, ctx.at), params.op, params.threshold)
        return [
            Evidence(
                source=SOURCE,
                query=ctx.shown(shown, s.labels),
                labels=s.labels,
                value=s.value,
                threshold=params.threshold,
            )
            for s in samples
            if compare(s.value, params.op, params.threshold)
        ]
    # Compare in Prometheus so only the series that reach their limit travel back, then fetch
    # those series' limits for the evidence.
    on = ", ".join(params.join_on)
    limits = ctx.narrow(limit_query(params))
    reaching = f"{projection} {params.op} on ({on}) group_left () ({limits})"
    hits = await source.query(reaching, ctx.at, params.timeout_s)
    if isinstance(hits, SourceError):
        return hits
    if not hits:
        return []
    hit_limits = await source.query(f"({limits}) and on ({on}) ({reaching})", ctx.at, params.timeout_s)
    if isinstance(hit_limits, SourceError):
        return hit_limits
    by_key = {_key(s.labels, params.join_on): s.value for s in hit_limits}
    return [
        Evidence(
            source=SOURCE,
            query=ctx.shown(source.prepare(reaching, ctx.at), s.labels),
            labels=s.labels,
            value=s.value,
            threshold=by_key.get(_key(s.labels, params.join_on)),
        )
        for s in hits
    ]


def _key(labels: dict[str, str], on: list[str]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in on)


def _infinite_note(sample: Sample) -> str | None:
    if math.isinf(sample.value):
        return "value is infinite: for a quantile, above the highest histogram bucket"
    return None
