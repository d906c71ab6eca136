"""``diagnose signals`` on recorded real software: what is recognised per service, and what is not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli, shared_bed
from tests.fixtures.expositions.timeline import incident_openmetrics

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

START_S = 1_790_000_000.0
TARGETS = {
    "postgres-exporter-max-connections": "postgres",
    "postgres-max-connections-service": "orders",
    "haproxy-maxconn": "haproxy",
    "redis-py": "features",
}
AT = datetime.fromtimestamp(START_S + 1_400, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    text = "".join(
        incident_openmetrics(
            directory,
            start_s=START_S,
            lead_in_s=900,
            incident_s=600,
            scrape_labels={"job": job, "instance": "10.0.0.1:9000"},
        ).removesuffix("# EOF\n")
        for directory, job in TARGETS.items()
    )
    with LocalPrometheus(openmetrics=text + "# EOF\n") as prometheus:
        yield prometheus.url


def _services(url: str) -> dict[str, dict[str, Any]]:
    result = run_cli("signals", "--prometheus-url", url, "--at", AT, "--format", "json")
    assert result.code == 0, result.stderr + result.stdout
    report = json.loads(result.stdout)
    assert report["errors"] == [] and report["evaluated_at"] == AT
    return {entry["service"]: entry for entry in report["services"]}


def test_catalogued_and_inferred_signals_are_listed_per_service(prometheus_url: str) -> None:
    services = _services(prometheus_url)
    orders = {row["signal"]: row for row in services["orders"]["signals"]}
    assert orders["http.server.duration"]["convention"] == "otel-http"
    assert (
        orders["http.server.errors"]["metric"]
        == 'http_server_request_duration_seconds_count{http_response_status_code=~"5.."}'
    )
    assert orders["http.server.duration"]["labels"] == {"service": "job", "route": "http_route"}
    postgres = [row for row in services["postgres"]["signals"] if row["signal"].startswith("resource")]
    assert [(r["convention"], r["inferred"]) for r in postgres if "postgresql" in r["signal"]] == [
        ("postgres-exporter", False)
    ]
    [server] = [r for r in services["haproxy"]["signals"] if r["signal"].endswith("haproxy server maxconn")]
    assert (server["convention"], server["inferred"]) == ("haproxy-server-maxconn", False)
    assert server["metric"] == "haproxy_server_current_sessions / haproxy_server_limit_sessions"
    assert server["labels"] == {"service": "job", "proxy": "proxy", "server": "server"}


def test_what_looks_like_a_signal_but_is_not_recognised_says_why(prometheus_url: str) -> None:
    services = _services(prometheus_url)
    missed = {row["metric"]: row for row in services["haproxy"]["unrecognised"]}
    # HAProxy exports its process' descriptor limit without a gauge of descriptors in use.
    assert missed["haproxy_process_max_fds"]["looks_like"] == "limit"
    assert "no gauge" in missed["haproxy_process_max_fds"]["reason"]
    # redis-py's client operation histogram is catalogued: a dependency, not a lookalike.
    features = {row["signal"]: row for row in services["features"]["signals"]}
    assert features["dependency.duration"]["convention"] == "otel-db-client"
    assert services["features"]["unrecognised"] == []


def test_the_table_names_each_service(prometheus_url: str) -> None:
    result = run_cli("signals", "--prometheus-url", prometheus_url, "--at", AT)
    assert result.code == 0, result.stderr
    for service in TARGETS.values():
        assert f"\n{service}\n" in result.stdout
    assert "not recognised: haproxy_process_max_fds" in result.stdout


def test_at_80_columns_each_signal_is_a_block_of_short_lines(prometheus_url: str) -> None:
    result = run_cli("signals", "--prometheus-url", prometheus_url, "--at", AT, env={"COLUMNS": "80"})
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    # The signal on a line of its own, its fields below it: not a table cell folded over 15 lines.
    at = lines.index("http.server.duration")
    assert lines[at + 1].split() == ["convention", "otel-http"]
    wide = run_cli("signals", "--prometheus-url", prometheus_url, "--at", AT, env={"COLUMNS": "400"})
    assert any(line.split()[:2] == ["http.server.duration", "otel-http"] for line in wide.stdout.splitlines())


def test_without_a_prometheus_it_is_a_usage_error() -> None:
    result = run_cli("signals", "--format", "json")
    assert result.code == 2
    assert "--prometheus-url" in result.stderr
