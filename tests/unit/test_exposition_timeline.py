"""Recorded expositions become a backfillable timeline whose rates are the recorded ones.

The timeline is loaded into a real Prometheus (``promtool`` backfill) and read back with PromQL,
so what is checked is what a rule would see: the sample names exactly as the library exposed them,
counters advancing at the rate measured between the two incident snapshots, gauges held.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from diagnoser.testing.prometheus import LocalPrometheus
from tests.fixtures.expositions.timeline import incident_openmetrics, load_snapshot

EXPOSITIONS = Path(__file__).resolve().parent.parent / "fixtures" / "expositions"
START_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SCRAPE = {"job": "orders", "instance": "10.0.0.7:9464"}
CONVENTIONS = sorted(p.name for p in EXPOSITIONS.iterdir() if (p / "incident-0.prom").exists())


def _query(url: str, promql: str, at: float) -> list[dict[str, object]]:
    query = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _recorded_rate(convention: str, sample_name: str, labels: dict[str, str]) -> float:
    directory = EXPOSITIONS / convention
    seconds = float(yaml.safe_load((directory / "recording.yaml").read_text())["incident_interval_s"])
    key = (sample_name, tuple(sorted(labels.items())))
    first = load_snapshot(directory / "incident-0.prom").values[key]
    second = load_snapshot(directory / "incident-1.prom").values[key]
    return (second - first) / seconds


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_every_recording_becomes_openmetrics_promtool_accepts_shape(convention: str) -> None:
    text = incident_openmetrics(EXPOSITIONS / convention, start_s=START_S, scrape_labels=SCRAPE)
    assert text.endswith("# EOF\n")
    assert "# TYPE" not in text
    recorded = {name for name, _ in load_snapshot(EXPOSITIONS / convention / "incident-1.prom").values}
    written = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert recorded <= written, f"sample names lost or renamed: {sorted(recorded - written)[:5]}"
    for line in text.splitlines()[:-1]:
        timestamp = float(line.rsplit(" ", 1)[1])
        assert START_S <= timestamp <= START_S + 1_300, line


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_every_recording_backfills_with_promtool(convention: str, tmp_path: Path) -> None:
    source = tmp_path / "timeline.om"
    source.write_text(incident_openmetrics(EXPOSITIONS / convention, start_s=START_S, scrape_labels=SCRAPE))
    result = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(tmp_path / "data")],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert any((tmp_path / "data").iterdir())


def test_sqlalchemy_recording_backfilled_reads_back_the_recorded_rates() -> None:
    text = incident_openmetrics(
        EXPOSITIONS / "sqlalchemy-otel", start_s=START_S, scrape_labels=SCRAPE, lead_in_s=600, incident_s=600
    )
    incident_start = START_S + 600
    status_503 = {
        "error_type": "503",
        "http_request_method": "GET",
        "http_response_status_code": "503",
        "network_protocol_version": "1.1",
        "otel_scope_name": "opentelemetry.instrumentation.wsgi",
        "otel_scope_schema_url": "https://opentelemetry.io/schemas/1.21.0",
        "otel_scope_version": "0.66b2",
        "url_scheme": "http",
    }
    expected_rate = _recorded_rate("sqlalchemy-otel", "http_server_request_duration_seconds_count", status_503)
    assert expected_rate > 10  # the recording really is an incident: dozens of 503s a second

    with LocalPrometheus(openmetrics=text) as prometheus:
        rate = _query(
            prometheus.url,
            'sum(rate(http_server_request_duration_seconds_count{http_response_status_code="503"}[5m]))',
            incident_start + 540,
        )
        assert float(rate[0]["value"][1]) == pytest.approx(expected_rate, rel=0.01)  # type: ignore[index]

        used = _query(prometheus.url, 'db_client_connections_usage_connections{state="used"}', incident_start + 300)
        assert [float(r["value"][1]) for r in used] == [5.0]  # type: ignore[index]
        assert used[0]["metric"]["job"] == "orders"  # type: ignore[index]
        healthy_used = _query(
            prometheus.url, 'db_client_connections_usage_connections{state="used"}', START_S + 300
        )
        assert [float(r["value"][1]) for r in healthy_used] in ([0.0], [1.0])  # type: ignore[index]

        no_503_before = _query(
            prometheus.url,
            'http_server_request_duration_seconds_count{http_response_status_code="503"}',
            START_S + 300,
        )
        assert no_503_before == []


def test_buckets_keep_the_libraries_le_spelling() -> None:
    text = incident_openmetrics(EXPOSITIONS / "sqlalchemy-otel", start_s=START_S, scrape_labels=SCRAPE)
    assert 'le="1"' in text and 'le="1.0"' not in text
    families = {f.name for f in text_string_to_metric_families(text.replace("# EOF\n", ""))}
    assert "http_server_request_duration_seconds_bucket" in families


def test_go_redis_cumulative_gauges_advance_at_the_recorded_rate() -> None:
    """go-redis exports its cumulative pool counts as gauges; convention.yaml marks them so the
    timeline advances them, and ``rate()`` over the backfill reads the scenario's 2,000 timeouts
    in 600 s. The pool stays pinned at 10 of 10 through the incident."""
    convention = EXPOSITIONS / "go-redis-redisotel"
    text = incident_openmetrics(convention, start_s=START_S, scrape_labels={"job": "feature-service", "instance": "10.0.3.4:9464"})
    pool = {  # otel_scope_schema_url="" is dropped, as Prometheus drops empty labels
        "db_system": "redis",
        "otel_scope_name": "github.com/redis/go-redis/extra/redisotel",
        "otel_scope_version": "semver:9.22.0",
        "pool_name": "redis-features:6379",
    }
    expected_timeouts = _recorded_rate("go-redis-redisotel", "db_client_connections_timeouts", pool)
    assert expected_timeouts == pytest.approx(2_000 / 600, rel=0.05)
    incident_end = START_S + 600 + 600
    with LocalPrometheus(openmetrics=text) as prometheus:
        timeouts = _query(prometheus.url, "rate(db_client_connections_timeouts[5m])", incident_end)
        assert float(timeouts[0]["value"][1]) == pytest.approx(expected_timeouts, rel=0.01)  # type: ignore[index]
        before = _query(prometheus.url, "rate(db_client_connections_timeouts[5m])", START_S + 590)
        assert float(before[0]["value"][1]) == 0.0  # type: ignore[index]
        used = _query(prometheus.url, 'db_client_connections_usage{state="used"} / ignoring(state) db_client_connections_max', incident_end)
        assert float(used[0]["value"][1]) == 1.0  # type: ignore[index]
