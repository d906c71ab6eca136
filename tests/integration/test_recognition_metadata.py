"""Metadata, where Prometheus has it: a live scrape of a real client_python exposition.

Prometheus serves ``/api/v1/metadata`` only for targets it scrapes now; a summary that client_python
writes with a ``# TYPE`` line is typed from it, and backfilled data has none (the recognition
of the recorded beds works from names alone: tests/integration/test_connection_limits.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry, Gauge, Summary, start_http_server

from diagnoser.config import PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.signals import load_catalogue
from diagnoser.signals.infer import Recognition
from diagnoser.signals.recognition import recognition
from diagnoser.sources.prometheus import PrometheusSource
from diagnoser.testing.processes import free_port
from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import shared_bed

pytestmark = [pytest.mark.integration, shared_bed(__name__)]


@pytest.fixture(scope="module")
def scraped() -> Iterator[str]:
    registry = CollectorRegistry()
    latency = Summary("api_latency", "Time to answer an API call.", ["code"], registry=registry)
    latency.labels(code="200").observe(0.02)
    latency.labels(code="503").observe(0.4)
    Gauge("worker_busy_threads", "Threads serving a request.", registry=registry).set(7)
    Gauge("worker_max_threads", "Threads the pool may start.", registry=registry).set(8)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        with LocalPrometheus(scrape_targets=[f"127.0.0.1:{port}"]) as prometheus:
            yield prometheus.url
    finally:
        server.shutdown()
        thread.join(timeout=5)


def _ask(url: str) -> tuple[dict[str, dict[str, str]], Recognition | SourceError]:
    async def ask() -> tuple[dict[str, dict[str, str]], Recognition | SourceError]:
        source = PrometheusSource(PrometheusSettings(url=url))
        try:
            at = datetime.now(UTC)
            metadata = await source.metadata(at)
            assert isinstance(metadata, dict)
            return metadata, await recognition(source, load_catalogue(), at, 300.0)
        finally:
            await source.aclose()

    deadline = time.monotonic() + 90
    while True:
        # The first scrape lands a few seconds after start (target discovery). Metadata has no
        # time: it can name a family whose first samples are stamped just after the instant asked
        # for, so wait until the series are there at that instant too.
        metadata, found = asyncio.run(ask())
        seen = isinstance(found, Recognition) and "api_latency" in found.families
        if ("api_latency" in metadata and seen) or time.monotonic() > deadline:
            return metadata, found
        time.sleep(0.5)


def test_a_scraped_family_is_typed_by_its_metadata_and_recognised(scraped: str) -> None:
    metadata, found = _ask(scraped)
    assert "api_latency" in metadata, f"no scrape of the target landed: {sorted(metadata)[:5]}"
    assert metadata["api_latency"] == {"type": "summary", "unit": "", "help": "Time to answer an API call."}
    assert isinstance(found, Recognition), found
    families = found.families
    assert families["api_latency"].typed_by == "metadata"
    [convention] = found.conventions
    assert convention.name == (
        "inferred (summary api_latency, server side, status label code, seconds assumed (no unit in metadata, name "
        "or buckets))"
    )
    [workers] = [r for r in found.resources if r.name == "worker threads"]
    assert (workers.used, workers.limit, workers.kind) == (
        "worker_busy_threads",
        "worker_max_threads",
        "workers",
    )
