"""The daemon's HTTP listener facing hostile or careless clients.

``diagnose serve`` listens on loopback unless told otherwise (``/metrics`` has no authentication);
a client that never finishes its request headers is answered 408 and disconnected; connections
beyond the cap are answered 503 at once, and the endpoints keep serving the others. One peer
cannot take the whole cap, and /healthz and /readyz still answer when the cap is reached.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import aiohttp
import pytest
import yaml

from diagnoser.config import Settings
from diagnoser.daemon import Daemon
from tests.daemon.conftest import LivePrometheus, daemon_settings, wait_for
from tests.daemon.test_daemon_cluster import _alertmanager_payload
from tests.daemon.test_serve_process import serve_argv

pytestmark = pytest.mark.integration


def test_serve_listens_on_loopback_by_default(tmp_path: Path) -> None:
    assert Settings().daemon.listen == "127.0.0.1:8080"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"prometheus": {"url": "http://127.0.0.1:1"},
                                      "daemon": {"state_path": str(tmp_path / "state.sqlite3")}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    process = subprocess.Popen([*serve_argv(), "--config", str(config)], stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(30, process.kill)  # a daemon that says nothing must not hang the test
    watchdog.start()
    try:
        lines: list[str] = []
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if "daemon started" in line or "cannot run the daemon" in line:
                break
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
    started = "".join(lines)
    # Either it serves on 127.0.0.1:8080, or (port taken on a shared machine) it says that is
    # the address it tried: never 0.0.0.0.
    assert "listen=127.0.0.1:8080" in started or "('127.0.0.1', 8080)" in started, started
    assert "0.0.0.0" not in started


async def _half_request(port: int, peer: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from ``peer`` (any 127.x address is loopback) that sends half its request headers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(peer, 0))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: diagnoser\r\nX-Slow: ")  # and nothing more
    await writer.drain()
    return reader, writer


async def test_slow_headers_are_cut_off_and_connections_capped(
    tmp_path: Path, live_prometheus: LivePrometheus
) -> None:
    settings = daemon_settings(tmp_path, live_prometheus.url, "httpcap", http_max_connections=20,
                               http_max_connections_per_peer=100, http_header_timeout_s=1.5)
    daemon = Daemon(settings)
    await daemon.start()
    port = daemon.http_port
    assert port is not None
    held = [await _half_request(port) for _ in range(20)]
    try:
        # The 21st connection is refused at once with a 503, not queued behind the slow ones
        # (unless it is a health probe: those have a reserve, see below).
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /findings HTTP/1.1\r\nHost: diagnoser\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), timeout=5)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        writer.close()
        # The half-sent requests are answered 408 and closed once the header deadline passes.
        for reader, _ in held:
            assert (await asyncio.wait_for(reader.read(), timeout=10)).startswith(b"HTTP/1.1 408")
        assert daemon.metrics.http_dropped.labels("header_timeout")._value.get() == 20
        assert daemon.metrics.http_dropped.labels("connection_cap")._value.get() == 1

        async def healthy() -> bool:
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as response:
                return response.status == 200

        await wait_for(healthy, what="/healthz served again")
    finally:
        for _, writer in held:
            writer.close()
        await daemon.stop()


async def _answers(port: int, peer: str, token: str) -> dict[str, int]:
    """The status of /healthz, /readyz and an Alertmanager webhook, asked from ``peer``."""
    body = json.dumps(_alertmanager_payload({"alertname": "Slow", "service": "x"})).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    base = f"http://127.0.0.1:{port}"
    timeout = aiohttp.ClientTimeout(total=5)
    statuses: dict[str, int] = {}
    # One connection per request (as the kubelet's probes do), so each faces the limits anew.
    connector = aiohttp.TCPConnector(local_addr=(peer, 0), force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        for method, path in (("GET", "/healthz"), ("GET", "/readyz"), ("POST", "/alertmanager")):
            try:
                async with http.request(method, base + path, data=body if method == "POST" else None,
                                        headers=headers) as response:
                    statuses[path] = response.status
            except aiohttp.ClientError:  # closed before an answer could be read: no answer at all
                statuses[path] = 0
    return statuses


async def _ready_daemon(tmp_path: Path, prometheus_url: str, job: str, **daemon: object) -> Daemon:
    settings = daemon_settings(tmp_path, prometheus_url, job, alertmanager_token="t0ken",
                               http_header_timeout_s=30, **daemon)
    started = Daemon(settings)
    await started.start()
    await wait_for(lambda: started.readiness()[0], what="the daemon ready")
    return started


async def test_one_peer_holding_100_half_sent_requests_leaves_the_endpoints_answering(
    tmp_path: Path, live_prometheus: LivePrometheus
) -> None:
    daemon = await _ready_daemon(tmp_path, live_prometheus.url, "httppeer")  # default limits
    port = daemon.http_port
    assert port is not None
    held = [await _half_request(port) for _ in range(100)]
    try:
        answers = await _answers(port, "127.0.0.2", "t0ken")
        assert answers == {"/healthz": 200, "/readyz": 200, "/alertmanager": 202}, answers
        per_peer = daemon.settings.daemon.http_max_connections_per_peer
        # Beyond its own limit, the greedy peer's connections are answered 503 and closed at once.
        refused = [reader for reader, _ in held[per_peer:]]
        for reader in refused:
            assert (await asyncio.wait_for(reader.read(), timeout=5)).startswith(b"HTTP/1.1 503")
        assert daemon.metrics.http_dropped.labels("peer_cap")._value.get() == len(refused)
    finally:
        for _, writer in held:
            writer.close()
        await daemon.stop()


async def test_health_probes_are_answered_when_the_cap_is_reached(
    tmp_path: Path, live_prometheus: LivePrometheus
) -> None:
    daemon = await _ready_daemon(tmp_path, live_prometheus.url, "httpfull", http_max_connections=20)
    port = daemon.http_port
    assert port is not None
    # Four peers, each within its own limit, fill the cap together.
    held = [await _half_request(port, f"127.0.0.{1 + n % 4}") for n in range(20)]
    try:
        answers = await _answers(port, "127.0.0.5", "t0ken")
        # The probes still answer; everything else waits for the cap as before.
        assert answers == {"/healthz": 200, "/readyz": 200, "/alertmanager": 503}, answers
        assert all(not reader.at_eof() for reader, _ in held)
    finally:
        for _, writer in held:
            writer.close()
        await daemon.stop()


async def test_half_sent_requests_from_ten_addresses_keep_no_probe_out(
    tmp_path: Path, live_prometheus: LivePrometheus
) -> None:
    """Ten peers, each within its own limit (20), hold 200 half-sent requests: twice the cap and
    its reserve. A probe's connection takes the place of the oldest half-sent one."""
    daemon = await _ready_daemon(tmp_path, live_prometheus.url, "httpspread")  # default limits
    port = daemon.http_port
    assert port is not None
    held = [await _half_request(port, f"127.0.0.{2 + n % 10}") for n in range(200)]
    try:
        for _ in range(3):  # again and again: each time a half-sent one gives its place
            answers = await _answers(port, "127.0.0.20", "t0ken")
            assert answers["/healthz"] == 200 and answers["/readyz"] == 200, answers
        # The caps still hold: of the 200, those beyond the cap and its reserve gave way (503).
        config = daemon.settings.daemon
        given_way = daemon.metrics.http_dropped.labels("connection_cap")._value.get()
        assert given_way >= 200 - config.http_max_connections - 4
    finally:
        for _, writer in held:
            writer.close()
        await daemon.stop()
