"""Prometheus 3's semantics, on a real Prometheus 3.5: what a 2.x-era query gets wrong there and
how diagnoser's source sends it instead.

- ``le``/``quantile`` are normalised on scrape (client_golang writes ``le="1"``, 3.x stores
  ``le="1.0"``): a matcher on a number matches every spelling of it.
- ``__type__``/``__unit__`` (``--enable-feature=type-and-unit-labels``) make a gauge and a counter
  two label sets: a join of the two answers nothing unless they are ignored.
- Ranges are left-open: a subquery of one step holds one point.
- ``target_info`` says who an OTLP-pushed service is when its ``job`` (``namespace/name``) does not.

Prometheus scrapes itself here (client_golang's own exposition), so the shapes are the server's.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from diagnoser.checks.promql import TrendParams
from diagnoser.config import PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.sources.prometheus import PrometheusSource, Sample
from diagnoser.testing.processes import free_port
from diagnoser.testing.prometheus import LocalPrometheus, binaries
from diagnoser.testing.remote_write import FloatSeries
from tests.conftest import live_bed, run_cli_here
from tests.fixtures.prom3.beds import BEDS, _float_series, bed_info

pytestmark = [
    live_bed,
    pytest.mark.skipif(binaries("3") is None, reason="Prometheus 3.5 not installed (make setup)"),
]

GAUGE, COUNTER = "prometheus_tsdb_head_series", "prometheus_tsdb_head_chunks_created_total"


def _raw(url: str, query: str) -> list[dict[str, Any]]:
    """The server's own answer to ``query``, as sent (no rewriting)."""
    params = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=10) as reply:
        result: list[dict[str, Any]] = json.loads(reply.read())["data"]["result"]
    return result


def _through_source(url: str, query: str, at: datetime | None = None) -> list[Sample] | SourceError:
    source = PrometheusSource(PrometheusSettings(url=url))
    try:
        return asyncio.run(source.query(query, at or datetime.now(UTC)))
    finally:
        source.close()


@pytest.fixture(scope="module")
def self_scraped() -> Iterator[str]:
    """Prometheus 3.5 scraping itself every second, classic histograms (so that its own
    ``_bucket`` series exist) and type-and-unit labels on."""
    port = free_port()
    prometheus = LocalPrometheus(
        major="3", port=port, scrape_jobs={"prometheus": [f"127.0.0.1:{port}"]}, scrape_interval="1s",
        native_histograms=False, features=("type-and-unit-labels",),
    )  # fmt: skip
    with prometheus:
        deadline = time.monotonic() + 30
        while not _raw(prometheus.url, f"{COUNTER} and {GAUGE} offset 1s or {GAUGE} offset 2s"):
            assert time.monotonic() < deadline, "no self-scraped samples after 30 s"
            time.sleep(0.5)
        yield prometheus.url


def test_bucket_bounds_and_quantiles_match_as_numbers(self_scraped: str) -> None:
    bucket = 'prometheus_http_request_duration_seconds_bucket{handler="/metrics", le="%s"}'
    # What client_golang wrote as le="1" and quantile="1", Prometheus 3.5 stores as "1.0".
    assert _raw(self_scraped, bucket % "1") == []
    stored = _raw(self_scraped, bucket % "1.0")
    assert stored and {s["metric"]["le"] for s in stored} == {"1.0"}
    assert _raw(self_scraped, 'go_gc_duration_seconds{quantile="1"}') == []
    for query in (bucket % "1", bucket % "1.0", 'go_gc_duration_seconds{quantile="1"}'):
        samples = _through_source(self_scraped, query)
        assert isinstance(samples, list) and len(samples) == 1, (query, samples)
    # != too: every bucket of the handler but the one at 1 s.
    others = _through_source(self_scraped, bucket.replace('le="%s"', 'le!="1"'))
    everything = _raw(self_scraped, bucket.replace(', le="%s"', ""))
    assert isinstance(others, list) and len(others) == len(everything) - 1


def test_type_and_unit_labels_split_no_join_and_no_aggregation(self_scraped: str) -> None:
    assert _raw(self_scraped, GAUGE)[0]["metric"]["__type__"] == "gauge"
    assert _raw(self_scraped, COUNTER)[0]["metric"]["__type__"] == "counter"
    join = f"{GAUGE} / {COUNTER}"
    assert _raw(self_scraped, join) == []  # a gauge and a counter never match as sent
    joined = _through_source(self_scraped, join)
    assert isinstance(joined, list) and len(joined) == 1 and "__type__" not in joined[0].labels
    both = f'sum without (__name__) ({{__name__=~"{GAUGE}|{COUNTER}"}})'
    assert len(_raw(self_scraped, both)) == 2  # one row per __type__
    summed = _through_source(self_scraped, both)
    assert isinstance(summed, list) and len(summed) == 1


@pytest.fixture(scope="module")
def linear_gauge() -> Iterator[tuple[str, float]]:
    """A gauge growing by 1 every 15 s for 20 minutes, written into a Prometheus 3.5."""
    end = float(int(time.time()) // 15 * 15)
    samples = [(end - 1200 + 15 * i, float(i)) for i in range(81)]
    with LocalPrometheus(
        major="3", series=[FloatSeries({"__name__": "queue_depth", "job": "w"}, samples)]
    ) as p:
        yield p.url, end


def test_a_subquery_of_one_step_holds_one_point(linear_gauge: tuple[str, float], tmp_path: Path) -> None:
    url, end = linear_gauge
    at = datetime.fromtimestamp(end, UTC)
    one = _through_source(url, "count_over_time((queue_depth * 1)[1m:1m])", at)
    two = _through_source(url, "count_over_time((queue_depth * 1)[2m:1m])", at)
    assert isinstance(one, list) and [s.value for s in one] == [1.0]  # left-open: (end-1m, end]
    assert isinstance(two, list) and [s.value for s in two] == [2.0]
    assert _through_source(url, "deriv((queue_depth * 1)[1m:1m])", at) == []  # no slope from one point
    slope = _through_source(url, "deriv((queue_depth * 1)[2m:1m])", at)
    assert isinstance(slope, list) and slope[0].value == pytest.approx(1 / 15)
    # What diagnoser writes itself spans two steps at least, and it says so of what a rule writes.
    with pytest.raises(ValidationError, match="fewer than two 1m steps"):
        TrendParams(query="queue_depth * 1", window="1m", resolution="1m", threshold=1)
    (tmp_path / "short.yaml").write_text(
        "cause: queue_backlog\nseverity: warning\ntitle: t\nsummary: s\nrecommendation: r\n"
        "when:\n  - promql:\n      query: deriv((queue_depth * 1)[1m:1m]) > 0\n",
        encoding="utf-8",
    )
    linted = run_cli_here("rules", "lint", "--rules", str(tmp_path))
    assert "a subquery of 1m at 1m steps holds one point" in linted.stdout + linted.stderr, linted


def _otlp_pushed(job: str, identifying: dict[str, str]) -> list[FloatSeries]:
    """The utf8-otel bed's 3.5 half as the OTLP receiver would hold it: ``job`` of
    ``namespace/name``, and its ``target_info`` with the service's identifying attributes only where
    ``keep_identifying_resource_attributes`` keeps them (``identifying``, spelt as
    NoUTF8EscapingWithSuffixes spells them)."""
    series = _float_series((BEDS / "utf8-otel-3" / "series.om").read_text(encoding="utf-8"))
    pushed = []
    for one in series:
        if one.labels.get("job") != "checkout":
            continue
        labels = {**one.labels, "job": job}
        if labels["__name__"] == "target_info":
            labels = {k: v for k, v in labels.items() if not k.startswith("service.")} | identifying
        pushed.append(FloatSeries(labels, one.samples))
    assert any(s.labels["__name__"] == "target_info" for s in pushed)
    return pushed


@pytest.mark.parametrize(
    ("identifying", "service", "namespace"),
    [
        # A namespace with a slash: the job splits one way only by target_info.
        ({"service.name": "checkout", "service.namespace": "team/a"}, "checkout", "team/a"),
        # None kept: the job is split at its slashes as far as it can be.
        ({}, "team/a/checkout", None),
    ],
)  # fmt: skip
def test_target_info_names_an_otlp_pushed_service(
    identifying: dict[str, str], service: str, namespace: str | None, tmp_path: Path
) -> None:
    info = bed_info(BEDS / "utf8-otel-3")
    config = tmp_path / "diagnoser.yaml"
    config.write_text("slo:\n  p99_ms: 100\n", encoding="utf-8")
    with LocalPrometheus(major="3", series=_otlp_pushed("team/a/checkout", identifying)) as prometheus:
        result = run_cli_here(
            "now", "--config", str(config), "--prometheus-url", prometheus.url,
            "--at", str(info["incident_at"][0]), "--format", "json",
        )  # fmt: skip
    assert result.code in (0, 1), result.stderr
    findings = [f for f in json.loads(result.stdout)["findings"] if f["cause"] == "latency_slo_breach"]
    assert findings, result.stdout
    labels = findings[0]["evidence"][0]["labels"]
    assert labels["service"] == service
    assert labels.get("namespace") == namespace
