"""A probe that aborts on errors is a finding: a dead target never reads as healthy.

The probe stops itself after about ten failures in ten (its abort rule), before the error rules'
twenty requests. Through the real CLI, against the delay server answering 503 to everything and
the gRPC feature service answering UNAVAILABLE, or running past every deadline: the report names
the error rate it saw, says the probe aborted and why, and exits 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import run_cli
from tests.probe.conftest import DelayServer, GrpcServer


def _now(*args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("now", *args, "--probe-rate", "20", "--probe-duration", "10", "--format", "json", timeout=90)
    assert result.code in (0, 1), result.stderr
    return result.code, json.loads(result.stdout)


def _finding(report: dict[str, Any], cause: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["cause"] == cause]
    assert found, [f["cause"] for f in report["findings"]]
    return found[0]


def test_an_http_target_answering_only_503_is_a_finding_and_exit_1(delay_server: DelayServer) -> None:
    code, report = _now("--probe", delay_server.url + "/unavailable")
    assert report["probe"]["aborted"] and report["probe"]["finished"] < 20  # fewer than the rule's minimum
    assert code == 1
    breach = _finding(report, "error_rate_breach")
    assert breach["evidence"][0]["value"] == 1.0
    assert "100.00% of probe requests failed" in breach["summary"]
    assert "the probe aborted: error ratio 100%" in breach["summary"]


def test_a_grpc_target_answering_only_unavailable_is_a_finding_and_exit_1(grpc_server: GrpcServer) -> None:
    code, report = _now("--probe", grpc_server.url(), "--data", '{"user_id": "unavailable"}')
    assert report["probe"]["aborted"] and report["probe"]["status_counts"].keys() == {"UNAVAILABLE"}
    assert code == 1
    assert "the probe aborted" in _finding(report, "error_rate_breach")["summary"]
    assert _finding(report, "load_shedding")["evidence"][0]["value"] == 1.0


def test_a_grpc_target_past_every_deadline_is_a_finding_and_exit_1(grpc_server: GrpcServer, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("probe: {request_timeout_s: 0.3}\n")
    data = '{"user_id": "u1", "delay_ms": 1000}'
    code, report = _now("--config", str(config), "--probe", grpc_server.url(), "--data", data)
    assert report["probe"]["aborted"] and report["probe"]["status_counts"].keys() == {"DEADLINE_EXCEEDED"}
    assert code == 1
    assert _finding(report, "deadline_exceeded")["evidence"][0]["value"] == 1.0
    assert "the probe aborted" in _finding(report, "error_rate_breach")["summary"]
