"""Servers and proxies at their connection limit, recorded from real software, diagnosed through the CLI.

Two beds, recorded by ``tests/fixtures/pool_services/record_limits.py`` (see each SOURCE.md):
PostgreSQL 15 at ``max_connections`` (Debian's prometheus-postgres-exporter, and a service that
connects per request and answers 503 when refused), and HAProxy 2.6 with ``maxconn 4`` on its
server line (its built-in Prometheus exporter) queueing requests. Each is backfilled as a healthy
lead-in followed by the incident, 15 s scrapes, the incident's scrapes replayed in turn, so a gauge
of churning connections touches its limit in only some of them, as it did live.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here, shared_bed
from tests.fixtures.expositions.timeline import incident_openmetrics, incident_timeline
from tests.fixtures.variations import failing_at_limit

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

LEAD_IN_S = 900
INCIDENT_S = 600
START_S = 1_790_000_000.0
DAY = 86_400
#: directory -> (job, instance, day of the bed)
TARGETS = {
    "postgres-exporter-max-connections": ("postgres", "10.0.0.5:9187", 0),
    "postgres-max-connections-service": ("orders", "10.0.0.6:9464", 0),
    "haproxy-maxconn": ("haproxy", "10.0.0.7:8405", 1),
}
#: The PostgreSQL bed again (day 2), its exporter failing to read the server at every scrape that
#: found it at its 17 usable connections (pg_up 0 and nothing else, as an exporter that must win a
#: slot of its own does): only 15 and 16 of 17 are left, and the failed scrapes are the evidence.
FAILING_DAY = 2


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    text = "".join(
        incident_openmetrics(
            directory,
            start_s=START_S + DAY * day,
            lead_in_s=LEAD_IN_S,
            incident_s=INCIDENT_S,
            scrape_labels={"job": job, "instance": instance},
        ).removesuffix("# EOF\n")
        for directory, (job, instance, day) in TARGETS.items()
    )
    text += _failing_postgres().removesuffix("# EOF\n")
    with LocalPrometheus(openmetrics=text + "# EOF\n") as prometheus:
        yield prometheus.url


def _failing_postgres() -> str:
    start = START_S + DAY * FAILING_DAY
    server, service = (
        incident_timeline(
            directory, start_s=start, lead_in_s=LEAD_IN_S, incident_s=INCIDENT_S,
            scrape_labels={"job": TARGETS[directory][0], "instance": TARGETS[directory][1]},
        )
        for directory in ("postgres-exporter-max-connections", "postgres-max-connections-service")
    )
    failing = failing_at_limit(server, used="pg_stat_activity_count", limit=17, up="pg_up")
    return failing.openmetrics().removesuffix("# EOF\n") + service.openmetrics()


def _diagnose(url: str, at_s: float) -> tuple[int, list[dict[str, object]]]:
    at = datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = run_cli_here("now", "--prometheus-url", url, "--at", at, "--format", "json")
    assert result.code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == [], report["errors"]
    return result.code, list(report["findings"])


def _incident(day: int) -> float:
    return START_S + DAY * day + LEAD_IN_S + INCIDENT_S - 30


def _baseline(day: int) -> float:
    return START_S + DAY * day + LEAD_IN_S - 30


def _only(findings: list[dict[str, object]], rule_id: str) -> dict[str, object]:
    found = [f for f in findings if f["rule_id"] == rule_id]
    assert len(found) == 1, [(f["rule_id"], f["summary"]) for f in findings]
    return found[0]


def test_postgresql_at_max_connections_is_named_with_its_limit(prometheus_url: str) -> None:
    code, findings = _diagnose(prometheus_url, _incident(0))
    assert code == 1
    finding = _only(findings, "resources/server-connection-limit-slo")
    # The service's 503s are the database's refusals: the database is named first, above them.
    assert findings[0]["rule_id"] == "resources/server-connection-limit-slo", [f["rule_id"] for f in findings]
    assert finding["cause"] == "connection_limit_reached"
    # max_connections 20 less 3 reserved for superusers: 17 for the service's role, and both said.
    assert "postgresql max_connections (server=" in str(finding["title"])
    assert "at 17 of the 17 usable (20 configured, 3 reserved)" in str(finding["summary"])
    # Since the minute the incident began (the peak's window reaches back 2 minutes before it).
    onset = datetime.fromisoformat(str(finding["since"]))
    started = START_S + LEAD_IN_S
    assert started - 180 <= onset.timestamp() <= started + 60, (finding["since"], started)
    assert f"since {onset:%H:%M}" in str(finding["summary"])
    assert "client service's requests failing" in str(finding["summary"])
    recommendation = str(finding["recommendation"])
    assert "pooler" in recommendation and "Raising the pools will not help" in recommendation
    evidence = finding["evidence"]
    assert isinstance(evidence, list)
    assert evidence[0]["convention"] == "postgres-exporter"
    shed = [e for e in evidence if e.get("name") == "shed"]
    assert shed and shed[0]["labels"]["client_service"] == "orders" and shed[0]["value"] > 0
    for key in ("title", "summary", "recommendation"):
        assert "unknown" not in str(finding[key]) and "?" not in str(finding[key]), finding[key]


def test_haproxy_at_its_server_maxconn_is_named_with_its_queue(prometheus_url: str) -> None:
    code, findings = _diagnose(prometheus_url, _incident(1))
    assert code == 1
    finding = _only(findings, "resources/proxy-connection-limit")
    assert finding["cause"] == "connection_limit_reached"
    assert "haproxy server maxconn (proxy=app, server=app1)" in str(finding["title"])
    summary = str(finding["summary"])
    assert "reached 4 of the 4 allowed" in summary and "requests queued in the proxy" in summary
    assert "maxconn on the server line" in str(finding["recommendation"])
    evidence = finding["evidence"]
    assert isinstance(evidence, list)
    assert evidence[0]["convention"] == "haproxy-server-maxconn"
    for key in ("title", "summary", "recommendation"):
        assert "unknown" not in str(finding[key]) and "?" not in str(finding[key]), finding[key]


def test_an_exporter_failing_at_the_limit_is_evidence_of_it(prometheus_url: str) -> None:
    code, findings = _diagnose(prometheus_url, _incident(FAILING_DAY))
    assert code == 1
    finding = _only(findings, "resources/server-connection-limit-slo")
    assert findings[0]["rule_id"] == "resources/server-connection-limit-slo", [f["rule_id"] for f in findings]
    summary = str(finding["summary"])
    # The scrapes that landed saw 16 at most; the failed ones say it was full.
    assert "at 16 of the 17 usable" in summary, summary
    assert "its exporter failed to read it in" in summary, summary
    failed = [e for e in finding["evidence"] if e.get("name") == "failed"]
    assert failed and 0 < failed[0]["value"] < 1, failed


@pytest.mark.parametrize("day", [0, 1, FAILING_DAY], ids=["postgres", "haproxy", "postgres-failing"])
def test_the_healthy_baseline_has_nothing_at_warning_or_above(prometheus_url: str, day: int) -> None:
    code, findings = _diagnose(prometheus_url, _baseline(day))
    assert code == 0, [(f["rule_id"], f["summary"]) for f in findings]
    assert [f for f in findings if f["severity"] in ("critical", "warning")] == []
