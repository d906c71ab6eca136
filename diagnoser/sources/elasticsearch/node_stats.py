"""Typed view of ``GET _nodes/stats`` and rates between two samples of it.

Node stats counters (old-gen GC count and time, thread pool ``rejected``, breaker ``tripped``)
only grow, so a single reading says what happened since the node started. diagnoser samples the
API twice a short interval apart and reports the difference: what is happening *now*. The
lifetime average (counter / uptime) is kept beside it, so "rising" means the recent rate is above
the node's own long-run rate. Sampling costs a couple of seconds per diagnosis but is the only way
to tell a node that struggled last week from one struggling at this moment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GcRate",
    "NodeStats",
    "NodeStatsSample",
    "ThreadPoolStats",
    "field_value",
    "gc_rates",
    "parse_node_stats",
]


@dataclass(frozen=True)
class ThreadPoolStats:
    threads: int = 0
    queue: int = 0
    active: int = 0
    rejected: int = 0
    completed: int = 0


@dataclass(frozen=True)
class NodeStats:
    """The numbers diagnoser reads from one node's stats, plus the raw object for field bounds."""

    node_id: str
    name: str
    timestamp_ms: int
    uptime_ms: int
    heap_used_percent: float
    heap_used_bytes: int
    heap_max_bytes: int
    old_gc_count: int
    old_gc_time_ms: int
    young_gc_count: int
    young_gc_time_ms: int
    thread_pools: Mapping[str, ThreadPoolStats]
    breakers_tripped: Mapping[str, int]
    fielddata_bytes: int
    fielddata_evictions: int
    swap_used_bytes: int
    swap_total_bytes: int
    io_operations: int
    io_time_ms: int
    raw: Mapping[str, Any] = field(repr=False, default_factory=dict)


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return 0


def _float(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return math.nan


def parse_node_stats(body: Any) -> list[NodeStats]:
    """Parse a ``_nodes/stats`` response; a missing field reads as 0 (NaN for heap percent).

    Raises ``ValueError`` when the body is not a node stats response at all.
    """
    nodes = _get(body, "nodes")
    if not isinstance(nodes, Mapping):
        raise ValueError("not a node stats response: no 'nodes' object")
    parsed: list[NodeStats] = []
    for node_id, node in nodes.items():
        if not isinstance(node, Mapping):
            continue
        pools_raw = _get(node, "thread_pool")
        pools = {
            name: ThreadPoolStats(
                threads=_int(_get(p, "threads")),
                queue=_int(_get(p, "queue")),
                active=_int(_get(p, "active")),
                rejected=_int(_get(p, "rejected")),
                completed=_int(_get(p, "completed")),
            )
            for name, p in (pools_raw.items() if isinstance(pools_raw, Mapping) else ())
            if isinstance(p, Mapping)
        }
        breakers_raw = _get(node, "breakers")
        breakers = {
            name: _int(_get(b, "tripped"))
            for name, b in (breakers_raw.items() if isinstance(breakers_raw, Mapping) else ())
            if isinstance(b, Mapping)
        }
        collectors = _get(node, "jvm", "gc", "collectors")
        parsed.append(
            NodeStats(
                node_id=str(node_id),
                name=str(_get(node, "name") or node_id),
                timestamp_ms=_int(_get(node, "timestamp")),
                uptime_ms=_int(_get(node, "jvm", "uptime_in_millis")),
                heap_used_percent=_float(_get(node, "jvm", "mem", "heap_used_percent")),
                heap_used_bytes=_int(_get(node, "jvm", "mem", "heap_used_in_bytes")),
                heap_max_bytes=_int(_get(node, "jvm", "mem", "heap_max_in_bytes")),
                old_gc_count=_int(_get(collectors, "old", "collection_count")),
                old_gc_time_ms=_int(_get(collectors, "old", "collection_time_in_millis")),
                young_gc_count=_int(_get(collectors, "young", "collection_count")),
                young_gc_time_ms=_int(_get(collectors, "young", "collection_time_in_millis")),
                thread_pools=pools,
                breakers_tripped=breakers,
                fielddata_bytes=_int(_get(node, "indices", "fielddata", "memory_size_in_bytes")),
                fielddata_evictions=_int(_get(node, "indices", "fielddata", "evictions")),
                swap_used_bytes=_int(_get(node, "os", "swap", "used_in_bytes")),
                swap_total_bytes=_int(_get(node, "os", "swap", "total_in_bytes")),
                io_operations=_int(_get(node, "fs", "io_stats", "total", "operations")),
                io_time_ms=_int(_get(node, "fs", "io_stats", "total", "io_time_in_millis")),
                raw=node,
            )
        )
    return parsed


def field_value(node: Mapping[str, Any], dotted: str) -> float | None:
    """A numeric (or boolean, as 0/1) field of a node object by dotted path.

    ``jvm.mem.heap_used_percent`` in node stats, ``process.mlockall`` in node info.
    """
    value = _get(node, *dotted.split("."))
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return None



@dataclass(frozen=True)
class NodeStatsSample:
    """Two node stats readings ``elapsed_s`` apart: the basis of every rate diagnoser reports."""

    first: list[NodeStats]
    second: list[NodeStats]
    elapsed_s: float


@dataclass(frozen=True)
class GcRate:
    """Old-generation GC of one node: recent (between samples) and lifetime rates."""

    node: str
    interval_s: float
    collections: int
    time_fraction: float  # GC ms per wall ms during the interval
    lifetime_time_fraction: float  # GC ms per wall ms since the JVM started

    @property
    def rising(self) -> bool:
        return self.collections > 0 and self.time_fraction > self.lifetime_time_fraction


def gc_rates(first: list[NodeStats], second: list[NodeStats], *, elapsed_s: float = 0.0) -> list[GcRate]:
    """Old-gen GC rates per node between two samples (nodes present in both).

    The node's own ``timestamp`` gives the interval; ``elapsed_s`` (measured by the caller) is
    the fallback when a node's clock did not move.
    """
    earlier = {n.node_id: n for n in first}
    rates: list[GcRate] = []
    for node in second:
        before = earlier.get(node.node_id)
        if before is None:
            continue
        wall_ms = float(node.timestamp_ms - before.timestamp_ms)
        if wall_ms <= 0:
            wall_ms = elapsed_s * 1000.0
        if wall_ms <= 0:
            continue
        gc_ms = max(0, node.old_gc_time_ms - before.old_gc_time_ms)
        rates.append(
            GcRate(
                node=node.name,
                interval_s=wall_ms / 1000.0,
                collections=max(0, node.old_gc_count - before.old_gc_count),
                time_fraction=gc_ms / wall_ms,
                lifetime_time_fraction=(node.old_gc_time_ms / node.uptime_ms) if node.uptime_ms > 0 else 0.0,
            )
        )
    return rates
