"""The deadline holds for the whole process: servers that accept and never answer cannot keep it alive.

Prometheus queries are cancellable coroutines and Kubernetes calls run in daemon threads, so the
process ends within the deadline plus start-up, not after the sources' own (longer) timeouts.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli

DEADLINE_S = 3.0
#: The documented margin: interpreter start-up, rule loading and printing the report.
MARGIN_S = 1.0


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts every connection and never sends a byte."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
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
            held.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


def _timed(*args: str) -> tuple[float, dict[str, object]]:
    started = time.monotonic()
    result = run_cli(*args, "--deadline", f"{DEADLINE_S:g}", "--format", "json", timeout=30)
    elapsed = time.monotonic() - started
    assert result.code == 1, result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report, dict)
    return elapsed, report


def test_prometheus_that_never_answers(silent_server: str) -> None:
    # Default query timeout (10 s) is longer than the deadline: the deadline must win.
    elapsed, report = _timed("now", "--prometheus-url", silent_server)
    assert elapsed < DEADLINE_S + MARGIN_S, f"process took {elapsed:.1f}s"
    errors = report["errors"]
    assert isinstance(errors, list) and len(errors) == 1, errors
    assert "deadline" in errors[0]["message"]


def test_kubernetes_api_that_never_answers(silent_server: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "silent", "cluster": {"server": silent_server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "u"}}],
                "current-context": "silent",
            }
        )
    )
    elapsed, report = _timed("now", "--kubeconfig", str(kubeconfig))
    assert elapsed < DEADLINE_S + MARGIN_S, f"process took {elapsed:.1f}s"
    assert "source_unavailable" in [f["cause"] for f in report["findings"]]  # type: ignore[union-attr]
