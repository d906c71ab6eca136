"""``diagnose serve`` as a real process: SIGTERM mid-run, and logs that never show a secret."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnoser.daemon.state import StateStore
from diagnoser.notify.outbox import NotificationKind
from diagnoser.notify.payloads import AlertReportPayload
from diagnoser.testing.processes import free_port
from tests.daemon.conftest import LivePrometheus, PoolApp, write_rule
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration


def serve_argv() -> list[str]:
    """``diagnose serve``, as the image's entrypoint runs it."""
    return [sys.executable, "-m", "diagnoser", "serve"]


class HangingServer:
    """Accepts TCP connections and never answers: a Prometheus stuck mid-query."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def hanging() -> Iterator[HangingServer]:
    server = HangingServer()
    yield server
    server.close()


def _start(config: dict[str, Any], tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*serve_argv(), "--config", str(path), *extra], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return process, log


@contextlib.contextmanager
def serving(config: dict[str, Any], tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """:func:`_start`; on the way out, a process still running is killed."""
    process, log = _start(config, tmp_path, *extra)
    try:
        yield process, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _get(url: str | urllib.request.Request, timeout: float = 3) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait(condition: Any, timeout: float, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"serve exited with {process.returncode}: {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def _healthy(port: int) -> bool:
    try:
        return _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    except OSError:
        return False


def test_sigterm_during_a_run_exits_quickly_with_state_intact(tmp_path: Path, hanging: HangingServer) -> None:
    state_path = tmp_path / "state.sqlite3"
    # A notification queued by an earlier life of the daemon, for a Slack that is unreachable.
    store = StateStore(state_path)
    store.enqueue(NotificationKind.alert_report, AlertReportPayload.model_validate(
        {"diagnosis": {"evaluated_at": "2026-11-29T20:00:00Z"}, "alert": "CheckoutSlow", "scope": {}}))
    store.close()
    port = free_port()
    config = {
        "prometheus": {"url": hanging.url, "query_timeout_s": 60},
        "deadline_s": 60,
        "slack": {"webhook_url": f"http://127.0.0.1:{free_port()}/services/T0/B0/closed",
                  "allowed_addresses": ["127.0.0.1"]},
        "daemon": {
            "diagnose_interval_s": 30,
            "jitter_s": 0,
            "shutdown_grace_s": 2,
            "listen": f"127.0.0.1:{port}",
            "state_path": str(state_path),
        },
    }
    process, log = _start(config, tmp_path, "--log-format", "json")
    try:
        _wait(lambda: _healthy(port), 20, "/healthz", process, log)
        # The first diagnosis is in flight: its queries hang on the stuck "Prometheus".
        _wait(lambda: len(hanging.accepted) >= 1, 10, "a query in flight", process, log)
        assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 503  # no diagnosis finished yet
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=15)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 0, output
    assert took < 10, f"took {took:.1f}s to stop"
    messages = [json.loads(line)["message"] for line in output.splitlines() if line.startswith("{")]
    assert "stop requested: shutting down" in messages
    assert any(m.startswith("cancelled 1 job(s)") for m in messages), messages
    assert "daemon stopped" in messages
    reopened = StateStore(state_path)
    try:
        assert reopened.integrity_ok()
        pending = reopened.pending()
        assert [(e.kind, e.raw["alert"]) for e in pending] == [(NotificationKind.alert_report, "CheckoutSlow")]
        assert pending[0].attempts >= 1  # it was tried against the closed webhook, and kept
    finally:
        reopened.close()


def test_logs_never_show_secrets(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    secrets = {
        "slack token": slack.token,
        "prometheus password": "prom-pa55word-0f1e",
        "elasticsearch api key": "ZXMtYXBpLWtleS1zZWNyZXQ=",
        "elasticsearch password": "es-pa55word-77aa",
        "alertmanager token": "am-token-31337-xyz",
    }
    pool_app.set("secrets", "vault", 0.99)
    rules = write_rule(tmp_path / "rules", "secrets")
    port = free_port()
    config = {
        "prometheus": {"url": live_prometheus.url,
                       "basic_auth": {"username": "diagnoser", "password": secrets["prometheus password"]}},
        "elasticsearch": {
            "urls": [f"http://127.0.0.1:{free_port()}"],
            "api_key": secrets["elasticsearch api key"],
            "username": "diagnoser",
            "password": secrets["elasticsearch password"],
        },
        "rule_dirs": [str(rules)],
        "disable_builtin_rules": True,
        "slack": {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url,
                  "allowed_addresses": ["127.0.0.1"]},
        "daemon": {
            "diagnose_interval_s": 0.5, "pending_for_s": 0, "resolve_after_s": 0,
            "jitter_s": 0,
            "listen": f"127.0.0.1:{port}",
            "state_path": str(tmp_path / "state.sqlite3"),
            "alertmanager_token": secrets["alertmanager token"],
        },
    }
    process, log = _start(config, tmp_path, "--log-format", "json", "--log-level", "DEBUG")
    try:
        _wait(lambda: len(slack.messages) >= 1, 20, "a Slack message", process, log)
        # A wrong bearer token and a right one: neither may be echoed into the logs.
        body = json.dumps({"version": "4", "status": "firing", "alerts": [
            {"status": "firing", "labels": {"alertname": "PoolBusy", "service": "secrets"}}]}).encode()
        url = f"http://127.0.0.1:{port}/alertmanager"
        wrong = urllib.request.Request(url, data=body, method="POST", headers={"Authorization": "Bearer nope"})
        assert _get(wrong)[0] == 401
        right = urllib.request.Request(
            url, data=body, method="POST",
            headers={"Authorization": f"Bearer {secrets['alertmanager token']}", "Content-Type": "application/json"},
        )
        status, answer = _get(right, timeout=15)
        assert status == 202, answer
        _wait(lambda: len(slack.messages) >= 2, 10, "the alert report", process, log)
        assert "vault" in slack.messages[1].text
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        pool_app.set("secrets", "vault", 0.1)
    output = log.read_text()
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) > 10
    assert all(line.startswith("{") for line in lines), [line for line in lines if not line.startswith("{")][:3]
    assert any('"level": "debug"' in line for line in lines)  # libraries' debug output is in there too
    for name, value in secrets.items():
        assert value not in output, f"the {name} leaked into the logs"


def test_a_bad_config_or_a_taken_port_exits_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    bad = tmp_path / "bad.yaml"
    bad.write_text("daemon: {diagnose_interval_s: -1, listen: 127.0.0.1:0}\n")
    result = subprocess.run([*serve_argv(), "--config", str(bad)], capture_output=True, text=True, env=env,
                            timeout=30, check=False)
    assert result.returncode == 2
    assert "daemon.diagnose_interval_s" in result.stderr

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*serve_argv(), "--listen", f"127.0.0.1:{port}", "--state", str(tmp_path / "s.sqlite3"),
             "--prometheus-url", "http://127.0.0.1:1"],
            capture_output=True, text=True, env=env, timeout=30, check=False,
        )
    finally:
        taken.close()
    assert result.returncode == 2, result.stderr
    assert "cannot listen there: Address already in use" in result.stderr
    assert "address already in use" in result.stderr.lower()


def _refused_at_load(tmp_path: Path, keys: dict[str, Any]) -> tuple[str, str]:
    """``diagnose serve`` with ``keys`` beside a Prometheus and a state path: its one ``error:``
    line (exit 2, nothing started) and the whole stderr."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "prometheus": {"url": "http://127.0.0.1:1"}, **keys,
        "daemon": {"listen": "127.0.0.1:0", "state_path": str(tmp_path / "state.sqlite3")},
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    result = subprocess.run([*serve_argv(), "--config", str(config)], capture_output=True, text=True, env=env,
                            timeout=60, check=False)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not (tmp_path / "state.sqlite3").exists()  # nothing started
    return lines[0], result.stderr


@pytest.mark.parametrize(
    "base_url", ["http://oncall:Pa55-in-base-url@127.0.0.1:9/api/", "https://xoxb-in-userinfo-5e2a@slack.example/api/"]
)
def test_a_slack_base_url_with_credentials_exits_2_naming_the_key(tmp_path: Path, base_url: str) -> None:
    # It used to start, read every answer as "Slack answered garbage" and retry it forever.
    line, stderr = _refused_at_load(
        tmp_path, {"slack": {"token": "xoxb-test-token", "channel": "#oncall", "base_url": base_url}}
    )
    assert "slack.base_url" in line and "user or password" in line
    assert "Pa55-in-base-url" not in stderr and "xoxb-in-userinfo-5e2a" not in stderr


@pytest.mark.parametrize("where", ["slack", "receivers"])
def test_a_slack_url_on_a_loopback_address_not_listed_exits_2(tmp_path: Path, where: str) -> None:
    # It used to be reached: a Slack URL on a private or loopback address needs allowed_addresses.
    slack = {"webhook_url": "http://127.0.0.1:9/services/T0/B0/PATHSECRET"}
    receivers = {"notify": {"receivers": [{"name": "oncall", "type": "slack", **slack}]}}
    line, stderr = _refused_at_load(tmp_path, {"slack": slack} if where == "slack" else receivers)
    assert "webhook_url refused: 127.0.0.1 is a loopback address" in line and "allowed_addresses" in line
    assert "PATHSECRET" not in stderr
