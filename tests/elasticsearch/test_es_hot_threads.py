"""The hot threads parser on every recorded output shape, and CPU attribution by pool group."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.sources.elasticsearch.hot_threads import (
    classify_thread,
    parse_hot_threads,
    parse_time_value_ms,
    pool_shares,
)


def _sample(es_fixtures: Path, name: str) -> str:
    return (es_fixtures / "hot_threads" / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("sample", "nodes", "threads_per_node"),
    [
        ("v8_idle_two_nodes.txt", ["es-node-1", "es-node-2"], [2, 1]),
        ("v8_merge_dominant.txt", ["es-node-1", "es-node-2"], [3, 1]),
        ("v8_search_saturated.txt", ["es-node-1", "es-node-2"], [3, 1]),
        ("v8_three_nodes_mixed.txt", ["hot-0", "hot-1", "warm-0"], [4, 2, 1]),
        ("v7_write_busy.txt", ["es7-data-a"], [3]),
        ("v7_idle_empty.txt", ["es7-data-a", "es7-data-b"], [0, 0]),
        ("v8_wait_type.txt", ["es-node-1"], [1]),
    ],
)
def test_every_sample_shape_parses(
    es_fixtures: Path, sample: str, nodes: list[str], threads_per_node: list[int]
) -> None:
    parsed = parse_hot_threads(_sample(es_fixtures, sample))
    assert [n.name for n in parsed] == nodes
    assert [len(n.threads) for n in parsed] == threads_per_node
    for node in parsed:
        assert node.interval_ms == 500.0
        assert node.busiest_threads in (3, 5)
        assert node.ignore_idle_threads is True
        assert node.sampled_at[:4] in ("2021", "2024", "2026")


def test_v8_usage_line_fields(es_fixtures: Path) -> None:
    node = parse_hot_threads(_sample(es_fixtures, "v8_merge_dominant.txt"))[0]
    first = node.threads[0]
    assert first.percent == 97.9
    assert first.cpu_percent == 95.2
    assert first.other_percent == 2.7
    assert first.used_ms == 489.5
    assert first.interval_ms == 500.0
    assert first.usage_kind == "cpu"
    assert first.name == "elasticsearch[es-node-1][[orders-2026.11][2]: Lucene Merge Thread #41]"
    assert (first.group, first.pool) == ("merge", "lucene_merge")
    # Two stack blocks: 6/10 then 4/10 snapshots; the top frame is from the most frequent one.
    assert [(s.count, s.total) for s in first.stacks] == [(6, 10), (4, 10)]
    assert len(first.stacks[0].frames) == 7
    assert first.top_frame.startswith("app/org.apache.lucene.core@9.11.1/org.apache.lucene.codecs.lucene99")


def test_v8_node_header_fields(es_fixtures: Path) -> None:
    node = parse_hot_threads(_sample(es_fixtures, "v8_idle_two_nodes.txt"))[1]
    assert node.node_id == "pR8fWx2mT5nbK9c0D1e2Fh"
    assert node.host == "es-node-2"
    assert node.address == "10.0.0.12:9300"
    assert node.sampled_at == "2026-11-29T20:58:01.125Z"


def test_v7_usage_line_has_no_cpu_split(es_fixtures: Path) -> None:
    node = parse_hot_threads(_sample(es_fixtures, "v7_write_busy.txt"))[0]
    assert node.address == "10.1.0.5:9300"
    assert [(t.percent, t.cpu_percent, t.other_percent, t.group) for t in node.threads] == [
        (68.4, None, None, "write"),
        (41.2, None, None, "write"),
        (16.0, None, None, "refresh"),
    ]
    assert [(s.count, s.total) for s in node.threads[0].stacks] == [(3, 10), (7, 10)]
    assert [(s.count, s.total) for s in node.threads[1].stacks] == [(1, 1)]  # unique snapshot


def test_wait_usage_is_not_counted_as_cpu(es_fixtures: Path) -> None:
    nodes = parse_hot_threads(_sample(es_fixtures, "v8_wait_type.txt"))
    assert nodes[0].threads[0].usage_kind == "wait"
    assert pool_shares(nodes) == []
    assert [s.group for s in pool_shares(nodes, usage_kind="wait")] == ["write"]


def test_merge_share_on_the_merge_sample(es_fixtures: Path) -> None:
    shares = pool_shares(parse_hot_threads(_sample(es_fixtures, "v8_merge_dominant.txt")))
    merge = next(s for s in shares if s.node == "es-node-1" and s.group == "merge")
    assert merge.threads == 2
    assert merge.percent == pytest.approx(97.9 + 88.4)
    assert merge.share == pytest.approx((97.9 + 88.4) / (97.9 + 88.4 + 12.6))
    assert "Merge Thread #41" in merge.busiest_thread
    search = next(s for s in shares if s.node == "es-node-1" and s.group == "search")
    assert search.share == pytest.approx(12.6 / (97.9 + 88.4 + 12.6))


def test_mixed_sample_groups(es_fixtures: Path) -> None:
    shares = {
        (s.node, s.group): s
        for s in pool_shares(parse_hot_threads(_sample(es_fixtures, "v8_three_nodes_mixed.txt")))
    }
    assert set(shares) == {
        ("hot-0", "refresh"),
        ("hot-0", "flush"),
        ("hot-0", "management"),
        ("hot-0", "generic"),
        ("hot-1", "gc"),
        ("hot-1", "search"),
        ("warm-0", "other"),
    }
    assert shares[("hot-1", "gc")].share == pytest.approx(71.0 / 91.0)
    assert shares[("warm-0", "other")].share == 1.0


@pytest.mark.parametrize(
    ("name", "group", "pool"),
    [
        ("elasticsearch[node-1][search][T#3]", "search", "search"),
        ("elasticsearch[node-1][search_worker][T#1]", "search", "search_worker"),
        ("elasticsearch[node-1][write][T#12]", "write", "write"),
        ("elasticsearch[old][bulk][T#2]", "write", "bulk"),
        ("elasticsearch[es-node][[index][0]: Lucene Merge Thread #12]", "merge", "lucene_merge"),
        ("elasticsearch[n][force_merge][T#1]", "merge", "force_merge"),
        ("elasticsearch[n][refresh][T#1]", "refresh", "refresh"),
        ("elasticsearch[n][flush][T#4]", "flush", "flush"),
        ("elasticsearch[n][management][T#5]", "management", "management"),
        ("elasticsearch[n][generic][T#17]", "generic", "generic"),
        ("elasticsearch[n][transport_worker][T#2]", "other", "transport_worker"),
        ("GC Thread#0", "gc", "jvm_gc"),
        ("G1 Conc#0", "gc", "jvm_gc"),
        ("VM Thread", "gc", "jvm_gc"),
        ("main", "other", ""),
        ("", "other", ""),
    ],
)
def test_classify_thread(name: str, group: str, pool: str) -> None:
    assert classify_thread(name) == (group, pool)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500.0),
        ("446.5ms", 446.5),
        ("1s", 1000.0),
        ("1.5s", 1500.0),
        ("250micros", 0.25),
        ("2m", 120000.0),
        ("7nanos", 7e-6),
        ("ms", None),
        ("12", None),
        ("abc", None),
    ],
)
def test_parse_time_value(text: str, ms: float | None) -> None:
    assert parse_time_value_ms(text) == ms


def test_threads_without_a_node_header_go_to_unknown() -> None:
    text = (
        "   12.0% (60ms out of 500ms) cpu usage by thread 'elasticsearch[x][search][T#1]'\n"
        "     unique snapshot\n"
        "       a.b.C.d(C.java:1)\n"
    )
    nodes = parse_hot_threads(text)
    assert [n.name for n in nodes] == ["unknown"]
    assert nodes[0].threads[0].group == "search"
    assert nodes[0].threads[0].stacks[0].frames == ("a.b.C.d(C.java:1)",)


def test_windows_line_endings_and_thread_names_with_quotes() -> None:
    text = (
        "::: {n1}{id1}{eph}{h}{10.0.0.1}{10.0.0.1:9300}{d}\r\n"
        "   Hot threads at 2024-01-01T00:00:00Z, interval=1s, busiestThreads=1, ignoreIdleThreads=false:\r\n"
        "   50.0% [cpu=50.0%, other=0.0%] (500ms out of 1s) cpu usage by thread 'it's a 'thread''\r\n"
    )
    node = parse_hot_threads(text)[0]
    assert node.interval_ms == 1000.0
    assert node.ignore_idle_threads is False
    assert node.threads[0].name == "it's a 'thread'"
    assert node.threads[0].interval_ms == 1000.0
