"""The query shapes a diagnosis sends answer alike on VictoriaMetrics, a second PromQL-compatible
server (Debian's ``victoria-metrics``, MetricsQL): a query narrowed to some jobs keeps the rows of
the whole one that carry them (:func:`diagnoser.promql.restrict`), and a union of a condition's
queries splits back into each one's answer (:meth:`PrometheusSource.query_each`).

The bed is :mod:`tests.integration.test_narrowed_queries`', imported through VictoriaMetrics' own
``/api/v1/import/prometheus`` (the text format with millisecond timestamps).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import diagnoser.sources.prometheus as prometheus_source
from diagnoser.config import PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.promql import restrict
from diagnoser.sources.prometheus import PrometheusSource, Sample
from diagnoser.testing.processes import free_port
from tests.conftest import unavailable
from tests.integration.test_narrowed_queries import AT, KEPT, QUERIES, _kept, _openmetrics, _rows

pytestmark = pytest.mark.integration


def _import_lines() -> bytes:
    lines = []
    for line in _openmetrics().splitlines():
        if line.startswith("#"):
            continue
        series, value, seconds = line.rsplit(" ", 2)
        lines.append(f"{series} {value} {int(seconds) * 1000}")
    return "\n".join(lines).encode()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusSource]:
    binary = shutil.which("victoria-metrics")
    if binary is None:
        unavailable("victoria-metrics not found: install the Debian package 'victoria-metrics' (make setup does)")
    data: Path = tmp_path_factory.mktemp("victoria-metrics")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            str(binary), f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y", "-search.disableCache",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                _get(f"{url}/health")
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("victoria-metrics did not start")
                time.sleep(0.1)
        request = urllib.request.Request(f"{url}/api/v1/import/prometheus", data=_import_lines(), method="POST")
        urllib.request.urlopen(request, timeout=10).close()
        _get(f"{url}/internal/force_flush")
        source = PrometheusSource(PrometheusSettings(url=url))
        # Imported rows become searchable shortly after the flush.
        while not asyncio.run(source.query("count(pool_used)", AT, share=False)):
            if time.monotonic() > deadline:
                pytest.fail("the imported series did not become searchable")
            time.sleep(0.2)
        yield source
        source.close()
    finally:
        process.terminate()
        process.wait(timeout=10)


def _answer(source: PrometheusSource, query: str) -> list[Sample]:
    samples = asyncio.run(source.query(query, AT, share=False))
    assert not isinstance(samples, SourceError), (query, samples)
    return samples


@pytest.mark.parametrize("query", QUERIES)
def test_a_narrowed_query_answers_the_kept_rows_of_the_whole(source: PrometheusSource, query: str) -> None:
    narrowed = restrict(query, "job", KEPT)
    assert _kept(_answer(source, narrowed)) == _kept(_answer(source, query)), narrowed


def test_queries_asked_together_answer_as_each_alone(
    source: PrometheusSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    queries = [q for q in QUERIES if not q.startswith(("absent", "scalar"))]
    sent: list[str] = []
    send = prometheus_source._send

    async def counted(client: Any, path: str, params: dict[str, str], wait_s: float) -> Any:
        if path == "/api/v1/query":
            sent.append(params["query"])
        return await send(client, path, params, wait_s)

    monkeypatch.setattr(prometheus_source, "_send", counted)
    together = asyncio.run(source.query_each(queries, AT))
    monkeypatch.undo()
    assert len(sent) == 1  # one union, not each part alone after it failed
    for query, answer in zip(queries, together, strict=True):
        assert not isinstance(answer, SourceError), (query, answer)
        assert _rows(answer) == _rows(_answer(source, query)), query
