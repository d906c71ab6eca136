"""Every recorded naming convention, backfilled as an incident, diagnosed through the real CLI.

Each directory of tests/fixtures/expositions holds /metrics text as a real library served it (live
recordings, or reconstructed from the library's source where it cannot run here: see each
SOURCE.md). timeline.py turns it into a healthy lead-in followed by the incident, with counters
advancing at the recorded rates. The rule that names the cause must fire during the incident,
through the convention it was recorded in, and stay silent in the lead-in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here, shared_bed
from tests.fixtures.expositions.timeline import incident_openmetrics

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

LEAD_IN_S = 900
INCIDENT_S = 600
DAY = 86_400
START_S = 1_790_000_000


@dataclass(frozen=True)
class Case:
    directory: str
    rule_id: str
    convention: str | None
    #: Text the finding's summary must contain.
    summary: str = ""
    #: Text its recommendation must contain.
    recommendation: str = ""


CASES = [
    Case("sqlalchemy-otel", "pools/pool-exhaustion-inferred", "otel-semconv-pre-1.26-unit-suffix", "all 5 connections"),
    Case("redis-py", "pools/pool-exhaustion-inferred", "otel-semconv", "all 10 connections"),
    Case("go-sql", "pools/pool-exhaustion", "go-sql", "100% of 10 connections in use"),
    Case("pgbouncer-exporter", "pools/pool-exhaustion-inferred", "pgbouncer-exporter", "all 5 connections"),
    Case("redis-exporter-maxclients", "pools/redis-maxclients-exporter-blind", None, "Redis refuses new clients"),
    Case("http-otel-new", "http/latency-slo-breach", "otel-http"),
    Case("http-otel-old", "http/latency-slo-breach", "otel-http-old"),
    Case("http-client-python", "http/latency-slo-breach", "prometheus-python-instrumentator"),
    Case("http-promhttp-go", "http/latency-slo-breach", "prometheus-promhttp"),
    Case("istio", "http/latency-slo-breach", "istio"),
    Case("nginx-ingress", "http/latency-slo-breach", "nginx-ingress"),
    Case("grpc-go-prometheus", "http/grpc-latency-slo-breach", "go-grpc-prometheus"),
    Case("grpc-otel", "http/grpc-latency-slo-breach", "otel-rpc-old"),
    Case("grpc-otel-new", "http/grpc-latency-slo-breach", "otel-rpc"),
    # go-redis's use time includes the wait: the hold time comes from the full pool instead, and
    # the recommendation says why.
    Case(
        "go-redis-redisotel", "pools/pool-exhaustion", "go-redis-redisotel", "100% of 10 connections in use",
        "from 10 to 13 connections per instance (Little's law: 4850 uses/s demanded x 0.002s per use",
    ),
    Case("hikaricp-micrometer", "pools/pool-exhaustion", "hikaricp-micrometer", "connections in use"),
    Case("envoy", "pools/pool-overflow", "envoy", "refused because the pool or its queue is full"),
    Case("otel-http-legacy", "http/latency-slo-breach", "otel-http-old"),
    # No hold time and no served rate: the size is the floor, said so, never the queue of 29.
    Case("otelsql-go", "pools/pool-exhaustion", "otelsql", "100% of 10 connections in use",
         "from 10 to at least 11 connections per instance"),
]


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[str, dict[str, float]]]:
    starts = {case.directory: float(START_S + DAY * index) for index, case in enumerate(CASES)}
    text = "".join(
        incident_openmetrics(
            case.directory,
            start_s=starts[case.directory],
            lead_in_s=LEAD_IN_S,
            incident_s=INCIDENT_S,
            scrape_labels={"job": case.directory, "instance": "10.0.0.1:9000"},
        ).removesuffix("# EOF\n")
        for case in CASES
    )
    with LocalPrometheus(openmetrics=text + "# EOF\n") as prometheus:
        yield prometheus.url, starts


def _findings(url: str, at_s: float) -> list[dict[str, object]]:
    at = datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = run_cli_here("now", "--prometheus-url", url, "--at", at, "--format", "json")
    assert result.code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == [], report["errors"]
    findings: list[dict[str, object]] = report["findings"]
    return findings


@pytest.mark.parametrize("case", CASES, ids=[c.directory for c in CASES])
def test_the_recorded_incident_is_named_through_its_convention(
    case: Case, recorded: tuple[str, dict[str, float]]
) -> None:
    url, starts = recorded
    start = starts[case.directory]
    during = [f for f in _findings(url, start + LEAD_IN_S + INCIDENT_S - 30) if f["rule_id"] == case.rule_id]
    assert during, f"{case.rule_id} did not fire for {case.directory}"
    finding = during[0]
    assert case.summary in str(finding["summary"])
    assert case.recommendation in str(finding["recommendation"])
    evidence = finding["evidence"]
    assert isinstance(evidence, list)
    assert evidence[0]["convention"] == case.convention
    for key in ("title", "summary", "recommendation"):
        assert "unknown" not in str(finding[key]) and "?" not in str(finding[key]), finding[key]
    before = [f for f in _findings(url, start + LEAD_IN_S - 30) if f["rule_id"] == case.rule_id]
    assert before == [], before
