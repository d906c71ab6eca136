"""A Prometheus that is down, slow, lying or rejecting a query: a report, never a crash."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from diagnoser.testing.processes import free_port
from tests.conftest import IncidentPrometheus, run_cli

#: The runs' deadline, and how long the slow server takes to answer: far beyond it. The deadline
#: is far beyond the 1 s query timeout too: on a busy machine, the interpreter's start and the
#: rules' first queries to a server that answers garbage at once took over 8 s.
DEADLINE_S = 15
SLOW_S = 30


class _Behaviour(BaseHTTPRequestHandler):
    mode = "slow"
    #: When the first request arrived (the run had begun): the deadline is judged from there, so a
    #: slow interpreter start on a busy machine does not count against it.
    first_request_at: list[float]

    def do_GET(self) -> None:
        status = 200
        if not self.first_request_at:
            self.first_request_at.append(time.monotonic())
        if self.mode == "slow":
            time.sleep(SLOW_S)
            body, kind = b'{"status":"success","data":{"resultType":"vector","result":[]}}', "application/json"
        elif self.mode == "html404":  # a web server that is not Prometheus (nginx's own 404 page)
            status = 404
            body, kind = b"<html><head><title>404 Not Found</title></head><body>nginx</body></html>", "text/html"
        elif self.mode == "garbage":
            body, kind = b"<html><body>Sign in to continue</body></html>", "text/html"
        else:  # "broken_json": a 200 that says JSON and is not a Prometheus answer
            body, kind = b'{"hello": "world"}', "application/json"
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (timeout): expected in the slow mode

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(params=["slow", "html404", "garbage", "broken_json"])
def misbehaving_prometheus(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, list[float]]]:
    first_request_at: list[float] = []
    handler = type("Handler", (_Behaviour,), {"mode": request.param, "first_request_at": first_request_at})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield request.param, f"http://127.0.0.1:{server.server_address[1]}", first_request_at
    server.shutdown()
    server.server_close()


def _report(result_stdout: str) -> dict[str, object]:
    report = json.loads(result_stdout)
    assert isinstance(report, dict)
    return report


def test_prometheus_down(tmp_path: Path) -> None:
    port = free_port()  # nothing listens here
    started = time.monotonic()
    result = run_cli("now", "--prometheus-url", f"http://127.0.0.1:{port}", "--format", "json")
    elapsed = time.monotonic() - started
    assert result.code == 1, result.stderr
    report = _report(result.stdout)
    findings = report["findings"]
    assert isinstance(findings, list)
    assert [f["cause"] for f in findings] == ["source_unavailable"]
    assert findings[0]["labels"]["source"] == "prometheus"
    errors = report["errors"]
    assert isinstance(errors, list) and len(errors) == 1
    assert errors[0]["source"] == "prometheus"
    assert f"cannot connect to http://127.0.0.1:{port}" in errors[0]["message"]
    # The rules that could not run are named: their silence is no news.
    not_run = errors[0]["rules"]
    assert "pools/pool-exhaustion" in not_run and not_run == sorted(not_run)
    coverage = report["coverage"]
    assert isinstance(coverage, dict)
    assert set(not_run) == {r["rule_id"] for r in coverage["rules"] if r["status"] == "error"}
    assert elapsed < 15
    table = run_cli("now", "--prometheus-url", f"http://127.0.0.1:{port}")
    assert table.code == 1
    assert "source_unavailable" in table.stdout
    assert "sources that could not answer" in table.stdout
    assert "could not run: " in table.stdout and "--format json lists them" in table.stdout


def test_prometheus_slow_garbage_or_not_prometheus(
    misbehaving_prometheus: tuple[str, str, list[float]], tmp_path: Path
) -> None:
    mode, url, first_request_at = misbehaving_prometheus
    config = tmp_path / "c.yaml"
    # The deadline leaves room for a slow interpreter start on a busy machine: the slow server's
    # queries meet their own 1 s timeout first, and that is the one cause reported.
    config.write_text(f"prometheus: {{query_timeout_s: 1}}\ndeadline_s: {DEADLINE_S}\n")
    result = run_cli("now", "--config", str(config), "--prometheus-url", url, "--format", "json")
    elapsed = time.monotonic() - first_request_at[0]
    assert result.code == 1, result.stderr
    report = _report(result.stdout)
    findings = report["findings"]
    errors = report["errors"]
    assert isinstance(findings, list) and isinstance(errors, list)
    assert "source_unavailable" in [f["cause"] for f in findings]
    messages = " ".join(e["message"] for e in errors)
    expected = {
        "slow": "no answer within 1s",
        "html404": f"{url} is not a Prometheus API: HTTP 404 text/html",
        "garbage": f"{url} is not a Prometheus API: HTTP 200 text/html",
        "broken_json": f"{url} is not a Prometheus API: HTTP 200 application/json",
    }[mode]
    assert expected in messages
    assert len(errors) == 1, errors  # one cause, one entry
    # Bodies are summarised, never dumped (the ids of the rules that could not run, nginx's among
    # them, are no body).
    shown = re.sub(r"resources/nginx-[a-z-]+", "", result.stdout)
    assert "Sign in" not in shown and "nginx" not in shown
    # From its first request, the run ends within its deadline (and a margin for printing and
    # exiting): it does not wait for the 30 s server.
    assert elapsed < DEADLINE_S + 2


def test_query_error_is_reported_and_other_rules_still_run(
    incident_prometheus: IncidentPrometheus, tmp_path: Path
) -> None:
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "bad-query.yaml").write_text(
        "cause: dependency_slow\nseverity: warning\ntitle: t\nsummary: s\n"
        "when:\n  - promql: {query: 'sum(rate(up[5m]) by'}\n"
    )
    result = run_cli(
        "now", "--prometheus-url", incident_prometheus.url, "--at", incident_prometheus.at("35m"),
        "--slo-p99-ms", "250", "--rules", str(tmp_path), "--format", "json",
    )
    assert result.code == 1
    report = _report(result.stdout)
    findings = report["findings"]
    errors = report["errors"]
    assert isinstance(findings, list) and isinstance(errors, list)
    assert findings[0]["cause"] == "connection_pool_exhaustion"
    assert any("HTTP 400" in e["message"] and "parse error" in e["message"] for e in errors), errors
    # The one rule that could not run is named; the others ran.
    assert [e["rules"] for e in errors if "HTTP 400" in e["message"]] == [["team/bad-query"]]
    assert "source_unavailable" in [f["cause"] for f in findings]


def test_a_port_that_accepts_and_never_answers_is_bounded(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(50)  # accepts (kernel backlog) but never reads or answers
    try:
        config = tmp_path / "c.yaml"
        config.write_text("prometheus: {query_timeout_s: 1}\ndeadline_s: 3\n")
        started = time.monotonic()
        result = run_cli(
            "now", "--config", str(config), "--prometheus-url", f"http://127.0.0.1:{listener.getsockname()[1]}",
            "--format", "json",
        )
        assert result.code == 1
        # The run ends of its own deadline (3 s, plus start-up, which a busy machine can stretch by
        # seconds), not of run_cli's 60 s limit: the unanswered socket does not hold it.
        assert time.monotonic() - started < 20
        assert "source_unavailable" in [f["cause"] for f in _report(result.stdout)["findings"]]  # type: ignore[union-attr]
    finally:
        listener.close()


def test_rules_lint_stops_at_an_unreachable_prometheus() -> None:
    port = free_port()  # nothing listens here
    result = run_cli("rules", "lint", "--prometheus-url", f"http://127.0.0.1:{port}")
    assert result.code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("query error")]
    assert len(lines) == 1, result.stderr
    assert f"cannot connect to http://127.0.0.1:{port}: connection refused" in lines[0]
    assert "queries not checked" in lines[0]
