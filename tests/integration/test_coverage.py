"""Coverage through the real CLI: "no findings" only ever comes with what was looked at."""

from __future__ import annotations

import json

import pytest

from diagnoser.config import Settings
from diagnoser.engine import DiagnosisConfig, RulePack
from diagnoser.engine.coverage import CoverageInputs, metric_names_in, metric_names_of
from diagnoser.engine.run import load_ruleset
from tests.conftest import IncidentPrometheus, run_cli, run_cli_here


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            'histogram_quantile(0.99, sum by (le, job) (rate(http_server_request_duration_seconds_bucket{job="a"}[5m])))',
            {"http_server_request_duration_seconds_bucket"},
        ),
        ("max by (pool) (a_used / on (pool) group_left () b_max offset 5m) > bool 0.9", {"a_used", "b_max"}),
        ('sum(rate(x_total{code=~"5.."}[1m])) / sum(rate(x_total[1m])) > 1e3', {"x_total"}),
        ("absent(up{job=\"metrics-server\"}) unless on() vector(1)", {"up"}),
        ("predict_linear(mem[1h:1m], 3600)", {"mem"}),
    ],
)
def test_metric_names_in_promql(query: str, expected: set[str]) -> None:
    assert metric_names_in(query) == expected


def test_metric_names_of_a_rule_follow_renames() -> None:
    settings = Settings(metrics={"hikaricp_connections_max": "app_hikari_max"})
    rule = load_ruleset(RulePack.from_settings(settings)).rules["pools/pool-exhaustion"]
    names = metric_names_of(rule, CoverageInputs.of(DiagnosisConfig.from_settings(settings)))
    assert "app_hikari_max" in names and "hikaricp_connections_max" not in names
    assert "hikaricp_connections_active" in names


def test_incident_coverage_lists_the_rules_that_had_data(incident_prometheus: IncidentPrometheus) -> None:
    args = ("now", "--prometheus-url", incident_prometheus.url, "--at", incident_prometheus.at("35m"), "--slo-p99-ms", "250")
    report = json.loads(run_cli_here(*args, "--format", "json").stdout)
    coverage = report["coverage"]
    by_rule = {r["rule_id"]: r for r in coverage["rules"]}
    assert by_rule["pools/pool-exhaustion"]["status"] == "evaluated"
    assert by_rule["http/latency-slo-breach"]["status"] == "evaluated"
    overflow = by_rule["pools/pool-overflow"]
    assert overflow["status"] == "no_data"
    assert "envoy_cluster_upstream_rq_pending_overflow" in overflow["missing_metrics"]
    assert by_rule["elasticsearch/es-hot-threads"] == {
        "rule_id": "elasticsearch/es-hot-threads", "source": "elasticsearch", "status": "skipped",
        "reason": "source elasticsearch not configured", "missing_metrics": [],
    }
    sources = {s["source"]: s for s in coverage["sources"]}
    assert sources["prometheus"]["status"] == "evaluated"
    assert sources["kubernetes"]["status"] == "skipped"
    assert coverage["counts"]["evaluated"] == sum(1 for r in coverage["rules"] if r["status"] == "evaluated")
    assert coverage["metrics_checked"] is True
    assert "no_data" not in [f["cause"] for f in report["findings"]]

    table = run_cli(*args, env={"COLUMNS": "200"})
    # The last thing printed; the terminal may wrap it.
    line = " ".join(table.stdout[table.stdout.index("coverage: "):].split())
    assert f"{coverage['counts']['evaluated']} rules evaluated (" in line
    assert "pools: " in line
    assert "without data: " in line and "container_*" in line
    # Reasons come most common first; the gRPC probe rules put the probe level with Elasticsearch.
    skipped = line.split(" skipped: ", 1)[1].split(", ")
    assert skipped[0] == "no kubernetes" and {"no elasticsearch", "no probe"} <= set(skipped[1:3]), line


def test_prometheus_without_the_packs_metrics_exits_1_with_no_data(incident_prometheus: IncidentPrometheus) -> None:
    # Years before the incident's data: the same Prometheus holds none of the metrics then.
    result = run_cli_here("now", "--prometheus-url", incident_prometheus.url, "--at", "2020-01-01T00:00:00Z", "--format", "json")
    assert result.code == 1, result.stderr
    report = json.loads(result.stdout)
    assert [f["cause"] for f in report["findings"]] == ["no_data"]
    finding = report["findings"][0]
    assert "2020-01-01T00:00:00Z" in finding["summary"]
    assert "db_client_connection_max" in finding["evidence"][0]["detail"]
    assert report["coverage"]["counts"].get("evaluated", 0) == 0
    assert report["coverage"]["sources"][0] == {
        "source": "prometheus", "status": "no_data", "rules": report["coverage"]["sources"][0]["rules"], "reason": None,
    }
    table = run_cli("now", "--prometheus-url", incident_prometheus.url, "--at", "2020-01-01T00:00:00Z")
    assert table.code == 1
    assert "no_data" in table.stdout
    assert "coverage: 0 rules evaluated" in table.stdout


def test_healthy_instant_says_no_findings_with_the_coverage_line(incident_prometheus: IncidentPrometheus) -> None:
    result = run_cli("now", "--prometheus-url", incident_prometheus.url, "--at", incident_prometheus.at("15m"), "--slo-p99-ms", "250")
    assert result.code == 0, result.stdout
    lines = result.stdout.splitlines()
    assert any(line.startswith("No findings") for line in lines)
    assert any(line.startswith("coverage: ") and "rules evaluated" in line for line in lines)


def test_a_probe_run_too_small_to_judge_is_no_data_not_good_news() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class EmptyBody(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), EmptyBody)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = run_cli("now", "--probe", f"http://127.0.0.1:{server.server_address[1]}/", "--probe-rate", "3",
                         "--probe-duration", "2", "--format", "json")
    finally:
        server.shutdown()
        server.server_close()
    report = json.loads(result.stdout)
    assert report["probe"]["sent"] == 6
    by_rule = {r["rule_id"]: r for r in report["coverage"]["rules"]}
    empty = by_rule["probe/probe-empty-success-response"]
    assert empty["status"] == "no_data"
    assert empty["reason"] == "the probe finished only 6 requests (below the rules' min_requests)"
    assert "without data: the probe finished only 6 requests" in report["coverage"]["summary"]
