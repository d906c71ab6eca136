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

from diagnoser.models import Finding
from diagnoser.notify.slack import evidence_lines
from tests.conftest import run_cli
from tests.probe.conftest import DelayServer, GrpcServer


def _now(*args: str, duration: str = "10") -> tuple[int, dict[str, Any]]:
    result = run_cli(
        "now", *args, "--probe-rate", "20", "--probe-duration", duration, "--format", "json", timeout=90
    )
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
    finished = report["probe"]["finished"]
    # The counts, the status mix and the abort reason, the reason said once in the finding.
    assert f"{finished} failed (status {finished})" in breach["summary"]
    assert f"status codes: 503 {finished} of {finished} requests" in breach["summary"]
    assert "the probe aborted: error ratio 100%" in breach["summary"]
    finding = Finding.model_validate(breach)
    texts = [finding.summary, *evidence_lines(finding)]  # as the Slack message shows them
    assert sum(text.count("the probe aborted") for text in texts) == 1, texts
    # The rules' minimum request counts do not hide the run: its rules were judged, not "no data"
    # (only connection reuse needs more requests than an aborted run has).
    short = [r["rule_id"] for r in report["coverage"]["rules"] if r["status"] == "no_data"]
    assert short == ["probe/probe-tls-handshake-overhead"], report["coverage"]["summary"]


def test_a_target_refusing_connections_is_target_unreachable_first_and_exit_1(
    listener: tuple[str, Any],
) -> None:
    url, sock = listener
    sock.close()  # nothing listens on that port now: every connection is refused
    code, report = _now("--probe", url)
    assert code == 1
    assert [f["cause"] for f in report["findings"]][:2] == ["target_unreachable", "error_rate_breach"]
    unreachable = report["findings"][0]
    assert "Connection refused" in unreachable["summary"]
    assert "no latency" not in report["findings"][1]["summary"]


def test_a_healthy_target_still_exits_0(delay_server: DelayServer) -> None:
    code, report = _now("--probe", delay_server.url + "/delay?ms=1", duration="3")
    assert not report["probe"]["aborted"]
    assert [f["cause"] for f in report["findings"] if f["severity"] != "info"] == []
    assert code == 0


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
