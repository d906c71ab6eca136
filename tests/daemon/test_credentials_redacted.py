"""Passwords inside source URLs never leave the process: every output channel is searched for them.

``diagnose now`` in each format (stdout and stderr), ``diagnose rules lint``, and ``diagnose serve``
(its log lines and the Slack messages the fixture received) are given a Prometheus and an
Elasticsearch URL carrying a user and password, for servers that refuse the connection: the
error messages that quote those URLs are the ones that used to carry the password out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from diagnoser.redact import redact_url, scrub_text
from diagnoser.testing.processes import free_port
from tests.daemon.test_serve_process import _start, _wait
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration

PROM_PASSWORD = "prom-Pa55-in-url-7f3a"
ES_PASSWORD = "es-Pa55-in-url-91bc"
TOKEN_IN_QUERY = "tok-in-query-55e1"


def _urls() -> tuple[str, str]:
    prometheus = f"http://reader:{PROM_PASSWORD}@127.0.0.1:{free_port()}/prom?access_token={TOKEN_IN_QUERY}"
    elasticsearch = f"http://elastic:{ES_PASSWORD}@127.0.0.1:{free_port()}"
    return prometheus, elasticsearch


def _assert_clean(text: str, where: str) -> None:
    for secret in (PROM_PASSWORD, ES_PASSWORD, TOKEN_IN_QUERY):
        assert secret not in text, f"{secret} leaked into {where}"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    return subprocess.run(
        [sys.executable, "-m", "diagnoser", *args], capture_output=True, text=True, env=env, timeout=60,
        check=False,
    )


def test_redact_url_and_scrub_text() -> None:
    assert redact_url("https://u:p@h:9090/x?token=t&a=1#f") == "https://***@h:9090/x?token=***&a=1#f"
    assert redact_url("http://h:9090") == "http://h:9090"
    assert scrub_text("GET http://a:b@h/ and https://c@d/e?password=z&q=1 done") == (
        "GET http://***@h/ and https://***@d/e?password=***&q=1 done"
    )
    # An e-mail address or a '@' in a path is not user information.
    assert scrub_text("mail ops@example.com at http://h/a@b") == "mail ops@example.com at http://h/a@b"


@pytest.mark.parametrize("output", ["json", "markdown", "table"])
def test_diagnose_now_never_prints_a_password_from_a_url(output: str) -> None:
    prometheus, elasticsearch = _urls()
    result = _cli(
        "now", "--prometheus-url", prometheus, "--elasticsearch-url", elasticsearch, "--format", output,
        "--verbose",
    )
    assert result.returncode in (0, 1), result.stderr
    # The failure is reported, and where it happened is still readable.
    assert "***@127.0.0.1" in result.stdout
    _assert_clean(result.stdout, f"stdout ({output})")
    _assert_clean(result.stderr, f"stderr ({output})")
    if output == "json":
        errors = json.loads(result.stdout)["errors"]
        assert {e["source"] for e in errors} >= {"prometheus", "elasticsearch"}


def test_rules_lint_never_prints_a_password_from_a_url() -> None:
    prometheus, _ = _urls()
    result = _cli("rules", "lint", "--prometheus-url", prometheus)
    assert "cannot connect to http://***@127.0.0.1" in result.stdout + result.stderr
    _assert_clean(result.stdout, "rules lint stdout")
    _assert_clean(result.stderr, "rules lint stderr")


def test_serve_logs_and_slack_messages_never_carry_a_password_from_a_url(
    tmp_path: Path, slack: SlackFixtureServer
) -> None:
    prometheus, elasticsearch = _urls()
    port = free_port()
    config = {
        "prometheus": {"url": prometheus, "query_timeout_s": 2},
        "elasticsearch": {"urls": [elasticsearch], "timeout_s": 2},
        "slack": {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url,
                  "allowed_addresses": ["127.0.0.1"]},
        "daemon": {
            "diagnose_interval_s": 0.5, "pending_for_s": 0, "resolve_after_s": 0,
            "jitter_s": 0,
            "listen": f"127.0.0.1:{port}",
            "state_path": str(tmp_path / "state.sqlite3"),
        },
    }
    process, log = _start(config, tmp_path, "--log-format", "json", "--log-level", "DEBUG")
    try:
        # One source_unavailable message per source, each quoting the URL that failed.
        _wait(lambda: len(slack.messages) >= 2, 30, "the source_unavailable messages", process, log)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    posted = json.dumps([m.body for m in slack.messages])
    assert "source_unavailable" in posted
    assert "***@127.0.0.1" in posted
    _assert_clean(posted, "the Slack messages")
    output = log.read_text()
    assert "daemon stopped" in output
    _assert_clean(output, "the daemon's log")
