"""A big estate does not turn the rules off: 2,500 uncatalogued pairs beside an exhausted pool.

Above about 2,000 candidate series, recognition's one query used to be longer than httpx's
65,536-character URL limit; the error failed every signal rule, the catalogued pool rule
included: ``diagnose now`` exited 0 with no findings and ``diagnose signals`` ended in a
traceback. 2,500 gauges each paired with a ``_limit`` (5,000 series, every one a candidate) put
recognition's selectors past that limit. Through the real CLI (its own process), over a backfilled real Prometheus
(:mod:`tests.fixtures.big_estate`). Costs about 15 s on a quiet machine (the backfill, two commands; 45 s at a load of 27).
``bench/big_estate.py`` prints the figures at 20,000.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli, shared_bed
from tests.fixtures.big_estate import AT, estate_openmetrics

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

FAMILIES = 2_500


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    with LocalPrometheus(openmetrics=estate_openmetrics(FAMILIES, pair_every=1)) as prometheus:
        yield prometheus.url


def test_now_reports_the_pool_beside_thousands_of_uncatalogued_pairs(prometheus_url: str) -> None:
    # A deadline far off: what is tested is that the rules run, not how fast (bench/big_estate.py).
    done = run_cli(
        "now", "--prometheus-url", prometheus_url, "--at", str(AT), "--deadline", "120", "--format", "json",
        timeout=180,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    report = json.loads(done.stdout)
    causes = {f["cause"] for f in report["findings"] if f["severity"] in ("warning", "critical")}
    assert "connection_pool_exhaustion" in causes, (causes, report.get("errors"))
    assert done.code == 1  # findings at warning or above
    too_long = [e for e in report.get("errors", []) if "URL" in str(e) or "too long" in str(e)]
    assert not too_long, too_long


def test_signals_lists_the_pool_beside_thousands_of_uncatalogued_pairs(prometheus_url: str) -> None:
    done = run_cli(
        "signals", "--prometheus-url", prometheus_url, "--at", str(AT), "--format", "json", timeout=180
    )
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.code == 0, done.stderr[-2000:]
    assert "db_client_connection" in done.stdout
