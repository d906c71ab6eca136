"""Capacity workers facing a coordinator, a network and strangers they cannot trust.

Each test runs real ``diagnose worker`` processes (or the real ``diagnose capacity`` coordinator)
against the delay server, on 127.0.0.1: the token never crosses the wire and no response body
comes back (a relay records every byte between a worker and its coordinator); a coordinator that
cannot prove it holds the token gets nothing run; a coordinator that can still cannot raise a
worker's own caps or widen its allowlist; a stranger cannot make the coordinator buffer what it
sends before the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnoser.config import ProbeSettings
from diagnoser.errors import ProbeWorkerError
from diagnoser.probe.entry import run_event_loop
from diagnoser.probe.result import ProbeResult
from diagnoser.probe.spec import spec_from_url
from diagnoser.probe.workers import WorkerPool
from tests.probe.conftest import DelayServer, connected

TOKEN = "7f3c9a1e5b2d4f608a9c1e3b5d7f9a2c"
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}


def _worker(port: int, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A ``diagnose worker`` process for the coordinator (or relay) at ``port``."""
    return subprocess.Popen(
        [sys.executable, "-m", "diagnoser", "worker", f"--coordinator=127.0.0.1:{port}", *args],
        env={**CLEAN_ENV, "DIAGNOSER_WORKER_TOKEN": TOKEN, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class Relay:
    """A TCP relay between workers and a coordinator that keeps every byte each way."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.to_coordinator = bytearray()
        self.to_worker = bytearray()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, kept: bytearray) -> None:
            while chunk := await source.read(65536):
                kept += chunk
                sink.write(chunk)
                await sink.drain()
            sink.close()

        with contextlib.suppress(asyncio.CancelledError):  # the loop closing with the run
            await asyncio.gather(pump(reader, up_writer, self.to_coordinator), pump(up_reader, writer, self.to_worker),
                                 return_exceptions=True)  # fmt: skip

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def test_the_token_never_crosses_the_wire_and_no_body_comes_back(delay_server: DelayServer) -> None:
    """Every byte between a real worker and its coordinator, through a relay: no token, no body."""
    spec = spec_from_url(delay_server.url + "/unavailable", rate=40, duration_s=0.5)
    worker: subprocess.Popen[str] | None = None

    async def main() -> ProbeResult:
        nonlocal worker
        pool = WorkerPool(1, spawn=False, token=TOKEN, startup_s=30)
        relay = Relay(await pool.open())
        # Every answer a 503, and the worker's own abort ratio at 100 %: it sends the whole run.
        worker = _worker(
            await relay.start(), "--allow-target=127.0.0.1", env={"DIAGNOSER_PROBE__ABORT_ERROR_RATIO": "1"}
        )
        try:
            await pool.wait_for_workers()
            return await pool.launch(
                spec, ProbeSettings(abort_error_ratio=1.0), explicit_target=True
            ).result()
        finally:
            await pool.aclose()
            relay.close()
            wire = bytes(relay.to_coordinator), bytes(relay.to_worker)
            assert all(TOKEN.encode() not in side for side in wire)
            assert b"UNAVAILABLE" not in wire[0]  # the 503s' body, {"error": "UNAVAILABLE"}

    result = run_event_loop(main())
    assert worker is not None and worker.wait(timeout=30) == 0, worker.communicate()[1]
    assert result.status_counts == {"503": 20}
    examples = [e for e in result.examples if e.kind == "status"]
    assert examples and all(e.status == 503 and e.body is None for e in examples)


def test_a_coordinator_that_cannot_prove_the_token_gets_nothing_run(
    listener: tuple[str, socket.socket],
) -> None:
    """A listener posing as the coordinator answers the hello with a made-up proof, then orders a run."""
    url, target = listener
    order = {
        "type": "run", "run_id": 1, "share": [0, 1], "start_at": time.time(), "slow_ms": None,
        "explicit_target": True, "spec": spec_from_url(url, rate=20, duration_s=2).model_dump(mode="json"),
        "settings": ProbeSettings().model_dump(mode="json"),
    }  # fmt: skip

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = json.loads(await reader.readline())
        assert "token" not in hello  # nothing to steal in it either
        challenge = {"type": "challenge", "nonce": "ab" * 16, "proof": "00" * 32}
        writer.write(json.dumps(challenge).encode() + b"\n" + json.dumps(order).encode() + b"\n")
        await writer.drain()
        await asyncio.sleep(3)  # time to send the run, were it sent
        writer.close()

    async def main() -> tuple[int, str]:
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        worker = _worker(port, "--allow-target=127.0.0.1")
        try:
            code = await asyncio.to_thread(worker.wait, 30)
        finally:
            server.close()
        return code, worker.communicate()[1]

    code, stderr = run_event_loop(main())
    assert code == 1, stderr
    assert "did not prove it holds" in stderr
    assert not connected(target)


def test_a_coordinator_with_the_token_cannot_raise_a_workers_caps_or_allowlist(
    delay_server: DelayServer, listener: tuple[str, socket.socket]
) -> None:
    """The worker's own capacity.max_rate (50) and targets hold, whatever the run order says."""
    url, target = listener
    lenient = ProbeSettings(allowed_hosts=["*"], request_timeout_s=60)
    too_fast = spec_from_url(delay_server.url + "/delay?ms=1", rate=200, duration_s=1)
    not_allowed = spec_from_url(url.replace("127.0.0.1", "localhost"), rate=5, duration_s=1)
    allowed = spec_from_url(delay_server.url + "/delay?ms=1", rate=40, duration_s=0.5)

    async def main() -> tuple[list[str], int]:
        pool = WorkerPool(1, spawn=False, token=TOKEN, startup_s=30)
        address = await pool.open()
        worker = _worker(address[1], "--allow-target=127.0.0.1", env={"DIAGNOSER_CAPACITY__MAX_RATE": "50"})
        refusals = []
        try:
            await pool.wait_for_workers()
            for spec in (too_fast, not_allowed):
                with pytest.raises(ProbeWorkerError) as refused:
                    await pool.launch(spec, lenient, explicit_target=True).result()
                refusals.append(str(refused.value))
            result = await pool.launch(allowed, lenient, explicit_target=True).result()
        finally:
            await pool.aclose()
        worker.wait(timeout=30)
        return refusals, result.sent

    (rate, host), sent = run_event_loop(main())
    assert "refused" in rate and "exceeds the cap of 50 req/s" in rate
    assert "refused" in host and "'localhost' is not in probe.allowed_hosts" in host
    assert not connected(target)
    assert sent == 20  # what its limits allow, it runs


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_strangers_cannot_make_the_coordinator_buffer_before_the_handshake(delay_server: DelayServer) -> None:
    """Twenty connections each sending 4 MiB without a newline to a real ``diagnose capacity``."""
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "diagnoser", "capacity", delay_server.url + "/delay", "--slo-p99-ms", "50",
         "--remote-workers", "1", "--listen", f"127.0.0.1:{port}", "--steps", "10", "--step-s", "1"],
        env={**CLEAN_ENV, "DIAGNOSER_WORKER_TOKEN": TOKEN}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and coordinator.poll() is None, coordinator.communicate()
                time.sleep(0.1)
        time.sleep(0.5)
        before = _rss_kb(coordinator.pid)
        closed = 0
        chunk = b"x" * 65536
        strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        for stranger in strangers:
            stranger.settimeout(5)
            try:
                for _ in range(64):  # 4 MiB
                    stranger.sendall(chunk)
                closed += stranger.recv(1) == b""  # the coordinator closed it
            except (ConnectionResetError, BrokenPipeError):  # closed with our bytes unread
                closed += 1
            except TimeoutError:  # still open, still reading
                pass
        time.sleep(1.0)
        grown_kb = _rss_kb(coordinator.pid) - before
        for stranger in strangers:
            stranger.close()
    finally:
        coordinator.kill()
        coordinator.wait()
    # Before the handshake the coordinator holds at most a few KiB per stranger (it held 4 MiB each:
    # 80 MiB here). 16 MiB leaves room for the allocator's own slack on a busy machine.
    assert closed == 20  # each was cut off, not read to the end
    assert grown_kb < 16 * 1024, f"the coordinator grew by {grown_kb} KiB"


def test_a_worker_reads_no_file_a_coordinator_names(tmp_path: Path) -> None:
    """A body file is read by the coordinator and sent inline; a worker told to read one refuses."""
    from diagnoser.errors import ProbeSafetyError
    from diagnoser.probe.spec import with_bodies_inline
    from diagnoser.probe.worker import WorkerLimits

    body = tmp_path / "body.json"
    body.write_text('{"user": 42}')
    spec = spec_from_url("http://127.0.0.1:9/", rate=5, duration_s=1).model_copy(update={"body_file": body})
    with pytest.raises(ProbeSafetyError, match="a worker reads no file"):
        WorkerLimits.allowing("127.0.0.1").check(spec.model_copy(update={"body_file": Path("/etc/shadow")}),
                                                 ProbeSettings())  # fmt: skip
    inline = with_bodies_inline(spec)
    assert (inline.body, inline.body_file) == ('{"user": 42}', None)
    WorkerLimits.allowing("127.0.0.1").check(inline, ProbeSettings())  # what the coordinator sends: allowed
