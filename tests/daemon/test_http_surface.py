"""The daemon's HTTP listener facing hostile or careless clients.

``diagnose serve`` listens on loopback unless told otherwise (``/metrics`` has no authentication);
a client that never finishes its request headers is answered 408 and disconnected; connections
beyond the cap are answered 503 at once, and the endpoints keep serving the others.
"""

from __future__ import annotations

import asyncio
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


async def _half_request(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: diagnoser\r\nX-Slow: ")  # and nothing more
    await writer.drain()
    return reader, writer


async def test_slow_headers_are_cut_off_and_connections_capped(
    tmp_path: Path, live_prometheus: LivePrometheus
) -> None:
    settings = daemon_settings(tmp_path, live_prometheus.url, "httpcap", http_max_connections=20,
                               http_header_timeout_s=1.5)
    daemon = Daemon(settings)
    await daemon.start()
    port = daemon.http_port
    assert port is not None
    held = [await _half_request(port) for _ in range(20)]
    try:
        # The 21st connection is refused at once with a 503, not queued behind the slow ones.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: diagnoser\r\n\r\n")
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
