"""The ``es`` check kind: named Elasticsearch checks a rule selects with ``check:``.

=========================  =======================================================================
``check``                  holds for (one evidence row each)
=========================  =======================================================================
``hot_threads``            a node where one of ``groups`` (merge, gc, ...) takes ``min_share`` of
                           the hot-thread CPU and at least ``min_percent`` (100 = one core)
``heap``                   a node with heap used over ``max_heap_percent`` (and, with
                           ``require_gc_rising``, old-gen GC time above its lifetime rate)
``thread_pool_rejections`` a node and pool (search, write) whose ``rejected`` counter grew by
                           ``min_rejected`` or more between two readings ``sample_s`` apart
``expensive_query``        a slow log query shape with one of ``anti_patterns`` and at least
                           ``min_total_ms`` of slow time (files from ``elasticsearch.slowlog_paths``,
                           documents from ``elasticsearch.slowlog_index``)
``shard_sizing``           an index whose primary shards are outside ``min_shard_gb``..``max_shard_gb``
``fielddata_text``         a node holding ``min_fielddata_bytes`` or more fielddata on a ``text`` field
``node_stats``             a node whose ``field`` (dotted path in node stats, or node info with
                           ``api: info``; ``delta: true`` for growth between readings) compares
                           ``op`` ``threshold``
=========================  =======================================================================

Example condition::

    - es: {check: hot_threads, groups: [merge, gc], min_share: 0.5}

Counters (GC, rejections) are read twice ``sample_s`` apart (see
:mod:`diagnoser.elasticsearch.node_stats`); checks asking for the same interval share one pair
of readings.
"""

from __future__ import annotations

import functools
import math
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.comparison import Comparison, compare
from diagnoser.elasticsearch.hot_threads import POOL_GROUPS, pool_shares
from diagnoser.elasticsearch.node_stats import field_value, gc_rates
from diagnoser.elasticsearch.shards import GB, shard_sizing
from diagnoser.elasticsearch.slowlog import (
    ANTI_PATTERN_FIXES,
    ANTI_PATTERNS,
    SlowlogSummary,
    parse_slowlog_record,
    summarise_slowlog_files,
)
from diagnoser.errors import SourceNotConfigured
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.base import run_blocking

__all__ = ["EsParams", "es_check"]

SOURCE = "elasticsearch"
CheckName = Literal[
    "hot_threads",
    "heap",
    "thread_pool_rejections",
    "expensive_query",
    "shard_sizing",
    "fielddata_text",
    "node_stats",
]
SizingProblem = Literal["too_large", "too_small"]
_SIZING_PROBLEMS: tuple[SizingProblem, ...] = ("too_large", "too_small")
#: Which parameters each check reads; setting another one is a rule error, not a silent no-op.
_FIELDS_OF: dict[str, frozenset[str]] = {
    "hot_threads": frozenset({"groups", "min_share", "min_percent", "threads", "interval_ms"}),
    "heap": frozenset({"max_heap_percent", "require_gc_rising", "sample_s"}),
    "thread_pool_rejections": frozenset({"pools", "min_rejected", "sample_s"}),
    "expensive_query": frozenset(
        {"anti_patterns", "min_total_ms", "top", "window_minutes", "max_index_docs"}
    ),
    "shard_sizing": frozenset(
        {"min_shard_gb", "max_shard_gb", "target_shard_gb", "problems", "include_hidden"}
    ),
    "fielddata_text": frozenset({"min_fielddata_bytes"}),
    "node_stats": frozenset({"field", "op", "threshold", "api", "delta", "sample_s"}),
}


class EsParams(BaseModel):
    """Parameters of an ``es`` condition; which ones apply depends on ``check`` (see module doc)."""

    model_config = ConfigDict(extra="forbid")

    check: CheckName
    # hot_threads
    groups: list[str] = Field(default_factory=lambda: ["merge", "gc"])
    min_share: float = Field(default=0.5, ge=0, le=1)
    min_percent: float = Field(default=50.0, ge=0)
    threads: int = Field(default=5, ge=1, le=100)
    interval_ms: int = Field(default=500, ge=10, le=10_000)
    # heap / thread pools / node_stats deltas
    max_heap_percent: float = Field(default=85.0, gt=0, le=100)
    require_gc_rising: bool = True
    sample_s: float = Field(default=2.0, ge=0, le=60)
    pools: list[str] = Field(default_factory=lambda: ["search", "write"])
    min_rejected: int = Field(default=1, ge=1)
    # expensive_query
    anti_patterns: list[str] = Field(default_factory=lambda: sorted(ANTI_PATTERNS))
    min_total_ms: float = Field(default=1000.0, ge=0)
    top: int = Field(default=5, ge=1, le=100)
    window_minutes: float = Field(default=0.0, ge=0)
    max_index_docs: int = Field(default=5000, ge=1, le=10_000)
    # shard_sizing
    min_shard_gb: float = Field(default=10.0, gt=0)
    max_shard_gb: float = Field(default=50.0, gt=0)
    target_shard_gb: float = Field(default=30.0, gt=0)
    problems: list[SizingProblem] = Field(default_factory=lambda: list(_SIZING_PROBLEMS))
    include_hidden: bool = False
    # fielddata_text
    min_fielddata_bytes: int = Field(default=10 * 1024 * 1024, ge=0)
    # node_stats
    field: str | None = None
    op: Comparison = ">"
    threshold: float | None = None
    api: Literal["stats", "info"] = "stats"
    delta: bool = False

    @model_validator(mode="after")
    def _fields_match_check(self) -> EsParams:
        allowed = _FIELDS_OF[self.check] | {"check"}
        stray = sorted(self.model_fields_set - allowed)
        if stray:
            raise ValueError(
                f"check {self.check!r} does not take {stray}; it takes {sorted(allowed - {'check'})}"
            )
        if self.check == "hot_threads":
            unknown = sorted(set(self.groups) - set(POOL_GROUPS))
            if unknown:
                raise ValueError(f"unknown pool group(s) {unknown}; known: {list(POOL_GROUPS)}")
        if self.check == "expensive_query":
            unknown = sorted(set(self.anti_patterns) - set(ANTI_PATTERNS))
            if unknown:
                raise ValueError(f"unknown anti-pattern(s) {unknown}; known: {sorted(ANTI_PATTERNS)}")
        if (
            self.check == "shard_sizing"
            and not self.min_shard_gb <= self.target_shard_gb <= self.max_shard_gb
        ):
            raise ValueError("need min_shard_gb <= target_shard_gb <= max_shard_gb")
        if self.check == "node_stats":
            if not self.field or self.threshold is None:
                raise ValueError("check 'node_stats' needs 'field' and 'threshold'")
            if self.delta and self.api == "info":
                raise ValueError("'delta' applies to node stats counters, not node info")
        return self


@check_kind("es", params=EsParams, reads={"elasticsearch"})
async def es_check(params: EsParams, ctx: CheckContext) -> CheckResult:
    """Run the named Elasticsearch check; see the module docstring for each one."""
    if params.check == "expensive_query":
        return await _expensive_query(params, ctx)
    source = ctx.require(ctx.sources.elasticsearch, SOURCE)
    if not getattr(source, "has_api", True):
        # Slow-log-only mode: no cluster to ask, so the API checks are skipped, not failed.
        raise SourceNotConfigured(SOURCE)
    runner = {
        "hot_threads": _hot_threads,
        "heap": _heap,
        "thread_pool_rejections": _thread_pool_rejections,
        "shard_sizing": _shard_sizing,
        "fielddata_text": _fielddata_text,
        "node_stats": _node_stats,
    }[params.check]
    return await runner(params, source)


def _gib(value: float) -> str:
    return f"{value / GB:.1f} GiB"


async def _hot_threads(params: EsParams, source: Any) -> CheckResult:
    nodes = await source.hot_threads(threads=params.threads, interval_ms=params.interval_ms)
    if isinstance(nodes, SourceError):
        return nodes
    query = f"GET _nodes/hot_threads?threads={params.threads}&interval={params.interval_ms}ms"
    evidence = []
    for share in pool_shares(nodes):
        if (
            share.group not in params.groups
            or share.share < params.min_share
            or share.percent < params.min_percent
        ):
            continue
        evidence.append(
            Evidence(
                source=SOURCE,
                query=query,
                labels={"node": share.node, "pool": share.group, "busiest_thread": share.busiest_thread},
                value=share.share,
                threshold=params.min_share,
                detail=(
                    f"{share.threads} {share.group} thread(s) on {share.node} use {share.percent:.0f}% CPU, "
                    f"{share.share:.0%} of its hot-thread CPU; busiest '{share.busiest_thread}'"
                    + (f" in {share.top_frame}" if share.top_frame else "")
                ),
            )
        )
    return evidence


async def _heap(params: EsParams, source: Any) -> CheckResult:
    sample = await source.node_stats_sample(params.sample_s)
    if isinstance(sample, SourceError):
        return sample
    rates = {r.node: r for r in gc_rates(sample.first, sample.second, elapsed_s=sample.elapsed_s)}
    evidence = []
    for node in sample.second:
        if math.isnan(node.heap_used_percent) or node.heap_used_percent <= params.max_heap_percent:
            continue
        rate = rates.get(node.name)
        if params.require_gc_rising and (rate is None or not rate.rising):
            continue
        gc_text = (
            f"old-gen GC ran {rate.collections} time(s) in {rate.interval_s:.1f} s, taking "
            f"{rate.time_fraction:.0%} of wall time (lifetime average {rate.lifetime_time_fraction:.1%})"
            if rate is not None
            else "old-gen GC rate unknown"
        )
        evidence.append(
            Evidence(
                source=SOURCE,
                query="GET _nodes/stats/jvm (two readings)",
                labels={"node": node.name, "gc_time_share": f"{rate.time_fraction:.0%}" if rate else "?"},
                value=node.heap_used_percent,
                threshold=params.max_heap_percent,
                detail=(
                    f"{node.name}: heap {node.heap_used_percent:.0f}% used "
                    f"({_gib(node.heap_used_bytes)} of {_gib(node.heap_max_bytes)}); {gc_text}"
                ),
            )
        )
    return evidence


async def _thread_pool_rejections(params: EsParams, source: Any) -> CheckResult:
    sample = await source.node_stats_sample(params.sample_s)
    if isinstance(sample, SourceError):
        return sample
    before = {n.node_id: n for n in sample.first}
    evidence = []
    for node in sample.second:
        earlier = before.get(node.node_id)
        if earlier is None:
            continue
        for pool in params.pools:
            now, then = node.thread_pools.get(pool), earlier.thread_pools.get(pool)
            if now is None or then is None:
                continue
            grew = now.rejected - then.rejected
            if grew < params.min_rejected:
                continue
            per_s = grew / sample.elapsed_s if sample.elapsed_s > 0 else math.nan
            evidence.append(
                Evidence(
                    source=SOURCE,
                    query=f"GET _nodes/stats/thread_pool (two readings {sample.elapsed_s:.1f} s apart)",
                    labels={"node": node.name, "pool": pool},
                    value=float(grew),
                    threshold=float(params.min_rejected),
                    detail=(
                        f"{node.name} {pool} pool rejected {grew} task(s) in {sample.elapsed_s:.1f} s "
                        f"({per_s:.1f}/s); queue {now.queue}, active {now.active} of {now.threads} threads, "
                        f"{now.rejected} rejected since start"
                    ),
                )
            )
    return evidence


def _merge_records(summary: SlowlogSummary, records: list[dict[str, Any]]) -> None:
    # The index query already applied the time window.
    for record in records:
        summary.lines += 1
        entry = parse_slowlog_record(record)
        if entry is None:
            summary.unparsed_lines += 1
        else:
            summary.add(entry)


async def _expensive_query(params: EsParams, ctx: CheckContext) -> CheckResult:
    settings = ctx.settings.elasticsearch
    paths, index = list(settings.slowlog_paths), settings.slowlog_index
    if not paths and not index:
        raise SourceNotConfigured("elasticsearch slow log")
    since = ctx.at - timedelta(minutes=params.window_minutes) if params.window_minutes > 0 else None
    until = ctx.at if params.window_minutes > 0 else None
    summary = SlowlogSummary()
    queries: list[str] = []
    problems: list[str] = []
    if paths:
        queries.append("slow log files " + ", ".join(str(p) for p in paths))
        try:
            # File reading is blocking and can take seconds on big logs: keep the event loop free,
            # in a daemon thread the deadline can abandon (diagnoser.sources.base.run_blocking).
            await run_blocking(
                functools.partial(summarise_slowlog_files, paths, since=since, until=until, summary=summary)
            )
        except OSError as exc:
            problems.append(f"cannot read slow log files: {exc}")
    if index:
        queries.append(f"GET {index}/_search")
        source = ctx.require(ctx.sources.elasticsearch, SOURCE)
        records = await source.slowlog_records(
            index, since=since, until=until, max_docs=params.max_index_docs
        )
        if isinstance(records, SourceError):
            problems.append(records.message)
        else:
            _merge_records(summary, records)
    if problems and not summary.entries:
        return SourceError(source=SOURCE, message="; ".join(problems))
    wanted = set(params.anti_patterns)
    evidence = []
    for shape in summary.slowest(len(summary.shapes), with_anti_patterns=True):
        found = sorted(shape.anti_patterns & wanted)
        if not found or shape.total_ms < params.min_total_ms:
            continue
        evidence.append(
            Evidence(
                source=SOURCE,
                query=" + ".join(queries),
                labels={
                    "index": shape.index,
                    "shape_id": shape.shape_id,
                    "anti_patterns": ",".join(found),
                    "shape": shape.shape[:300],
                    "fix": "; ".join(ANTI_PATTERN_FIXES[name] for name in found),
                },
                value=shape.total_ms,
                threshold=params.min_total_ms,
                detail=(
                    f"{shape.count} slow search(es) on {shape.index} with shape {shape.shape_id} took "
                    f"{shape.total_ms / 1000:.1f} s in total (max {shape.max_ms / 1000:.1f} s, mean "
                    f"{shape.mean_ms / 1000:.1f} s): "
                    + "; ".join(f"{name}: {ANTI_PATTERNS[name]}" for name in found)
                    + f". Example: {shape.example[:300]}"
                ),
            )
        )
        if len(evidence) >= params.top:
            break
    return evidence


async def _shard_sizing(params: EsParams, source: Any) -> CheckResult:
    rows = await source.cat_shards()
    if isinstance(rows, SourceError):
        return rows
    primaries: dict[str, list[float]] = {}
    for row in rows:
        if row.get("prirep") != "p" or row.get("state") != "STARTED":
            continue
        index = str(row.get("index", ""))
        if not index or (index.startswith(".") and not params.include_hidden):
            continue
        try:
            size = float(row.get("store") or 0)
        except (TypeError, ValueError):
            continue
        primaries.setdefault(index, []).append(size)
    evidence = []
    for index in sorted(primaries):
        sizing = shard_sizing(
            index,
            primaries[index],
            min_gb=params.min_shard_gb,
            max_gb=params.max_shard_gb,
            target_gb=params.target_shard_gb,
        )
        if not sizing.problem or sizing.problem not in params.problems:
            continue
        bound = params.max_shard_gb if sizing.problem == "too_large" else params.min_shard_gb
        per_shard = sizing.primary_bytes / sizing.recommended_primaries / GB
        evidence.append(
            Evidence(
                source=SOURCE,
                query="GET _cat/shards?bytes=b",
                labels={
                    "index": index,
                    "problem": sizing.problem,
                    "primaries": str(sizing.primaries),
                    "recommended_primaries": str(sizing.recommended_primaries),
                },
                value=sizing.average_shard_gb,
                threshold=bound,
                detail=(
                    f"{index}: {sizing.primaries} primary shard(s) averaging "
                    f"{sizing.average_shard_gb:.1f} GiB (largest {sizing.largest_shard_bytes / GB:.1f} GiB, "
                    f"{sizing.primary_bytes / GB:.1f} GiB in total); {sizing.recommended_primaries} "
                    f"primaries would be about {per_shard:.1f} GiB each"
                ),
            )
        )
    return evidence


async def _fielddata_text(params: EsParams, source: Any) -> CheckResult:
    rows = await source.cat_fielddata()
    if isinstance(rows, SourceError):
        return rows
    sized: list[tuple[str, str, float]] = []
    for row in rows:
        try:
            size = float(row.get("size") or 0)
        except (TypeError, ValueError):
            continue
        if size >= params.min_fielddata_bytes and row.get("field"):
            sized.append((str(row.get("node", "")), str(row["field"]), size))
    if not sized:
        return []
    mappings = await source.field_mappings(sorted({field for _, field, _ in sized}))
    if isinstance(mappings, SourceError):
        return mappings
    evidence = []
    for node, field, size in sorted(sized, key=lambda r: -r[2]):
        text_indices = sorted(index for index, kind, _ in mappings.get(field, []) if kind == "text")
        if not text_indices:
            continue
        evidence.append(
            Evidence(
                source=SOURCE,
                query="GET _cat/fielddata?bytes=b + GET _mapping/field/" + field,
                labels={"node": node, "field": field, "indices": ",".join(text_indices)},
                value=size,
                threshold=float(params.min_fielddata_bytes),
                detail=(
                    f"{node} holds {size / 1024**2:.0f} MiB of fielddata for '{field}', a text field "
                    f"in {', '.join(text_indices)}"
                ),
            )
        )
    return evidence


async def _node_stats(params: EsParams, source: Any) -> CheckResult:
    # Both are enforced by the params validator.
    assert params.field is not None
    assert params.threshold is not None
    readings: list[tuple[str, float | None]] = []
    if params.api == "info":
        nodes = await source.node_info("process" if params.field.startswith("process.") else "_all")
        if isinstance(nodes, SourceError):
            return nodes
        readings = [
            (str(n.get("name", node_id)), field_value(n, params.field)) for node_id, n in nodes.items()
        ]
        query = "GET _nodes/" + params.field.split(".", 1)[0]
    elif params.delta:
        sample = await source.node_stats_sample(params.sample_s)
        if isinstance(sample, SourceError):
            return sample
        before = {n.node_id: n for n in sample.first}
        for node in sample.second:
            now = field_value(node.raw, params.field)
            then = field_value(before[node.node_id].raw, params.field) if node.node_id in before else None
            readings.append((node.name, now - then if now is not None and then is not None else None))
        query = f"GET _nodes/stats (growth of {params.field} over {sample.elapsed_s:.1f} s)"
    else:
        stats = await source.node_stats()
        if isinstance(stats, SourceError):
            return stats
        readings = [(n.name, field_value(n.raw, params.field)) for n in stats]
        query = "GET _nodes/stats"
    return [
        Evidence(
            source=SOURCE,
            query=query,
            labels={"node": node, "field": params.field},
            value=value,
            threshold=params.threshold,
            detail=f"{node}: {params.field} = {value:g} ({params.op} {params.threshold:g})",
        )
        for node, value in readings
        if value is not None and compare(value, params.op, params.threshold)
    ]
