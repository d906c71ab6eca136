"""The ``es.<check>`` kinds, called directly on each fixture scenario: what holds, with which evidence."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnoser.checks.registry import CheckContext, check_kinds
from diagnoser.config import ElasticsearchSettings
from diagnoser.errors import SourceNotConfigured
from diagnoser.models import Evidence, SourceError
from diagnoser.ruleset import load_rules
from diagnoser.sources import Sources
from diagnoser.sources.elasticsearch import ElasticsearchSource
from tests.fixtures.es_server import EsFixtureServer

# Fixture factories from conftest.py: serve(scenario, mode) and source_for(server, **options).
ServeFactory = Callable[..., EsFixtureServer]
SourceFactory = Callable[..., ElasticsearchSource]

AT = datetime(2026, 11, 29, 21, 0, tzinfo=UTC)
CHECKS = (
    "hot_threads",
    "heap",
    "thread_pool_rejections",
    "expensive_query",
    "shard_sizing",
    "fielddata_text",
    "node_stats",
)


def _ctx(source: Any = None, **es_settings: Any) -> CheckContext:
    """A context; without a source, the one the runner would build from ``es_settings``."""
    es = ElasticsearchSettings(**es_settings)
    if source is None:
        source = ElasticsearchSource.from_settings(es)
    return CheckContext(at=AT, sources=Sources(elasticsearch=source))


async def _run(
    source: Any, check: str, ctx: CheckContext | None = None, **params: Any
) -> list[Evidence] | SourceError:
    kind = check_kinds()[f"es.{check}"]
    return await kind.run(kind.params.model_validate(params), ctx or _ctx(source))


def _rows(result: list[Evidence] | SourceError) -> list[Evidence]:
    assert not isinstance(result, SourceError), result
    return result


def test_registered_as_es_kinds() -> None:
    kinds = check_kinds()
    assert sorted(name for name in kinds if name.startswith("es.")) == sorted(f"es.{c}" for c in CHECKS)
    for check in CHECKS:
        assert kinds[f"es.{check}"].reads == ("elasticsearch",)
    # Each check validates against its own parameters, not one model for all.
    assert len({kinds[f"es.{check}"].params for check in CHECKS}) == len(CHECKS)


async def test_hot_threads_merge(serve: ServeFactory, source_for: SourceFactory) -> None:
    rows = _rows(await _run(source_for(serve("hot_threads")), "hot_threads"))
    assert len(rows) == 1
    row = rows[0]
    assert row.labels["node"] == "es-node-1"
    assert row.labels["pool"] == "merge"
    assert "Lucene Merge Thread #41" in row.labels["busiest_thread"]
    assert row.value == pytest.approx(186.3 / 198.9)
    assert row.threshold == 0.5
    assert "186% CPU" in (row.detail or "")
    assert row.query.startswith("GET _nodes/hot_threads")


async def test_hot_threads_search_saturation_is_not_background_work(
    serve: ServeFactory, source_for: SourceFactory
) -> None:
    source = source_for(serve("thread_pool_rejection"))
    assert _rows(await _run(source, "hot_threads")) == []
    rows = _rows(await _run(source, "hot_threads", groups=["search"]))
    assert [(r.labels["node"], r.labels["pool"]) for r in rows] == [("es-node-1", "search")]


async def test_heap_pressure(serve: ServeFactory, source_for: SourceFactory) -> None:
    rows = _rows(await _run(source_for(serve("heap_pressure")), "heap", sample_s=0.5))
    assert [r.labels["node"] for r in rows] == ["es-node-2"]
    assert rows[0].value == 93.0
    assert rows[0].threshold == 85.0
    assert "heap 93% used (14.9 GiB of 16.0 GiB)" in (rows[0].detail or "")
    assert "old-gen GC ran" in (rows[0].detail or "")
    share = float(rows[0].labels["gc_time_share"].rstrip("%")) / 100
    assert 0.3 < share < 1.0  # the fixture burns 60 % of wall time in old GC


async def test_heap_without_gc_rising_requirement(serve: ServeFactory, source_for: SourceFactory) -> None:
    source = source_for(serve("healthy"))
    assert _rows(await _run(source, "heap", sample_s=0.0)) == []
    rows = _rows(await _run(source, "heap", sample_s=0.0, max_heap_percent=50, require_gc_rising=False))
    assert [(r.labels["node"], r.value) for r in rows] == [("es-node-2", 51.0)]


async def test_thread_pool_rejections(serve: ServeFactory, source_for: SourceFactory) -> None:
    rows = _rows(
        await _run(source_for(serve("thread_pool_rejection")), "thread_pool_rejections", sample_s=0.5)
    )
    assert [(r.labels["node"], r.labels["pool"]) for r in rows] == [("es-node-1", "search")]
    assert rows[0].value is not None
    assert rows[0].value >= 10  # 40 rejections per second in the fixture
    assert "queue 1000" in (rows[0].detail or "")


async def test_shard_sizing(serve: ServeFactory, source_for: SourceFactory) -> None:
    rows = _rows(await _run(source_for(serve("shard_sizing")), "shard_sizing"))
    by_index = {r.labels["index"]: r for r in rows}
    assert set(by_index) == {"events", "metrics-tiny"}
    assert by_index["events"].labels["problem"] == "too_large"
    assert by_index["events"].labels["recommended_primaries"] == "6"
    assert by_index["events"].value == pytest.approx(182.0)
    assert by_index["events"].threshold == 50.0
    assert by_index["metrics-tiny"].labels["problem"] == "too_small"
    assert by_index["metrics-tiny"].labels["primaries"] == "30"
    assert by_index["metrics-tiny"].labels["recommended_primaries"] == "1"
    only_large = _rows(await _run(source_for(serve("shard_sizing")), "shard_sizing", problems=["too_large"]))
    assert [r.labels["index"] for r in only_large] == ["events"]


async def test_fielddata_on_text(serve: ServeFactory, source_for: SourceFactory) -> None:
    rows = _rows(await _run(source_for(serve("fielddata_text")), "fielddata_text"))
    assert [(r.labels["node"], r.labels["field"], r.labels["indices"]) for r in rows] == [
        ("es-node-1", "message", "orders-2026.11"),
        ("es-node-2", "message", "orders-2026.11"),
    ]
    assert rows[0].value == 1650 * 1024**2
    assert "1650 MiB" in (rows[0].detail or "")


async def test_expensive_query_from_files(es_fixtures: Path) -> None:
    ctx = _ctx(None, slowlog_paths=[es_fixtures / "slowlog" / "prod-search_index_search_slowlog.json"])
    rows = _rows(await _run(None, "expensive_query", ctx))
    assert [(r.labels["index"], r.labels["anti_patterns"]) for r in rows] == [
        ("products", "leading_wildcard"),
        ("orders-2026.11", "deep_pagination"),
        ("products", "script"),
    ]
    assert rows[0].value is not None
    assert rows[0].value > 10_000
    assert (
        rows[0]
        .labels["shape"]
        .startswith('{"size":"?","query":{"bool":{"must":[{"query_string":{"query":"?"')
    )
    assert "6 slow search(es) on products" in (rows[0].detail or "")
    top_one = _rows(await _run(None, "expensive_query", ctx, top=1, anti_patterns=["deep_pagination"]))
    assert [r.labels["anti_patterns"] for r in top_one] == ["deep_pagination"]


async def test_expensive_query_from_the_index(serve: ServeFactory, source_for: SourceFactory) -> None:
    source = source_for(serve("expensive_query"), slowlog_index="slowlogs-*")
    rows = _rows(await _run(source, "expensive_query"))
    assert [(r.labels["index"], r.labels["anti_patterns"]) for r in rows] == [
        ("logs-app", "regexp,track_total_hits")
    ]
    assert rows[0].query == "GET slowlogs-*/_search"


async def test_expensive_query_window(es_fixtures: Path) -> None:
    path = es_fixtures / "slowlog" / "prod-search_index_search_slowlog.json"
    # The fixture's entries are from 20:30-20:33; a 10-minute window before 21:00 excludes them.
    ctx = _ctx(None, slowlog_paths=[path])
    assert _rows(await _run(None, "expensive_query", ctx, window_minutes=10)) == []
    assert _rows(await _run(None, "expensive_query", ctx, window_minutes=60))


async def test_expensive_query_needs_a_slow_log(serve: ServeFactory, source_for: SourceFactory) -> None:
    with pytest.raises(SourceNotConfigured):
        await _run(None, "expensive_query")
    # A cluster without slow log files or index: the rule is skipped, the cluster is not asked.
    server = serve("expensive_query")
    with pytest.raises(SourceNotConfigured):
        await _run(source_for(server), "expensive_query")
    assert server.requests == []


async def test_unreadable_slowlog_is_a_source_error(tmp_path: Path) -> None:
    broken = tmp_path / "x_index_search_slowlog.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    result = await _run(None, "expensive_query", _ctx(None, slowlog_paths=[tmp_path]))
    assert isinstance(result, SourceError)
    assert "cannot read slow log files" in result.message


async def test_node_stats_bounds(serve: ServeFactory, source_for: SourceFactory) -> None:
    source = source_for(serve("memory_lock"))
    unlocked = _rows(
        await _run(source, "node_stats", api="info", field="process.mlockall", op="==", threshold=0)
    )
    assert [r.labels["node"] for r in unlocked] == ["es-node-2"]
    swapping = _rows(await _run(source, "node_stats", field="os.swap.used_in_bytes", op=">", threshold=0))
    assert [(r.labels["node"], r.value) for r in swapping] == [("es-node-2", float(1024**3))]
    io = _rows(
        await _run(source, "node_stats", field="fs.io_stats.total.io_time_in_millis", op=">", threshold=1)
    )
    assert len(io) == 2
    assert _rows(await _run(source, "node_stats", field="no.such.field", op=">", threshold=0)) == []


async def test_node_stats_delta(serve: ServeFactory, source_for: SourceFactory) -> None:
    source = source_for(serve("heap_pressure"))
    rows = _rows(
        await _run(
            source,
            "node_stats",
            field="jvm.gc.collectors.old.collection_count",
            delta=True,
            threshold=0,
            sample_s=0.5,
        )
    )
    assert [r.labels["node"] for r in rows] == ["es-node-2"]
    assert "growth of" in rows[0].query


@pytest.mark.parametrize(
    ("check", "params"),
    [
        ("hot_threads", {}),
        ("heap", {"sample_s": 0.0}),
        ("thread_pool_rejections", {"sample_s": 0.0}),
        ("shard_sizing", {}),
        ("fielddata_text", {}),
        ("node_stats", {"field": "jvm.mem.heap_used_percent", "threshold": 85}),
    ],
)
async def test_healthy_cluster_holds_nothing(
    serve: ServeFactory, source_for: SourceFactory, check: str, params: dict[str, Any]
) -> None:
    assert _rows(await _run(source_for(serve("healthy")), check, **params)) == []


async def test_healthy_slowlog_holds_nothing(es_fixtures: Path) -> None:
    ctx = _ctx(None, slowlog_paths=[es_fixtures / "slowlog" / "healthy_index_search_slowlog.json"])
    assert _rows(await _run(None, "expensive_query", ctx)) == []


@pytest.mark.parametrize(
    "check", ["hot_threads", "heap", "thread_pool_rejections", "shard_sizing", "fielddata_text"]
)
async def test_unauthorized_cluster_gives_source_error(
    serve: ServeFactory, source_for: SourceFactory, check: str
) -> None:
    params: dict[str, Any] = {"sample_s": 0.0} if check in ("heap", "thread_pool_rejections") else {}
    result = await _run(source_for(serve("healthy", "403")), check, None, **params)
    assert isinstance(result, SourceError)
    assert "HTTP 403" in result.message


async def test_api_checks_are_skipped_in_slowlog_only_mode(tmp_path: Path) -> None:
    source = ElasticsearchSource([])
    with pytest.raises(SourceNotConfigured):
        await _run(source, "hot_threads")
    with pytest.raises(SourceNotConfigured):
        await _run(None, "shard_sizing")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"check": "heap", "groups": ["merge"]}, "does not take ['groups']"),
        ({"check": "hot_threads", "groups": ["mergez"]}, "unknown pool group"),
        ({"check": "expensive_query", "anti_patterns": ["slow"]}, "unknown anti-pattern"),
        ({"check": "node_stats", "field": "a.b"}, "needs 'field' and 'threshold'"),
        ({"check": "node_stats", "field": "a", "threshold": 1, "api": "info", "delta": True}, "'delta'"),
        ({"check": "shard_sizing", "min_shard_gb": 60}, "min_shard_gb <= target_shard_gb"),
        ({"check": "nope"}, "check"),
        ({"check": "heap", "extra": 1}, "extra"),
        ({"check": "hot_threads", "min_share": 2}, "min_share"),
    ],
)
def test_params_validation(tmp_path: Path, params: dict[str, Any], message: str) -> None:
    # Through the rule loader: what a rule author sees for a bad ``es:`` condition.
    rule = {
        "cause": "es_heap_pressure",
        "severity": "warning",
        "title": "t",
        "summary": "s",
        "when": [{"es": params}],
    }
    (tmp_path / "elasticsearch").mkdir()
    (tmp_path / "elasticsearch" / "bad.yaml").write_text(yaml.safe_dump(rule))
    ruleset = load_rules([tmp_path], include_builtin=False)
    assert not ruleset.rules
    assert len(ruleset.problems) == 1
    assert message in str(ruleset.problems[0])
