"""Fixtures for the Elasticsearch tests: fixture clusters on free ports and sources pointed at them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnoser.sources.elasticsearch import ElasticsearchSource
from tests.fixtures.es_server import FIXTURES, EsFixtureServer

ServeFactory = Callable[..., EsFixtureServer]
SourceFactory = Callable[..., ElasticsearchSource]


@pytest.fixture
def es_fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def serve() -> Iterator[ServeFactory]:
    """``serve(scenario, mode=None, **options)`` starts a fixture cluster; all stop after the test."""
    started: list[EsFixtureServer] = []

    def start(scenario: str = "healthy", mode: str | None = None, **options: Any) -> EsFixtureServer:
        server = EsFixtureServer(scenario, mode, **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
async def source_for() -> AsyncIterator[SourceFactory]:
    """``source_for(url_or_server, **options)``: an ElasticsearchSource, closed after the test."""
    made: list[ElasticsearchSource] = []

    def make(target: EsFixtureServer | str, **options: Any) -> ElasticsearchSource:
        url = target.url if isinstance(target, EsFixtureServer) else target
        options.setdefault("timeout_s", 2.0)
        source = ElasticsearchSource([url], **options)
        made.append(source)
        return source

    yield make
    for source in made:
        await source.aclose()
