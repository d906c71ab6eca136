"""Shard sizing arithmetic and the node stats view (parsing, GC rates, field lookup)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from diagnoser.sources.elasticsearch.node_stats import field_value, gc_rates, parse_node_stats
from diagnoser.sources.elasticsearch.shards import GB, recommend_shard_count, shard_sizing


@pytest.mark.parametrize(
    ("size_gb", "count"),
    [(0, 1), (3, 1), (44, 1), (46, 2), (60, 2), (182, 6), (1000, 33), (101, 3)],
)
def test_recommend_shard_count(size_gb: float, count: int) -> None:
    assert recommend_shard_count(size_gb * GB) == count
    assert size_gb * GB / count <= 50 * GB


def test_recommendation_never_leaves_shards_above_the_ceiling() -> None:
    # round(100/60) = 2 shards of 50+ GB with a high target: one more shard keeps them under 50.
    assert recommend_shard_count(101 * GB, target_gb=60) == 3


@pytest.mark.parametrize(
    ("sizes_gb", "problem", "recommended"),
    [
        ([182], "too_large", 6),
        ([24, 25, 23], "", 2),
        ([0.3] * 30, "too_small", 1),
        ([2], "", 1),  # small index with one shard: fine
        ([5, 5], "too_small", 1),
        ([40, 55], "too_large", 3),
    ],
)
def test_shard_sizing(sizes_gb: list[float], problem: str, recommended: int) -> None:
    sizing = shard_sizing("idx", [s * GB for s in sizes_gb])
    assert sizing.problem == problem
    assert sizing.recommended_primaries == recommended
    assert sizing.primaries == len(sizes_gb)
    assert sizing.average_shard_gb == pytest.approx(sum(sizes_gb) / len(sizes_gb))


def _node(name: str, ts: int, old_count: int, old_ms: int, uptime: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "timestamp": ts,
        "jvm": {
            "uptime_in_millis": uptime,
            "mem": {"heap_used_percent": 91, "heap_used_in_bytes": 91, "heap_max_in_bytes": 100},
            "gc": {
                "collectors": {
                    "old": {"collection_count": old_count, "collection_time_in_millis": old_ms},
                    "young": {"collection_count": 5, "collection_time_in_millis": 50},
                }
            },
        },
        "thread_pool": {"search": {"threads": 13, "queue": 7, "active": 13, "rejected": 4, "completed": 9}},
        "breakers": {"parent": {"tripped": 2}},
        **extra,
    }


def test_parse_node_stats_reads_the_fields() -> None:
    body = {"nodes": {"id1": _node("n1", 1000, 3, 30, 10_000, process={"mlockall": True})}}
    (node,) = parse_node_stats(body)
    assert (node.node_id, node.name, node.heap_used_percent, node.old_gc_count, node.old_gc_time_ms) == (
        "id1",
        "n1",
        91.0,
        3,
        30,
    )
    assert node.thread_pools["search"].rejected == 4
    assert node.breakers_tripped == {"parent": 2}
    assert node.fielddata_bytes == 0  # absent fields read as 0
    assert field_value(node.raw, "jvm.mem.heap_used_percent") == 91.0
    assert field_value(node.raw, "process.mlockall") == 1.0
    assert field_value(node.raw, "jvm.nope") is None


@pytest.mark.parametrize("body", [{}, [], None, {"nodes": []}, "text"])
def test_parse_node_stats_rejects_other_bodies(body: Any) -> None:
    with pytest.raises(ValueError, match="nodes"):
        parse_node_stats(body)


def test_missing_heap_percent_is_nan() -> None:
    (node,) = parse_node_stats({"nodes": {"x": {"name": "x"}}})
    assert math.isnan(node.heap_used_percent)


def test_gc_rates_rising_and_flat() -> None:
    first = parse_node_stats(
        {
            "nodes": {
                "a": _node("a", 1_000, 10, 1_000, 1_000_000),
                "b": _node("b", 1_000, 10, 1_000, 1_000_000),
            }
        }
    )
    second = parse_node_stats(
        {
            "nodes": {
                "a": _node("a", 3_000, 14, 2_200, 1_002_000),
                "b": _node("b", 3_000, 10, 1_000, 1_002_000),
            }
        }
    )
    rates = {r.node: r for r in gc_rates(first, second)}
    assert rates["a"].collections == 4
    assert rates["a"].interval_s == 2.0
    assert rates["a"].time_fraction == pytest.approx(1_200 / 2_000)
    assert rates["a"].lifetime_time_fraction == pytest.approx(2_200 / 1_002_000)
    assert rates["a"].rising
    assert rates["b"].collections == 0
    assert not rates["b"].rising


def test_gc_rates_fall_back_to_measured_interval() -> None:
    first = parse_node_stats({"nodes": {"a": _node("a", 0, 1, 100, 1_000)}})
    second = parse_node_stats({"nodes": {"a": _node("a", 0, 2, 600, 2_000)}})
    assert gc_rates(first, second) == []
    (rate,) = gc_rates(first, second, elapsed_s=1.0)
    assert rate.time_fraction == pytest.approx(0.5)
