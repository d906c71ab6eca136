"""Each job's highest finite bucket, read from a real Prometheus with as few series as it can."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from diagnoser.checks.top_buckets import MAX_LISTED_JOBS, BucketFamily, capped_notes, top_buckets
from diagnoser.config import load_settings
from diagnoser.sources.prometheus import PrometheusSource, Sample
from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here

pytestmark = pytest.mark.integration

START = 1_795_802_400
STEP = 30
POINTS = 41  # 20 minutes
FAMILY = "http_server_request_duration_seconds"
#: Per job, its buckets' bounds as the series spell them and the requests each holds per scrape:
#: a quarter of quotes' requests take over 1 s, its last finite bound; reports' buckets go to
#: 10 s and hold its p99 at 2.5 s; legacy spells its bounds as Prometheus 3 writes them.
LAYOUTS = {
    "quotes": [("0.5", 600), ("1", 900), ("+Inf", 1200)],
    "reports": [("0.5", 600), ("1", 900), ("2.5", 1188), ("5", 1200), ("10", 1200), ("+Inf", 1200)],
    "legacy": [("0.5", 600), ("1.0", 900), ("+Inf", 1200)],
}


def _exposition() -> str:
    lines = [f"# TYPE {FAMILY} histogram"]
    for job, layout in LAYOUTS.items():
        for route in ("/a", "/b"):
            labels = f'job="{job}",http_route="{route}"'
            for i in range(POINTS):
                at = START + STEP * i
                for le, per_scrape in layout:
                    lines.append(f'{FAMILY}_bucket{{{labels},le="{le}"}} {per_scrape * i} {at}')
                lines.append(
                    f'{FAMILY}_count{{{labels},http_response_status_code="200"}} {layout[-1][1] * i} {at}'
                )
                lines.append(f"{FAMILY}_sum{{{labels}}} {layout[-1][1] * i * 0.6:g} {at}")
    return "\n".join([*_sorted_by_series(lines[1:], lines[0]), "# EOF", ""])


def _sorted_by_series(lines: list[str], header: str) -> list[str]:
    """OpenMetrics wants each series' samples together and each family's series together."""
    by_series: dict[str, list[str]] = {}
    for line in lines:
        by_series.setdefault(line.rsplit(" ", 2)[0], []).append(line)
    ordered = sorted(by_series, key=lambda series: (series.split("{")[0], series))
    return [header, *(line for series in ordered for line in by_series[series])]


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    with LocalPrometheus(openmetrics=_exposition()) as prometheus:
        yield prometheus.url


AT = datetime.fromtimestamp(START + STEP * (POINTS - 1), UTC)


def _tops(url: str, jobs: frozenset[str] | None) -> dict[str, float]:
    async def ask() -> dict[str, float]:
        source = PrometheusSource(load_settings(overrides={"prometheus": {"url": url}}).prometheus)
        try:
            family = BucketFamily(f"{FAMILY}_bucket", (), 1.0, jobs)
            return (await top_buckets(source, [family], AT))[family.selector]
        finally:
            await source.aclose()

    return asyncio.run(ask())


def test_each_job_gets_its_own_highest_finite_bound_whatever_its_spelling(prometheus_url: str) -> None:
    tops = _tops(prometheus_url, frozenset(LAYOUTS))
    assert tops == {"": 10.0, "quotes": 1.0, "reports": 10.0, "legacy": 1.0}


def test_a_quantile_summed_over_jobs_gets_the_familys_highest_bound(prometheus_url: str) -> None:
    assert _tops(prometheus_url, None) == {"": 10.0}


def test_listed_jobs_bound_the_answer_and_a_job_without_buckets_has_none(prometheus_url: str) -> None:
    assert _tops(prometheus_url, frozenset({"quotes", "gone"})) == {"": 1.0, "quotes": 1.0}


def test_more_jobs_than_a_matcher_lists_read_the_family_and_still_tell_each_job(prometheus_url: str) -> None:
    many = frozenset({"quotes", "reports", *(f"svc{i}" for i in range(MAX_LISTED_JOBS))})
    assert _tops(prometheus_url, many) == {"": 10.0, "quotes": 1.0, "reports": 10.0}


def test_an_unreachable_prometheus_gives_no_bounds_and_no_error() -> None:
    assert _tops("http://127.0.0.1:9", frozenset({"quotes"})) == {}


def test_the_caveat_is_said_only_near_the_jobs_own_bound() -> None:
    tops = {"sel": {"": 10.0, "quotes": 1.0, "reports": 10.0}}

    def notes(job: str | None, value: float) -> list[str]:
        labels = {"job": job} if job else {}
        return capped_notes(["sel"], Sample(labels=labels, value=value), tops)

    assert notes("quotes", 1.0) == [
        "the histogram's highest finite bucket is 1 s, so a quantile above it reads as 1 s"
    ]
    assert notes("quotes", 0.95) != [] and notes("quotes", 0.85) == []
    assert notes("reports", 2.5) == []
    assert notes("unknown", 9.5) != [] and notes(None, 2.5) == []


def test_the_latency_finding_carries_the_caveat_of_its_own_service_only(prometheus_url: str) -> None:
    at = AT.strftime("%Y-%m-%dT%H:%M:%SZ")
    result = run_cli_here("now", "--prometheus-url", prometheus_url, "--at", at, "--format", "json")
    assert result.code == 1, result.stderr
    findings = json.loads(result.stdout)["findings"]
    latency = {f["labels"]["service"]: f for f in findings if f["rule_id"] == "http/latency-slo-breach"}
    assert sorted(latency) == ["legacy", "quotes", "reports"]
    assert "highest finite bucket is 1 s" in latency["quotes"]["recommendation"]
    assert "highest finite bucket is 1 s" in latency["legacy"]["recommendation"]
    assert "highest finite bucket" not in latency["reports"]["recommendation"]
