"""What ``diagnose serve`` logs at its default level, and what ``-v`` adds.

By default a line is an event of the daemon's own (a diagnosis done, a delivery failed), not a
library's: httpx's line per Prometheus request and APScheduler's "skipped: maximum number of
running instances" (every outbox tick while a Slack call hangs) are shown with ``-v`` only.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from diagnoser.testing.processes import free_port
from tests.daemon.conftest import LivePrometheus, PoolApp, write_rule
from tests.daemon.test_serve_process import _wait, serving
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration

HTTPX_LINE = "HTTP Request: GET"
SKIPPED_LINE = "skipped: maximum number of running instances"


def _config(tmp_path: Path, prometheus_url: str, slack: SlackFixtureServer, job: str) -> dict[str, Any]:
    return {
        "prometheus": {"url": prometheus_url},
        "rule_dirs": [str(write_rule(tmp_path / "rules", job))],
        "disable_builtin_rules": True,
        # Slack holds the post longer than the test lasts: the outbox job stays in that call.
        "slack": {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url, "timeout_s": 60,
                  "allowed_addresses": ["127.0.0.1"]},
        "daemon": {
            "diagnose_interval_s": 0.5, "pending_for_s": 0, "resolve_after_s": 0,
            "outbox_retry_s": 0.2,
            "jitter_s": 0,
            "shutdown_grace_s": 0.5,
            "listen": f"127.0.0.1:{free_port()}",
            "state_path": str(tmp_path / "state.sqlite3"),
        },
    }


def _serve(tmp_path: Path, config: dict[str, Any], slack: SlackFixtureServer, *flags: str) -> str:
    """Run serve until six diagnoses have run while a Slack post hangs; its log."""
    posts_before = len(slack.requests)
    with serving(config, tmp_path, *flags) as (process, log):

        def diagnoses() -> int:
            return log.read_text().count("diagnosis done")

        _wait(lambda: len(slack.requests) > posts_before, 30, "a post to the hanging Slack", process, log)
        hung_at = diagnoses()
        _wait(lambda: diagnoses() >= hung_at + 6, 30, "six diagnoses while Slack hangs", process, log)
        if "-v" in flags:
            _wait(lambda: SKIPPED_LINE in log.read_text(), 30, "the scheduler's skip warning", process, log)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    return log.read_text()


def test_library_chatter_is_quiet_by_default_and_shown_with_v(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    pool_app.set("logvolume", "orders", 0.99)
    slack.hang()
    try:
        quiet = _serve(
            tmp_path / "quiet", _config(tmp_path / "quiet", live_prometheus.url, slack, "logvolume"), slack
        )
        lines = quiet.splitlines()
        assert sum("diagnosis done" in line for line in lines) >= 7
        assert [line for line in lines if HTTPX_LINE in line] == []
        assert [line for line in lines if SKIPPED_LINE in line] == []
        verbose = _serve(
            tmp_path / "verbose",
            _config(tmp_path / "verbose", live_prometheus.url, slack, "logvolume"),
            slack,
            "-v",
        )
        lines = verbose.splitlines()
        diagnoses = sum("diagnosis done" in line for line in lines)
        # Every diagnosis asks Prometheus at least once, and each request is a line of its own.
        assert sum(HTTPX_LINE in line for line in lines) >= diagnoses
        assert any(SKIPPED_LINE in line for line in lines)
    finally:
        slack.set_ok()
        pool_app.set("logvolume", "orders", 0.1)
