"""``diagnose probe`` and ``diagnose now --probe`` as a user runs them: a process, its streams and exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import run_cli
from tests.probe.conftest import DelayServer


def test_probe_url_prints_the_report_and_exits_0(server: DelayServer) -> None:
    result = run_cli("probe", f"{server.url}/delay?ms=2", "--rate", "50", "--duration", "1")
    assert result.code == 0, result.stderr
    assert "achieved" in result.stdout
    for heading in ("percentile", "p99.99", "schedule lag", "TLS handshake", "HTTP 200"):
        assert heading in result.stdout


def test_probe_json_follows_the_contract_and_bad_answers_exit_1(server: DelayServer) -> None:
    result = run_cli("probe", f"{server.url}/empty-object", "-r", "20", "-d", "0.5", "--format", "json")
    assert result.code == 1
    data = json.loads(result.stdout)
    assert data["sent"] == 10
    assert data["failures"]["empty_json"] == 10
    assert data["examples"][0] == {
        "kind": "empty_json",
        "status": 200,
        "body": "{}",
        "content_length": 2,
        "received_bytes": 2,
        "error": None,
    }
    assert data["histogram"].startswith("HISTF")


def test_probe_refusals_exit_2_before_any_request(tmp_path: Path, server: DelayServer) -> None:
    over = run_cli("probe", f"{server.url}/delay", "--rate", "5000", "--duration", "1")
    assert over.code == 2
    assert "rate 5000 req/s exceeds the cap of 1000 req/s" in over.stderr
    probe_file = tmp_path / "local.yaml"
    probe_file.write_text(f"target: {server.url}/delay?ms=1\nschedule: {{rate: 20, duration_s: 0.5}}\n")
    refused = run_cli("probe", str(probe_file))
    assert refused.code == 2
    assert "not in probe.allowed_hosts" in refused.stderr
    assert server.stats()["count"] == 0
    config = tmp_path / "config.yaml"
    config.write_text("probe: {allowed_hosts: ['127.0.0.1']}\n")
    allowed = run_cli("probe", str(probe_file), "--config", str(config), "--format", "json")
    assert allowed.code == 0, allowed.stderr
    assert json.loads(allowed.stdout)["sent"] == 10


def test_bad_probe_file_exits_2_with_the_field(tmp_path: Path) -> None:
    probe_file = tmp_path / "typo.yaml"
    probe_file.write_text("target: http://127.0.0.1:1/\nschedule: {rate: 1, duration_s: 1}\nretries: 3\n")
    result = run_cli("probe", str(probe_file))
    assert result.code == 2
    assert "retries: Extra inputs are not permitted" in result.stderr


def test_ctrl_c_stops_cleanly_with_the_partial_report(server: DelayServer) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diagnoser",
            "probe",
            f"{server.url}/delay?ms=5",
            "-r",
            "50",
            "-d",
            "60",
            "-f",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 20
    while server.stats()["count"] < 25 and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=10)
    assert process.returncode == 130, stderr  # as a shell reports a SIGINT
    data = json.loads(stdout)
    assert data["aborted"] is True
    assert data["abort_reason"] == "interrupted by the user"
    assert 25 <= data["sent"] < 1000
    assert data["duration_s"] < 30


def test_diagnose_now_with_a_probe_reports_empty_success_response_with_the_body(server: DelayServer) -> None:
    result = run_cli(
        "now",
        "--probe",
        f"{server.url}/empty-features",
        "--probe-rate",
        "20",
        "--probe-duration",
        "1",
        "--format",
        "json",
    )
    assert result.code == 1, result.stderr
    data = json.loads(result.stdout)
    causes = [f["cause"] for f in data["findings"]]
    assert causes[0] == "empty_success_response", causes
    finding = data["findings"][0]
    assert '200 {"features": {}}' in finding["summary"]
    assert finding["evidence"][0]["source"] == "probe"
    assert data["probe"]["failures"]["empty_json"] == 20
