"""``diagnose now`` end to end against a real Prometheus holding the bundled incident."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import IncidentPrometheus, run_cli

CONTRACT_FINDING_KEYS = {
    "rule_id", "cause", "kind", "severity", "title", "summary", "evidence", "recommendation", "runbook_url", "labels", "since",
}


def test_json_report_names_pool_exhaustion_first_with_pool_size(incident_prometheus: IncidentPrometheus) -> None:
    result = run_cli(
        "now", "--prometheus-url", incident_prometheus.url, "--at", incident_prometheus.at("35m"),
        "--slo-p99-ms", "250", "--format", "json",
    )
    assert result.code == 1, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"evaluated_at", "findings", "errors", "probe", "coverage"}
    assert report["evaluated_at"] == incident_prometheus.at("35m")
    assert report["errors"] == []
    assert report["probe"] is None
    first = report["findings"][0]
    assert set(first) == CONTRACT_FINDING_KEYS
    assert first["cause"] == "connection_pool_exhaustion"
    assert first["kind"] == "cause"
    assert first["labels"]["pool"] == "orders-db"
    assert "from 10 to 13 connections" in first["recommendation"]
    assert first["runbook_url"].endswith("rules/pools/pool-exhaustion.md")
    evidence = first["evidence"][0]
    assert set(evidence) == {
        "source", "query", "labels", "value", "threshold", "detail", "name", "convention", "setting", "caveat",
        "text",
    }  # fmt: skip
    assert evidence["name"] == "connection_pool_exhaustion_ratio"  # the first condition: a share of the pool
    assert evidence["source"] == "prometheus"
    assert evidence["convention"] == "otel-semconv"
    assert evidence["value"] == 1.0
    assert evidence["threshold"] == 0.95
    causes = [f["cause"] for f in report["findings"]]
    assert "latency_slo_breach" in causes


def test_healthy_instant_exits_zero(incident_prometheus: IncidentPrometheus) -> None:
    result = run_cli(
        "now", "--prometheus-url", incident_prometheus.url, "--at", incident_prometheus.at("15m"),
        "--slo-p99-ms", "250", "--format", "json",
    )
    assert result.code == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [f for f in report["findings"] if f["severity"] != "info"] == []


def test_slo_flag_changes_the_verdict(incident_prometheus: IncidentPrometheus) -> None:
    result = run_cli(
        "now", "--prometheus-url", incident_prometheus.url, "--at", incident_prometheus.at("35m"),
        "--slo-p99-ms", "2000", "--format", "json",
    )
    causes = [f["cause"] for f in json.loads(result.stdout)["findings"]]
    assert "latency_slo_breach" not in causes
    assert "connection_pool_exhaustion" in causes


def test_table_and_markdown_show_cause_numbers_and_runbook(incident_prometheus: IncidentPrometheus) -> None:
    args = ("now", "--prometheus-url", incident_prometheus.url, "--at", incident_prometheus.at("35m"), "--slo-p99-ms", "250")
    table = run_cli(*args)
    assert table.code == 1
    assert "connection_pool_exhaustion" in table.stdout
    assert "from 10 to 13" in table.stdout
    assert "pools/pool-exhaustion.md" in table.stdout.replace("\n", "").replace(" ", "")
    markdown = run_cli(*args, "--format", "markdown")
    assert markdown.stdout.startswith("# Diagnosis at ")
    assert "## 1. CRITICAL: `connection_pool_exhaustion`" in markdown.stdout


def test_unix_seconds_for_at(incident_prometheus: IncidentPrometheus) -> None:
    seconds = str(int(incident_prometheus.start_s + 35 * 60))
    result = run_cli("now", "--prometheus-url", incident_prometheus.url, "--at", seconds, "--format", "json")
    assert json.loads(result.stdout)["evaluated_at"] == incident_prometheus.at("35m")


def test_config_file_and_environment(incident_prometheus: IncidentPrometheus, tmp_path: Path) -> None:
    config = tmp_path / "diagnoser.yaml"
    config.write_text("slo: {p99_ms: 250}\nrule_params:\n  pools/pool-exhaustion: {headroom: 1.5}\n")
    result = run_cli(
        "now", "--config", str(config), "--at", incident_prometheus.at("35m"), "--format", "json",
        env={"DIAGNOSER_PROMETHEUS__URL": incident_prometheus.url},
    )
    first = json.loads(result.stdout)["findings"][0]
    assert "from 10 to 16 connections" in first["recommendation"]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run_cli("now", "--prometheus-url", "http://127.0.0.1:9", "--at", "yesterday").code == 2
    assert run_cli("now").code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("slo: {p99_ms: -5}\n")
    result = run_cli("now", "--config", str(bad))
    assert result.code == 2
    assert "slo.p99_ms" in result.stderr
    assert run_cli("now", "--format", "xml").code == 2


def test_rules_lint_runs_every_query_on_a_real_prometheus(incident_prometheus: IncidentPrometheus) -> None:
    result = run_cli("rules", "lint", "--prometheus-url", incident_prometheus.url)
    assert result.code == 0, result.stdout + result.stderr
    assert "0 problems" in result.stdout


def test_rules_lint_reports_a_query_the_server_rejects(incident_prometheus: IncidentPrometheus, tmp_path: Path) -> None:
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "bad-query.yaml").write_text(
        "cause: dependency_slow\nseverity: warning\ntitle: t\nsummary: s\n"
        "when:\n  - promql: {query: 'rate(up)'}\n"
    )
    result = run_cli("rules", "lint", "--prometheus-url", incident_prometheus.url, "--rules", str(tmp_path))
    assert result.code == 1
    assert "rule team/bad-query: field when[0].promql.query" in result.stderr
    assert "range vector" in result.stderr


def test_rules_list_json() -> None:
    result = run_cli("rules", "list", "--format", "json")
    assert result.code == 0, result.stderr
    rows = json.loads(result.stdout)
    ids = {row["id"] for row in rows}
    assert {"pools/pool-exhaustion", "http/latency-slo-breach", "kubernetes/memory-leak"} <= ids


def test_rules_test_command_passes_and_fails(tmp_path: Path) -> None:
    passing = run_cli("rules", "test", "examples/checkout-incident.yaml")
    assert passing.code == 0, passing.stdout
    assert "3 passed, 0 failed" in passing.stdout
    failing = tmp_path / "wrong.yaml"
    failing.write_text(
        "tests:\n  - interval: 30s\n    input_series:\n"
        "      - series: 'redis_rejected_connections_total{instance=\"r:9121\"}'\n        values: '0x40'\n"
        "    finding_tests:\n      - eval_time: 15m\n        rule: pools/redis-rejected-connections\n"
        "        exp_findings: [{exp_labels: {instance: 'r:9121'}}]\n"
    )
    result = run_cli("rules", "test", str(failing))
    assert result.code == 1
    assert "0 passed, 1 failed" in result.stdout
    assert "expected a finding" in result.stdout
