"""The recorded beds of real software, backfilled with 15 s scrapes and diagnosed through the real CLI.

A checkout service with three upstreams, one of which got 200 ms slower, as OpenTelemetry's client
instrumentations really export it (httpx, requests and aiohttp-client, old and stable HTTP semantic
conventions; OpenTelemetry JS's http instrumentation on Node.js; Spring Boot 3 through Micrometer,
reconstructed), backfilled with 15 s scrapes and diagnosed through the real CLI.

The recordings are in tests/fixtures/expositions/otel-*-client-* (``recording.yaml`` says which port
each upstream listened on). The slow upstream must be named with its peer, its latency before and
now and its share of the service's time; the two upstreams that did not change must not be blamed;
where the metric carries no peer, the finding must say so and name the setting that adds it; and
the healthy lead-in must have nothing at warning or above.

A Node.js orders service (pg-pool of 5 on PostgreSQL 15, OpenTelemetry JS's default http and pg
instrumentations, its Prometheus exporter: tests/fixtures/expositions/otel-js-pg) driven past its
pool: the exhaustion must be named with a size by Little's law on the demand (every request, the
503s included) and the hold time (connections in use / requests served), never the queue.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import yaml

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here, shared_bed
from tests.fixtures.expositions.timeline import HERE, incident_openmetrics, load_snapshot

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

# The rule's baseline ends an hour before the instant: the lead-in covers it.
LEAD_IN_S = 5400
INCIDENT_S = 600
DAY = 86_400
START_S = 1_795_000_000


@dataclass(frozen=True)
class Case:
    directory: str
    convention: str
    #: Whether the client metric names its peer.
    has_peer: bool = True
    #: Without a peer: the setting the finding must name, which puts the peer on the metric.
    peer_setting: str = ""
    #: The slow peer as the metric names it; on 127.0.0.1 the port tells the upstreams apart.
    peer: str = "127.0.0.1"


CASES = [
    Case("otel-httpx-client-stable", "otel-http-client"),
    Case("otel-requests-client-old", "otel-http-client-old"),
    Case("otel-aiohttp-client-stable", "otel-http-client"),
    Case("otel-js-http-client", "otel-http-client-js"),
    Case("otel-httpx-client-old", "otel-http-client-old-no-peer", has_peer=False,
         peer_setting="OTEL_SEMCONV_STABILITY_OPT_IN=http"),
    # Reconstructed from source (Go and Spring Boot cannot be built here): see their SOURCE.md.
    Case("grpc-go-prometheus-client", "go-grpc-prometheus-client", peer="inventory.v1.InventoryService"),
    Case("micrometer-spring-checkout", "micrometer-http-client-no-peer", has_peer=False,
         peer_setting="ClientRequestObservationConvention"),
]


NODE_BED = "otel-js-pg"


def _upstreams(directory: str) -> dict[str, int]:
    recording = yaml.safe_load((HERE / directory / "recording.yaml").read_text(encoding="utf-8"))
    upstreams: dict[str, int] = recording["upstreams"]
    return upstreams


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[str, dict[str, float]]]:
    beds = [(case.directory, "checkout") for case in CASES] + [(NODE_BED, "orders-node")]
    starts = {directory: float(START_S + DAY * index) for index, (directory, _) in enumerate(beds)}
    text = "".join(
        incident_openmetrics(
            directory, start_s=starts[directory], lead_in_s=LEAD_IN_S, incident_s=INCIDENT_S,
            scrape_labels={"job": job, "instance": "10.0.0.7:9464"},
        ).removesuffix("# EOF\n")
        for directory, job in beds
    )
    with LocalPrometheus(openmetrics=text + "# EOF\n") as prometheus:
        yield prometheus.url, starts


def _report(url: str, at_s: float) -> dict[str, object]:
    at = datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = run_cli_here("now", "--prometheus-url", url, "--at", at, "--format", "json")
    assert result.code in (0, 1), result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    assert report["errors"] == [], report["errors"]
    return report


@pytest.mark.parametrize("case", CASES, ids=[c.directory for c in CASES])
def test_the_slow_upstream_is_named_and_no_other(case: Case, recorded: tuple[str, dict[str, float]]) -> None:
    url, starts = recorded
    findings = _report(url, starts[case.directory] + LEAD_IN_S + INCIDENT_S - 30)["findings"]
    assert isinstance(findings, list)
    slow = [f for f in findings if f["cause"] == "dependency_slow"]
    assert len(slow) == 1, [f["summary"] for f in slow]
    finding = slow[0]
    assert finding["rule_id"] == "dependencies/dependency-slow"
    assert finding["evidence"][0]["convention"] == case.convention
    summary = str(finding["summary"])
    if case.has_peer and case.peer == "127.0.0.1":
        upstreams = _upstreams(case.directory)
        assert finding["labels"]["peer"] == "127.0.0.1"
        assert finding["labels"]["peer_port"] == str(upstreams["inventory"])
        assert f"calls to 127.0.0.1:{upstreams['inventory']} take" in summary
    elif case.has_peer:
        assert finding["labels"]["peer"] == case.peer and "peer_port" not in finding["labels"]
        assert f"calls to {case.peer} take" in summary
    else:
        assert "peer" not in finding["labels"]
        assert "outbound HTTP calls (no peer label)" in summary
        assert case.peer_setting in str(finding["recommendation"])
    # Inventory took 30 ms and then 230 ms (without a peer, the mean of all three calls rose).
    values = {e["name"]: e["value"] for e in finding["evidence"]}
    assert values["before_s"] < 0.1 and values["now_s"] < 0.5, values
    if case.has_peer:
        assert values["now_s"] > 0.2, values
    # 200 ms more per request of the service, whichever way the calls are counted.
    # (the first condition, the rise of the mean call, is named by its cause in the report)
    assert 0.15 < values["dependency_slow"] * values["calls_per_s"] / values["rps"] < 0.3, values
    assert values["dependency_busy"] / values["server_busy"] > 0.4, values
    assert f"take {values['now_s'] * 1000:.0f} ms on average, up from {values['before_s'] * 1000:.0f} ms" in summary
    # The onset is the minute the upstream got slow, and the baseline the window just before it.
    onset = datetime.fromisoformat(str(finding["since"]))
    started = starts[case.directory] + LEAD_IN_S
    assert started <= onset.timestamp() <= started + 120, (finding["since"], started)
    assert f"since {onset:%H:%M} (the 5m mean up to " in summary, summary
    for key in ("title", "summary", "recommendation"):
        assert "unknown" not in str(finding[key]) and "?" not in str(finding[key]), finding[key]


def _little(directory: str) -> int:
    """The pool size Little's law gives from the recording itself: every request per second (the
    503s included) x the time a connection is held (5 in use / requests served per second) x 1.25."""
    first, second = (load_snapshot(HERE / directory / name) for name in ("incident-0.prom", "incident-1.prom"))
    seconds = float(yaml.safe_load((HERE / directory / "recording.yaml").read_text(encoding="utf-8"))["incident_interval_s"])

    def rate(status: str | None) -> float:
        return sum(
            value - first.values.get(series, 0.0)
            for series, value in second.values.items()
            if series[0] == "http_server_request_duration_count"
            and (status is None or ("http_response_status_code", status) in series[1])
        ) / seconds

    demand, served = rate(None), rate("200")
    return math.ceil(demand * (5 / served) * 1.25)


def test_the_node_pg_pool_exhaustion_is_sized_by_littles_law(recorded: tuple[str, dict[str, float]]) -> None:
    url, starts = recorded
    findings = _report(url, starts[NODE_BED] + LEAD_IN_S + INCIDENT_S - 30)["findings"]
    assert isinstance(findings, list)
    pools = [f for f in findings if f["cause"] == "connection_pool_exhaustion"]
    assert [f["rule_id"] for f in pools] == ["pools/pool-exhaustion"], [f["summary"] for f in findings]
    # The pool's timeouts are the 503s the service sheds: the pool is named first, above them.
    assert findings[0]["rule_id"] == "pools/pool-exhaustion", [f["rule_id"] for f in findings]
    finding = pools[0]
    assert finding["evidence"][0]["convention"] == "otel-semconv"
    assert "100% of 5 connections in use" in str(finding["summary"])
    expected = _little(NODE_BED)
    assert 20 < expected < 60, expected
    assert f"Raise the pool from 5 to {expected} connections per instance (Little's law:" in str(finding["recommendation"])
    assert "the hold time being 5 in use /" in str(finding["recommendation"])


@pytest.mark.parametrize("case", [*CASES, Case(NODE_BED, "")], ids=[c.directory for c in CASES] + [NODE_BED])
def test_nothing_at_warning_or_above_in_the_healthy_lead_in(
    case: Case, recorded: tuple[str, dict[str, float]]
) -> None:
    url, starts = recorded
    findings = _report(url, starts[case.directory] + LEAD_IN_S - 30)["findings"]
    assert isinstance(findings, list)
    assert [f["summary"] for f in findings if f["severity"] in ("warning", "critical")] == []
