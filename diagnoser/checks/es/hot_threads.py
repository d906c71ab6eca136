"""``es: {check: hot_threads}``: background work (merges, GC, ...) taking a node's hot-thread CPU.

Reads ``GET _nodes/hot_threads`` once and holds for each node where one of ``groups`` takes at
least ``min_share`` of the CPU its hottest threads use, and at least ``min_percent`` in absolute
terms (100 = one core), so an idle node whose top threads happen to be merges stays quiet.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from diagnoser.checks.es.base import SOURCE, EsCheckParams, api_source, only_known
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.elasticsearch.hot_threads import POOL_GROUPS, PoolShare, pool_shares

__all__ = ["HotThreadsParams", "hot_threads"]


class HotThreadsParams(EsCheckParams):
    check = "hot_threads"

    groups: list[str] = Field(default_factory=lambda: ["merge", "gc"])
    min_share: float = Field(default=0.5, ge=0, le=1)
    min_percent: float = Field(default=50.0, ge=0)
    threads: int = Field(default=5, ge=1, le=100)
    interval_ms: int = Field(default=500, ge=10, le=10_000)

    @field_validator("groups")
    @classmethod
    def _known_groups(cls, groups: list[str]) -> list[str]:
        return only_known(groups, POOL_GROUPS, "pool group")


@check_kind("es.hot_threads", params=HotThreadsParams, reads={"elasticsearch"})
async def hot_threads(params: HotThreadsParams, ctx: CheckContext) -> CheckResult:
    """One row per node and pool group over the bounds; see the module docstring."""
    nodes = await api_source(ctx).hot_threads(threads=params.threads, interval_ms=params.interval_ms)
    if isinstance(nodes, SourceError):
        return nodes
    query = f"GET _nodes/hot_threads?threads={params.threads}&interval={params.interval_ms}ms"
    return [
        _evidence(share, query, params)
        for share in pool_shares(nodes)
        if share.group in params.groups
        and share.share >= params.min_share
        and share.percent >= params.min_percent
    ]


def _evidence(share: PoolShare, query: str, params: HotThreadsParams) -> Evidence:
    return Evidence(
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
