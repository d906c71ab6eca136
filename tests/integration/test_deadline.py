"""The deadline holds for the whole process: servers that accept and never answer cannot keep it alive.

Prometheus queries are cancellable coroutines and Kubernetes calls run in daemon threads, so the
process ends within the deadline plus start-up, not after the sources' own (longer) timeouts.
Time is counted from the first connection the server sees: by then the run has begun, so a slow
interpreter start on a busy machine is not charged to the deadline, and a process that waited
for a source's own timeout (10 s) would still be caught.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli

DEADLINE_S = 3.0
#: The documented margin: printing the report and exiting (the run had begun by the first connection).
MARGIN_S = 1.0


@dataclass
class SilentServer:
    url: str
    first_connection_at: float | None = None


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    """Accepts every connection and never sends a byte; remembers when the first one came."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    server = SilentServer(f"http://127.0.0.1:{listener.getsockname()[1]}")
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if server.first_connection_at is None:
                server.first_connection_at = time.monotonic()
            held.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


def _timed(server: SilentServer, *args: str) -> tuple[float, dict[str, object]]:
    """Seconds from the server's first connection to the process's exit, and the report."""
    result = run_cli(*args, "--deadline", f"{DEADLINE_S:g}", "--format", "json", timeout=30)
    ended = time.monotonic()
    assert server.first_connection_at is not None, "the run never reached the server"
    elapsed = ended - server.first_connection_at
    assert result.code == 1, result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report, dict)
    return elapsed, report


def test_prometheus_that_never_answers(silent_server: SilentServer) -> None:
    # Default query timeout (10 s) is longer than the deadline: the deadline must win.
    elapsed, report = _timed(silent_server, "now", "--prometheus-url", silent_server.url)
    assert elapsed < DEADLINE_S + MARGIN_S, f"process took {elapsed:.1f}s"
    errors = report["errors"]
    assert isinstance(errors, list) and len(errors) == 1, errors
    assert "deadline" in errors[0]["message"]


def test_kubernetes_api_that_never_answers(silent_server: SilentServer, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "silent", "cluster": {"server": silent_server.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "u"}}],
                "current-context": "silent",
            }
        )
    )
    elapsed, report = _timed(silent_server, "now", "--kubeconfig", str(kubeconfig))
    assert elapsed < DEADLINE_S + MARGIN_S, f"process took {elapsed:.1f}s"
    assert "source_unavailable" in [f["cause"] for f in report["findings"]]  # type: ignore[union-attr]
