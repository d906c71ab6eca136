"""``es: {check: heap}``: a node's JVM heap nearly full while old-generation GC runs more than usual.

Reads node stats twice ``sample_s`` apart (shared with the other checks asking for that
interval): heap used over ``max_heap_percent`` on the second reading and, with
``require_gc_rising`` (the default), an old-gen GC time share above the node's lifetime average,
so a heap that is full but collected calmly is not reported.
"""

from __future__ import annotations

import math

from pydantic import Field

from diagnoser.checks.es.base import SOURCE, SampledParams, api_source
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.elasticsearch.node_stats import GcRate, NodeStats, gc_rates
from diagnoser.sources.elasticsearch.shards import GB

__all__ = ["HeapParams", "heap"]


class HeapParams(SampledParams):
    check = "heap"

    max_heap_percent: float = Field(default=85.0, gt=0, le=100)
    require_gc_rising: bool = True


@check_kind("es.heap", params=HeapParams, reads={"elasticsearch"})
async def heap(params: HeapParams, ctx: CheckContext) -> CheckResult:
    """One row per node over the heap bound (with GC rising, if required)."""
    sample = await api_source(ctx).node_stats_sample(params.sample_s)
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
        evidence.append(_evidence(node, rate, params))
    return evidence


def _gib(value: float) -> str:
    return f"{value / GB:.1f} GiB"


def _evidence(node: NodeStats, rate: GcRate | None, params: HeapParams) -> Evidence:
    gc_text = (
        f"old-gen GC ran {rate.collections} time(s) in {rate.interval_s:.1f} s, taking "
        f"{rate.time_fraction:.0%} of wall time (lifetime average {rate.lifetime_time_fraction:.1%})"
        if rate is not None
        else "old-gen GC rate unknown"
    )
    return Evidence(
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
