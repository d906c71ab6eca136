"""The human report and the exit code, rendered from a hand-built result (pure functions)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rich.console import Console

from diagnoser.cli.probe import exit_code_for
from diagnoser.probe.report import render_report
from diagnoser.probe.result import Failures, Percentiles, PhaseShares, ProbeResult, ResponseExample


def _result(**changes: object) -> ProbeResult:
    base = ProbeResult(
        target="http://127.0.0.1:8080/v1/features",
        requested_rate=200,
        achieved_rate=199.8,
        duration_s=10,
        sent=2000,
        completed=1998,
        finished=2000,
        latency_ms=Percentiles(count=1998, p50=20.4, p75=21, p90=22, p99=23.1, p999=40, p9999=41, max=41.5),
        service_time_ms=Percentiles(count=1998, p50=20.1, p99=22.8, max=41),
        schedule_lag_ms=Percentiles(count=2000, p50=0.1, p99=0.6, max=1.2),
        status_counts={"200": 1990, "503": 8},
        failures=Failures(status=8, timeout=2),
        examples=[ResponseExample(kind="status", status=503, body='{"error": "UNAVAILABLE"}')],
        phase_share_p99=PhaseShares(ttfb=0.95, body=0.03, schedule_lag=0.02),
        connections_opened=4,
    )
    return base.model_copy(update=changes)


def _text(result: ProbeResult) -> str:
    console = Console(record=True, width=140)
    console.print(render_report(result))
    return console.export_text()


def test_report_shows_percentiles_phases_outcomes_and_samples() -> None:
    text = _text(_result())
    assert "requested 200 req/s, achieved 199.8 req/s over 10.0 s; sent 2000, completed 1998" in text
    for row in ("p50", "p75", "p90", "p99", "p99.9", "p99.99", "max"):
        assert f"\n│ {row} " in text
    assert "23.100" in text
    assert "waiting (first byte)" in text
    assert "95%" in text
    assert "HTTP 503" in text
    assert "failure: timeout" in text
    assert "UNAVAILABLE" in text
    assert "stopped early" not in text


def test_report_says_why_a_run_stopped_and_warns_about_bottlenecks() -> None:
    text = _text(
        _result(
            aborted=True,
            abort_reason="error ratio 80% over the last 5 s",
            warnings=["the pool limited the load"],
        )
    )
    assert "stopped early: error ratio 80% over the last 5 s" in text
    assert "warning: the pool limited the load" in text


def test_exit_codes() -> None:
    assert exit_code_for(_result()) == 1
    clean = _result(failures=Failures(), status_counts={"200": 2000})
    assert exit_code_for(clean) == 0
    assert (
        exit_code_for(clean.model_copy(update={"aborted": True, "abort_reason": "interrupted by the user"}))
        == 130
    )
    assert exit_code_for(clean.model_copy(update={"aborted": True, "abort_reason": "error ratio 90%"})) == 1


def test_a_404_is_counted_once_and_a_complete_run_is_not_stopped_early(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>not found</html>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # Every answer fails: the error-ratio abort can fire while the last answers drain, after
        # the whole schedule was sent; that run is complete, not stopped early.
        result = run_cli("probe", f"http://127.0.0.1:{server.server_address[1]}/x", "--rate", "3", "--duration", "2")
    finally:
        server.shutdown()
        server.server_close()
    assert result.code == 1
    assert "stopped early" not in result.stdout
    assert "HTTP 404 (failure: status)" in result.stdout
    assert "failure: status " not in result.stdout.replace("(failure: status)", "")
    assert "(x6)" in result.stdout or "(x3)" in result.stdout  # identical samples shown once


def test_an_abort_while_the_last_answers_drain_is_not_stopped_early(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    class SlowUnavailable(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(1.5)  # every answer arrives after the whole 1 s schedule was sent
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowUnavailable)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = tmp_path / "c.yaml"
    config.write_text("probe: {abort_window_s: 1}\n")  # 10 req/s: the abort needs 5 answers
    try:
        result = run_cli(
            "probe", f"http://127.0.0.1:{server.server_address[1]}/", "--rate", "10", "--duration", "1",
            "--config", str(config), "--format", "json",
        )
    finally:
        server.shutdown()
        server.server_close()
    data = json.loads(result.stdout)
    assert data["sent"] == 10
    assert data["aborted"] is False and data["abort_reason"] is None
    assert result.code == 1  # the failures still count
