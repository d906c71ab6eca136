"""Local servers for tests, benches and the demo: free ports, waiting for a listener, stopping by PID.

Every server listens on 127.0.0.1 only, lives in its own temp dir and is stopped by its PID when
its block ends::

    with local_redis(maxclients=20) as port:
        ...                                   # redis://127.0.0.1:{port}, no persistence
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["free_port", "local_redis", "running", "stop_process", "wait_port"]


#: Ports handed out for servers started by another process: below Linux's default ephemeral range
#: (32768-60999), so neither an outgoing connection's source port nor another ``bind(0)`` takes one.
_SERVER_PORTS = range(10_000, 32_768)
#: Parallel test workers (pytest-xdist sets PYTEST_XDIST_WORKER=gw0, gw1, ...; their children inherit
#: it) each draw from their own slice, so two workers never pick the same port between its pick and
#: the server's bind.
_WORKER_SLICES = 8
#: Independent of any seed a test sets on the module-level generator.
_PICK = random.SystemRandom()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a server another process will start.

    A port from ``bind(0)`` is only free until the socket closes: under parallel tests another
    process can be handed the same one before the server binds it. Ports come instead from a
    range the kernel never assigns by itself, a slice of it per test worker, at random within it.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % _WORKER_SLICES if worker.isdigit() else 0
    width = len(_SERVER_PORTS) // _WORKER_SLICES
    start = _SERVER_PORTS.start + index * width
    for _ in range(256):
        port = _PICK.randrange(start, start + width)
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 15.0) -> None:
    """Return once something accepts connections on 127.0.0.1:``port``; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; nothing if already gone."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def running(*argv: str, env: Mapping[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` as a process (output discarded, ``env`` added) for the duration of the block."""
    process = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
    )
    try:
        yield process
    finally:
        stop_process(process)


@contextlib.contextmanager
def local_redis(*, port: int = 0, maxclients: int = 10000) -> Iterator[int]:
    """Debian's ``redis-server`` on ``port`` (a free one by default), no persistence; yields the port."""
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server not found: run scripts/setup.sh")
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="diagnoser-redis-"))
    try:
        with running(
            "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir),
            "--save", "", "--appendonly", "no", "--maxclients", str(maxclients),
            "--logfile", str(workdir / "redis.log"),
        ):  # fmt: skip
            wait_port(port)
            yield port
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
