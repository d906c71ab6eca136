"""A daemon without Slack is still useful: it logs new and resolved findings, serves them on
``GET /findings``, and shows its coverage on ``/readyz`` and ``/metrics``."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from diagnoser.testing.processes import free_port
from tests.daemon.conftest import LivePrometheus, PoolApp, write_rule
from tests.daemon.test_serve_process import _get, _start, _wait

pytestmark = pytest.mark.integration


def test_findings_logged_served_and_covered(tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp) -> None:
    pool_app.set("noslack", "main", 0.97)
    port = free_port()
    config = {
        "prometheus": {"url": live_prometheus.url},
        "rule_dirs": [str(write_rule(tmp_path / "rules", "noslack"))],
        "disable_builtin_rules": True,
        "daemon": {"diagnose_interval_s": 0.5, "jitter_s": 0, "listen": f"127.0.0.1:{port}",
                   "state_path": str(tmp_path / "state.sqlite3")},
    }
    process, log = _start(config, tmp_path)
    try:
        _wait(lambda: "new finding: connection_pool_exhaustion" in log.read_text(), 20, "a new-finding log line", process, log)
        status, body = _get(f"http://127.0.0.1:{port}/findings")
        assert status == 200
        findings = json.loads(body)["findings"]
        assert [(f["cause"], f["labels"]["pool"]) for f in findings] == [("connection_pool_exhaustion", "main")]
        status, ready = _get(f"http://127.0.0.1:{port}/readyz")
        assert status == 200, ready
        assert "coverage: 1 rule evaluated (test/pool-saturated)" in ready
        metrics = _get(f"http://127.0.0.1:{port}/metrics")[1]
        assert 'diagnoser_rules{status="evaluated"} 1.0' in metrics
        assert 'diagnoser_source_status{source="prometheus",status="evaluated"} 1.0' in metrics
        pool_app.set("noslack", "main", 0.1)
        _wait(lambda: "resolved finding: connection_pool_exhaustion" in log.read_text(), 20, "a resolved log line",
              process, log)
        assert json.loads(_get(f"http://127.0.0.1:{port}/findings")[1]) == {"findings": []}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        pool_app.set("noslack", "main", 0.1)
    new_lines = [line for line in log.read_text().splitlines() if "new finding:" in line]
    assert len(new_lines) == 1, new_lines  # once, not once per diagnosis
    assert "INFO" in new_lines[0] and "shop/noslack pool main: 97%" in new_lines[0]
