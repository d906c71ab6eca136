"""Real client libraries driven past their pools, scraped live by a real Prometheus, diagnosed.

SQLAlchemy 2.0 with opentelemetry-instrumentation-sqlalchemy exports only how many connections are
used and idle; redis-py 8's own observability adds a wait-time histogram, still no maximum. Neither
says how big the pool is, so diagnoser must infer the exhaustion (and the size) from the plateau.
The services are the ones the recordings in tests/fixtures/expositions came from.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from diagnoser.testing.processes import local_redis
from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import live_bed, run_cli
from tests.fixtures.pool_services.launch import clients, pool_service

pytestmark = [pytest.mark.integration, live_bed]



def _wait_for(url: str, promql: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        query = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as response:
            if json.load(response)["data"]["result"]:
                return
        time.sleep(0.5)
    raise TimeoutError(f"no result for {promql} within {timeout}s")


def _diagnose_under_load(service_url: str, load_url: str, threads: int, pool_series: str) -> dict[str, object]:
    """Drive the service past its pool, let Prometheus see 15 s of it, diagnose over a 10 s window."""
    target = service_url.removeprefix("http://")
    with LocalPrometheus(scrape_targets=[target], scrape_interval="1s") as prometheus:
        _wait_for(prometheus.url, "up == 1")
        with clients(load_url, threads):
            _wait_for(prometheus.url, pool_series)  # a pool opens its connections on first use
            time.sleep(15)
            result = run_cli(
                "now", "--prometheus-url", prometheus.url, "--slo-p99-ms", "200", "--format", "json",
                env={"DIAGNOSER_WINDOW": "10s"},
            )  # fmt: skip
    assert result.code == 1, result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    return report


def _the_pool_finding(report: dict[str, object]) -> dict[str, object]:
    findings = report["findings"]
    assert isinstance(findings, list)
    pools = [f for f in findings if f["cause"] == "connection_pool_exhaustion"]
    assert len(pools) == 1, [f["summary"] for f in findings]
    for finding in findings:
        for key in ("title", "summary", "recommendation"):
            assert "?" not in finding[key] and "unknown" not in finding[key], finding[key]
    finding: dict[str, object] = pools[0]
    return finding


def test_sqlalchemy_pool_exhaustion_is_found_with_its_size_inferred() -> None:
    with pool_service("sqlalchemy_orders.py", "--pool-size", "5") as url:
        report = _diagnose_under_load(
            url, f"{url}/orders?hold_s=0.3", 20, 'db_client_connections_usage_connections{state="used"}'
        )
    finding = _the_pool_finding(report)
    assert finding["rule_id"] == "pools/pool-exhaustion-inferred"
    assert "all 5 connections lent out" in str(finding["summary"])
    assert "Raise the pool from 5 (inferred" in str(finding["recommendation"])
    evidence = finding["evidence"]
    assert isinstance(evidence, list)
    assert evidence[0]["convention"] == "otel-semconv-pre-1.26-unit-suffix"
    assert str(finding["labels"]["pool"]).startswith("sqlite://")  # type: ignore[index]


def test_redis_py_pool_exhaustion_is_found_with_its_size_inferred() -> None:
    with (
        local_redis() as redis_port,
        pool_service("redis_py_features.py", "--redis-port", str(redis_port), "--max-connections", "10") as url,
    ):
        report = _diagnose_under_load(
            url, f"{url}/features?hold_s=0.5", 40, 'db_client_connection_count{db_client_connection_state="used"}'
        )
    finding = _the_pool_finding(report)
    assert finding["rule_id"] == "pools/pool-exhaustion-inferred"
    assert "all 10 connections lent out" in str(finding["summary"])
    assert "Raise the pool from 10 (inferred" in str(finding["recommendation"])
    evidence = finding["evidence"]
    assert isinstance(evidence, list)
    assert evidence[0]["convention"] == "otel-semconv"


def test_sqlalchemy_pool_whose_timeouts_become_503s_is_found_and_sized_on_the_demand() -> None:
    """Most requests find no connection within 0.1 s and answer 503: the pool rule still fires,
    and sizes the pool on every request (the 503s are refused demand) x the hold time that Little's
    law gives on the full pool (connections lent / requests served), not on the queue."""
    with pool_service("sqlalchemy_orders.py", "--pool-size", "5", "--pool-timeout-s", "0.1") as url:
        report = _diagnose_under_load(
            url, f"{url}/orders?hold_s=0.3", 30, 'db_client_connections_usage_connections{state="used"}'
        )
    findings = report["findings"]
    assert isinstance(findings, list)
    assert any(f["cause"] == "load_shedding" or f["rule_id"] == "http/error-rate-breach" for f in findings), [
        f["summary"] for f in findings
    ]  # the 503s were there
    finding = _the_pool_finding(report)
    assert finding["rule_id"] == "pools/pool-exhaustion-inferred"
    recommendation = str(finding["recommendation"])
    assert "Little's law:" in recommendation and "the hold time being 5 lent /" in recommendation, recommendation
    size = int(recommendation.split(" to ", 1)[1].split(" ", 1)[0])
    assert size > 6, recommendation
