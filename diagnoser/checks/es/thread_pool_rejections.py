"""``es: {check: thread_pool_rejections}``: a search or write pool rejecting work right now.

Reads node stats twice ``sample_s`` apart and holds for each node and pool in ``pools`` whose
``rejected`` counter grew by ``min_rejected`` or more between the readings: rejections now, not
the lifetime total a node accumulated since it started.
"""

from __future__ import annotations

import math

from pydantic import Field

from diagnoser.checks.es.base import SOURCE, SampledParams, api_source
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.elasticsearch.node_stats import NodeStatsSample, ThreadPoolStats

__all__ = ["ThreadPoolRejectionsParams", "thread_pool_rejections"]


class ThreadPoolRejectionsParams(SampledParams):
    check = "thread_pool_rejections"

    pools: list[str] = Field(default_factory=lambda: ["search", "write"])
    min_rejected: int = Field(default=1, ge=1)


@check_kind("es.thread_pool_rejections", params=ThreadPoolRejectionsParams, reads={"elasticsearch"})
async def thread_pool_rejections(params: ThreadPoolRejectionsParams, ctx: CheckContext) -> CheckResult:
    """One row per node and pool whose rejections grew by ``min_rejected`` or more."""
    sample = await api_source(ctx).node_stats_sample(params.sample_s)
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
            if now is None or then is None or now.rejected - then.rejected < params.min_rejected:
                continue
            evidence.append(_evidence(node.name, pool, now, now.rejected - then.rejected, sample, params))
    return evidence


def _evidence(
    node: str,
    pool: str,
    now: ThreadPoolStats,
    grew: int,
    sample: NodeStatsSample,
    params: ThreadPoolRejectionsParams,
) -> Evidence:
    per_s = grew / sample.elapsed_s if sample.elapsed_s > 0 else math.nan
    return Evidence(
        source=SOURCE,
        query=f"GET _nodes/stats/thread_pool (two readings {sample.elapsed_s:.1f} s apart)",
        labels={"node": node, "pool": pool},
        value=float(grew),
        threshold=float(params.min_rejected),
        detail=(
            f"{node} {pool} pool rejected {grew} task(s) in {sample.elapsed_s:.1f} s "
            f"({per_s:.1f}/s); queue {now.queue}, active {now.active} of {now.threads} threads, "
            f"{now.rejected} rejected since start"
        ),
    )
