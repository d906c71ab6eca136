"""Filters, silences and --at through the CLI, on the bundled incident (reports in this process,
usage errors as a separate process)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import IncidentPrometheus, run_cli, run_cli_here


def _now(prom: IncidentPrometheus, *args: str) -> tuple[int, dict[str, object]]:
    result = run_cli_here(
        "now", "--prometheus-url", prom.url, "--at", prom.at("35m"), "--slo-p99-ms", "250", "--format", "json", *args
    )
    assert result.code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report, dict)
    return result.code, report


def _causes(report: dict[str, object]) -> list[str]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return [f["cause"] for f in findings]


def test_namespace_scopes_prometheus_findings_by_their_label(incident_prometheus: IncidentPrometheus) -> None:
    code, inside = _now(incident_prometheus, "-n", "shop")
    assert code == 1 and "connection_pool_exhaustion" in _causes(inside)
    code, outside = _now(incident_prometheus, "-n", "elsewhere")
    assert code == 0
    assert _causes(outside) == []
    coverage = outside["coverage"]
    assert isinstance(coverage, dict)
    assert coverage["filtered_out"] == len(_causes(inside))
    assert f"{coverage['filtered_out']} findings outside the filters" in coverage["summary"]


def test_cause_rule_and_severity_narrow_the_rules(incident_prometheus: IncidentPrometheus) -> None:
    _, by_cause = _now(incident_prometheus, "--cause", "latency_slo_breach")
    assert _causes(by_cause) == ["latency_slo_breach"]
    rules = by_cause["coverage"]["rules"]  # type: ignore[index]
    assert {r["rule_id"] for r in rules} == {"http/latency-slo-breach", "http/grpc-latency-slo-breach", "probe/probe-latency-slo-breach"}
    _, by_rule = _now(incident_prometheus, "--rule", "pools/*")
    assert _causes(by_rule) == ["connection_pool_exhaustion"]
    assert all(r["rule_id"].startswith("pools/") for r in by_rule["coverage"]["rules"])  # type: ignore[index]
    _, by_severity = _now(incident_prometheus, "--severity", "critical")
    assert all(r["rule_id"] != "nodes/node-cpu-saturation" for r in by_severity["coverage"]["rules"])  # type: ignore[index]


def test_unknown_filters_are_usage_errors(incident_prometheus: IncidentPrometheus) -> None:
    base = ("now", "--prometheus-url", incident_prometheus.url)
    wrong_cause = run_cli(*base, "--cause", "pool_exhaustion")
    assert wrong_cause.code == 2
    assert "did you mean connection_pool_exhaustion?" in wrong_cause.stderr
    assert run_cli(*base, "--rule", "nope/*").code == 2
    assert run_cli(*base, "--severity", "loud").code == 2


def test_silences_apply_and_are_shown_in_coverage(incident_prometheus: IncidentPrometheus, tmp_path: Path) -> None:
    config = tmp_path / "diagnoser.yaml"
    config.write_text(
        "silences:\n"
        "  - matchers: {cause: connection_pool_exhaustion, namespace: shop}\n"
        "    until: 2099-01-01T00:00:00Z\n"
        "    comment: pool raised in PR 42, rolling out\n"
        "  - matchers: {cause: latency_slo_breach}\n"
        "    until: 2020-01-01T00:00:00Z\n"
        "    comment: expired long ago\n"
    )
    _, report = _now(incident_prometheus, "--config", str(config))
    assert "connection_pool_exhaustion" not in _causes(report)
    assert "latency_slo_breach" in _causes(report)  # its silence has expired
    coverage = report["coverage"]
    assert isinstance(coverage, dict)
    [silenced] = coverage["silenced"]
    assert silenced["rule_id"] == "pools/pool-exhaustion"
    assert silenced["comment"] == "pool raised in PR 42, rolling out"
    assert {r["rule_id"]: r["status"] for r in coverage["rules"]}["pools/pool-exhaustion"] == "silenced"
    assert "1 finding silenced" in coverage["summary"]


def test_relative_future_and_zoneless_times(incident_prometheus: IncidentPrometheus) -> None:
    base = ("now", "--prometheus-url", incident_prometheus.url, "--format", "json")
    ago = run_cli_here(*base, "--at", "-30m")
    assert ago.code in (0, 1), ago.stderr
    assert json.loads(ago.stdout)["evaluated_at"] < json.loads(run_cli_here(*base, "--at", "1m").stdout)["evaluated_at"]
    future = run_cli(*base, "--at", "2999-01-01T00:00:00Z")
    assert future.code == 2
    assert "is in the future" in future.stderr
    zoneless = run_cli(*base, "--at", "2026-11-29T20:00:00")
    assert zoneless.code == 2
    assert "has no time zone: add Z for UTC (2026-11-29T20:00:00Z)" in zoneless.stderr
