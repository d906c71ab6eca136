"""``es: {check: node_stats}``: any node stats or node info field compared with a threshold.

``field`` is a dotted path in a node's ``GET _nodes/stats`` object (``os.swap.used_in_bytes``),
or in ``GET _nodes`` with ``api: info`` (``process.mlockall``); with ``delta: true`` the value
is the field's growth between two readings ``sample_s`` apart. Holds for each node whose value
compares ``op`` ``threshold``; a node without the field is left out.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from diagnoser.checks.comparison import Comparison, compare
from diagnoser.checks.es.base import SOURCE, SampledParams, api_source
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.elasticsearch import ElasticsearchSource
from diagnoser.sources.elasticsearch.node_stats import field_value

__all__ = ["NodeStatsParams", "node_stats"]

#: ``(node name, value)`` for every node, ``None`` where the field is missing.
Readings = list[tuple[str, float | None]]


class NodeStatsParams(SampledParams):
    check = "node_stats"

    field: str | None = None
    op: Comparison = ">"
    threshold: float | None = None
    api: Literal["stats", "info"] = "stats"
    delta: bool = False

    @model_validator(mode="after")
    def _field_and_threshold(self) -> NodeStatsParams:
        if not self.field or self.threshold is None:
            raise ValueError("check 'node_stats' needs 'field' and 'threshold'")
        if self.delta and self.api == "info":
            raise ValueError("'delta' applies to node stats counters, not node info")
        return self


@check_kind("es.node_stats", params=NodeStatsParams, reads={"elasticsearch"})
async def node_stats(params: NodeStatsParams, ctx: CheckContext) -> CheckResult:
    """One row per node whose value compares ``op`` ``threshold``."""
    # Both are enforced by the params validator.
    assert params.field is not None
    assert params.threshold is not None
    source = api_source(ctx)
    if params.api == "info":
        read = await _info(source, params.field)
    elif params.delta:
        read = await _growth(source, params.field, params.sample_s)
    else:
        read = await _stats(source, params.field)
    if isinstance(read, SourceError):
        return read
    query, readings = read
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


async def _info(source: ElasticsearchSource, field: str) -> tuple[str, Readings] | SourceError:
    nodes = await source.node_info("process" if field.startswith("process.") else "_all")
    if isinstance(nodes, SourceError):
        return nodes
    readings = [(str(n.get("name", node_id)), field_value(n, field)) for node_id, n in nodes.items()]
    return "GET _nodes/" + field.split(".", 1)[0], readings


async def _growth(
    source: ElasticsearchSource, field: str, sample_s: float
) -> tuple[str, Readings] | SourceError:
    sample = await source.node_stats_sample(sample_s)
    if isinstance(sample, SourceError):
        return sample
    before = {n.node_id: n for n in sample.first}
    readings: Readings = []
    for node in sample.second:
        now = field_value(node.raw, field)
        then = field_value(before[node.node_id].raw, field) if node.node_id in before else None
        readings.append((node.name, now - then if now is not None and then is not None else None))
    return f"GET _nodes/stats (growth of {field} over {sample.elapsed_s:.1f} s)", readings


async def _stats(source: ElasticsearchSource, field: str) -> tuple[str, Readings] | SourceError:
    stats = await source.node_stats()
    if isinstance(stats, SourceError):
        return stats
    return "GET _nodes/stats", [(n.name, field_value(n.raw, field)) for n in stats]
