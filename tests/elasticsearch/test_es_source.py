"""ElasticsearchSource against the fixture cluster: real client, real HTTP, real wire format."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable

import pytest
from elasticsearch import AsyncElasticsearch, BadRequestError

from diagnoser.config import ElasticsearchSettings
from diagnoser.models import SourceError
from diagnoser.sources.elasticsearch import ElasticsearchSource
from diagnoser.sources.elasticsearch.hot_threads import HotThreadsNode
from tests.fixtures.es_server import EsFixtureServer, closed_port_url

# Fixture factories from conftest.py: serve(scenario, mode) and source_for(server, **options).
ServeFactory = Callable[..., EsFixtureServer]
SourceFactory = Callable[..., ElasticsearchSource]


async def test_hot_threads_parsed(serve: ServeFactory, source_for: SourceFactory) -> None:
    server = serve("hot_threads")
    nodes = await source_for(server).hot_threads(threads=5)
    assert not isinstance(nodes, SourceError)
    assert [n.name for n in nodes] == ["es-node-1", "es-node-2"]
    assert all(isinstance(n, HotThreadsNode) for n in nodes)
    assert nodes[0].threads[0].group == "merge"
    method, path, headers = server.requests[-1]
    assert method == "GET"
    assert path.startswith("/_nodes/hot_threads?")
    assert "threads=5" in path
    assert "interval=500ms" in path
    assert headers["accept"] == "text/plain"


async def test_node_stats_and_info(serve: ServeFactory, source_for: SourceFactory) -> None:
    server = serve("healthy")
    source = source_for(server)
    stats = await source.node_stats()
    assert not isinstance(stats, SourceError)
    assert [n.name for n in stats] == ["es-node-1", "es-node-2"]
    assert stats[0].heap_used_percent == 47.0
    assert stats[0].heap_max_bytes == 16 * 1024**3
    assert stats[0].thread_pools["search"].threads == 13
    assert stats[0].breakers_tripped["parent"] == 0
    assert stats[0].io_operations > 0
    # Only the metrics diagnoser reads are requested, with JSON in the 8.x-compatible media type.
    _, path, headers = server.requests[-1]
    assert path == "/_nodes/stats/jvm,thread_pool,breakers,os,process,fs,indices/fielddata"
    assert headers["accept"] == "application/vnd.elasticsearch+json; compatible-with=8"
    assert set(stats[0].raw) >= {"jvm", "thread_pool", "breakers", "os", "process", "fs", "indices"}
    assert set(stats[0].raw["indices"]) == {"fielddata"}
    info = await source.node_info("process")
    assert not isinstance(info, SourceError)
    assert [n["process"]["mlockall"] for n in info.values()] == [True, True]


async def test_cat_apis_and_mappings(serve: ServeFactory, source_for: SourceFactory) -> None:
    server = serve("fielddata_text")
    source = source_for(server)
    shards = await source.cat_shards()
    fielddata = await source.cat_fielddata()
    for rows in (shards, fielddata):
        assert not isinstance(rows, SourceError)
        assert rows
    assert not isinstance(shards, SourceError)
    assert {r["prirep"] for r in shards} == {"p", "r"}
    assert any("format=json" in p and "bytes=b" in p for p in server.paths() if p.startswith("/_cat/shards"))
    mappings = await source.field_mappings(["message", "customer_id"])
    assert mappings == {
        "message": [("orders-2026.11", "text", True)],
        "customer_id": [("orders-2026.11", "keyword", False), ("products", "keyword", False)],
    }


async def test_slowlog_index_documents(serve: ServeFactory, source_for: SourceFactory) -> None:
    server = serve("expensive_query")
    records = await source_for(server).slowlog_records("slowlogs-*", max_docs=100)
    assert not isinstance(records, SourceError)
    assert len(records) == 6
    assert records[-1]["elasticsearch"]["index"]["name"] == "logs-app"
    missing = await source_for(server).slowlog_records("nothing-here")
    assert isinstance(missing, SourceError)
    assert "HTTP 404" in missing.message
    assert "index_not_found_exception" in missing.message


async def test_works_against_a_9x_server_too(serve: ServeFactory, source_for: SourceFactory) -> None:
    nodes = await source_for(serve("healthy", server_major=9)).node_stats()
    assert not isinstance(nodes, SourceError)
    assert len(nodes) == 2


async def test_default_9x_client_media_type_is_refused_by_8x(serve: ServeFactory) -> None:
    # Why the source pins compatible-with=8: the client's own default would fail on 8.x servers.
    server = serve("healthy")
    client = AsyncElasticsearch(server.url, max_retries=0)
    try:
        with pytest.raises(BadRequestError, match="media_type_header_exception"):
            await client.cluster.health()
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("mode", "fragments"),
    [
        (
            "401",
            ["HTTP 401", "authentication failed", "security_exception", "missing authentication credentials"],
        ),
        ("403", ["HTTP 403", "'monitor' cluster privilege", "is unauthorized for user [diagnoser]"]),
        ("429", ["HTTP 429", "too many requests", "es_rejected_execution_exception"]),
        ("500", ["HTTP 500", "server error: null_pointer_exception"]),
        ("503", ["HTTP 503", "server error", "master_not_discovered_exception"]),
        ("non_json", ["not valid JSON"]),
        ("html", ["GET /_nodes/stats", "non-JSON body", "<html>"]),
        ("no_product", ["not Elasticsearch"]),
    ],
)
async def test_failures_become_source_errors(
    serve: ServeFactory, source_for: SourceFactory, mode: str, fragments: list[str]
) -> None:
    server = serve("healthy", mode)
    result = await source_for(server).node_stats()
    assert isinstance(result, SourceError)
    assert result.source == "elasticsearch"
    for fragment in fragments:
        assert fragment in result.message
    assert len(server.requests) == 1  # no retries that multiply load


async def test_every_method_fails_softly(serve: ServeFactory, source_for: SourceFactory) -> None:
    source = source_for(serve("healthy", "403"))
    calls = [
        source.hot_threads(),
        source.node_stats(),
        source.node_stats_sample(0.0),
        source.node_info(),
        source.cat_shards(),
        source.cat_fielddata(),
        source.field_mappings(["x"]),
        source.slowlog_records("slowlogs-*"),
    ]
    results = await asyncio.gather(*calls)
    assert all(isinstance(r, SourceError) and "HTTP 403" in r.message for r in results)


async def test_connection_refused(source_for: SourceFactory) -> None:
    result = await source_for(closed_port_url()).hot_threads()
    assert isinstance(result, SourceError)
    assert "cannot connect" in result.message


async def test_slow_server_times_out_once(serve: ServeFactory, source_for: SourceFactory) -> None:
    server = serve("healthy", "slow")
    server.slow_s = 8.0  # far later than the timeout, so the bound below holds on a busy machine too
    started = time.monotonic()
    result = await source_for(server, timeout_s=0.5).node_stats()
    assert isinstance(result, SourceError)
    assert "timed out after 0.5s" in result.message
    assert time.monotonic() - started < 4
    assert len(server.requests) == 1


async def test_concurrent_samples_share_one_pair_of_readings(
    serve: ServeFactory, source_for: SourceFactory
) -> None:
    server = serve("thread_pool_rejection")
    source = source_for(server)
    samples = await asyncio.gather(*(source.node_stats_sample(0.3) for _ in range(4)))
    assert all(s is samples[0] for s in samples)
    assert not isinstance(samples[0], SourceError)
    assert 0.3 <= samples[0].elapsed_s < 1.5
    assert sum(p.startswith("/_nodes/stats") for p in server.paths()) == 2
    first = samples[0].first[0].thread_pools["search"].rejected
    second = samples[0].second[0].thread_pools["search"].rejected
    assert second > first


async def test_api_key_and_basic_auth_headers(serve: ServeFactory, source_for: SourceFactory) -> None:
    server = serve("healthy")
    await source_for(server, api_key="a2V5OnNlY3JldA==").node_stats()
    assert server.requests[-1][2]["authorization"] == "ApiKey a2V5OnNlY3JldA=="
    await source_for(server, username="diagnoser", password="s3cret").node_stats()
    expected = base64.b64encode(b"diagnoser:s3cret").decode()
    assert server.requests[-1][2]["authorization"] == f"Basic {expected}"


def test_from_settings() -> None:
    assert ElasticsearchSource.from_settings(ElasticsearchSettings()) is None
    source = ElasticsearchSource.from_settings(
        ElasticsearchSettings(urls=["http://127.0.0.1:1"], api_key="k", timeout_s=3, verify_certs=False)
    )
    assert source is not None
    assert (source.urls, source.timeout_s, source.has_api) == (["http://127.0.0.1:1"], 3.0, True)
    files_only = ElasticsearchSource.from_settings(ElasticsearchSettings(slowlog_paths=["/tmp/x"]))
    assert files_only is not None
    assert files_only.has_api is False


async def test_source_without_urls_answers_with_an_error() -> None:
    source = ElasticsearchSource([])
    result = await source.node_stats()
    assert isinstance(result, SourceError)
    assert "no Elasticsearch URL" in result.message
    await source.aclose()


async def test_client_follows_the_event_loop(serve: ServeFactory) -> None:
    # A daemon may run each diagnosis in a fresh loop: the source must not reuse a dead session.
    server = serve("healthy")
    source = ElasticsearchSource([server.url], timeout_s=2)

    def run_once() -> object:
        async def go() -> object:
            try:
                return await source.node_stats()
            finally:
                await source.aclose()

        return asyncio.run(go())

    first = await asyncio.to_thread(run_once)
    second = await asyncio.to_thread(run_once)
    assert not isinstance(first, SourceError)
    assert not isinstance(second, SourceError)
