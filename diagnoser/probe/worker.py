"""A probe worker: connects to its coordinator, runs its share of each run, reports it.

The same code runs as a local process (``diagnose probe --workers N``, ``diagnose capacity``)
and as a pod of the Indexed Job of ``diagnose capacity --on-cluster N``::

    diagnose worker --coordinator 10.0.0.5:7070 --index 3   # token in $DIAGNOSER_WORKER_TOKEN
    python -c 'from diagnoser.probe.worker import main; main()' --coordinator 127.0.0.1:41234  # lighter

Each run is a :class:`~diagnoser.probe.open_loop.ProbeRun` of the spec it is given, sending
every n-th request of the schedule (its ``share``), from the common ``start_at``. A worker checks
the spec against the load-test ceilings and the target's resolved addresses itself, so a worker
never sends more than a single diagnoser process could be asked to. It ignores Ctrl-C (the
terminal sends it to the whole process group): its coordinator stops it, and a closed
connection ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import asdict
from typing import Any

from diagnoser.config import (
    CAPACITY_MAX_DURATION_CEILING_S,
    CAPACITY_MAX_RATE_CEILING,
    CapacitySettings,
    ProbeSettings,
)
from diagnoser.errors import DiagnoserError
from diagnoser.probe.caps import capacity_caps
from diagnoser.probe.live import SlowCounter
from diagnoser.probe.open_loop import ProbeRun
from diagnoser.probe.spec import ProbeSpec, check_resolved_addresses, enforce_safety
from diagnoser.probe.wire import MAX_MESSAGE_BYTES, read_message, send_message

__all__ = ["TOKEN_ENV", "main", "parse_address", "run_worker", "serve", "usable_cores"]

#: The shared secret a worker proves it belongs to this coordinator with.
TOKEN_ENV = "DIAGNOSER_WORKER_TOKEN"
_LIVE_EVERY_S = 0.25
#: A worker's own ceilings: the hard ones, whatever its coordinator was configured with.
_HARD_CAPS = capacity_caps(
    CapacitySettings(max_rate=CAPACITY_MAX_RATE_CEILING, max_duration_s=CAPACITY_MAX_DURATION_CEILING_S)
)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, a container's cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) to a pair; raises ``ValueError`` naming the text."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r}: give host:port, e.g. 127.0.0.1:7070")
    return host.strip("[]"), int(port)


class _Session:
    """One worker's connection: the run it is sending and the last one's measurements."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.run: ProbeRun | None = None
        self.task: asyncio.Task[None] | None = None
        #: ``run_id -> reason`` of a stop that came while its run was still being set up.
        self._early_stops: dict[Any, str] = {}
        self._run_id: Any = None

    async def handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "run":
            if self.task is not None and not self.task.done():
                await send_message(self.writer, "error", run_id=message.get("run_id"),
                                   message="a run is already in progress")  # fmt: skip
                return
            self.task = asyncio.get_running_loop().create_task(self._run(message))
        elif kind == "stop":
            reason = str(message.get("reason") or "stopped by the coordinator")
            if self.run is not None and self._run_id == message.get("run_id"):
                self.run.stop(reason)
            else:
                self._early_stops[message.get("run_id")] = reason
        elif kind == "tail" and self.run is not None:
            sums = self.run.recorder.tail_sums(message.get("cut_ms"))
            await send_message(self.writer, "tail", run_id=message.get("run_id"), sums=sums.model_dump())

    async def _run(self, message: dict[str, Any]) -> None:
        run_id = message.get("run_id")
        try:
            spec = ProbeSpec.model_validate(message["spec"])
            settings = ProbeSettings.model_validate(message["settings"])
            explicit = bool(message["explicit_target"])
            first, every = (int(v) for v in message["share"])
            enforce_safety(spec, settings, explicit_target=explicit, caps=_HARD_CAPS)
            await check_resolved_addresses(spec, settings, explicit_target=explicit)
            start_at = time.monotonic() + max(0.0, float(message["start_at"]) - time.time())
            run = ProbeRun(spec, settings, explicit_target=explicit, share=(first, every), start_at=start_at)
        except (DiagnoserError, ValueError, KeyError, TypeError) as exc:
            await send_message(self.writer, "error", run_id=run_id, message=f"refused: {exc}")
            return
        self.run, self._run_id = run, run_id
        if run_id in self._early_stops:
            run.stop(self._early_stops.pop(run_id))
        counter = SlowCounter(run.recorder, message.get("slow_ms"))
        cpu_before = time.process_time()
        ticker = asyncio.get_running_loop().create_task(self._tick(run_id, run, counter))
        try:
            await run.send()
        except Exception as exc:  # report it: the coordinator fails the run with this text
            await send_message(self.writer, "error", run_id=run_id, message=f"{type(exc).__name__}: {exc}")
            return
        finally:
            ticker.cancel()
        await self._live(run_id, run, counter)
        part = run.part(cpu_s=time.process_time() - cpu_before)
        await send_message(self.writer, "part", run_id=run_id, part=part.model_dump(mode="json"))

    async def _tick(self, run_id: Any, run: ProbeRun, counter: SlowCounter) -> None:
        while True:
            await asyncio.sleep(_LIVE_EVERY_S)
            await self._live(run_id, run, counter)

    async def _live(self, run_id: Any, run: ProbeRun, counter: SlowCounter) -> None:
        await send_message(self.writer, "live", run_id=run_id, live=asdict(run.live()),
                           tally=asdict(counter.tally()), stopped=run.stop_reason)  # fmt: skip

    def close(self) -> None:
        if self.run is not None:
            self.run.stop("the coordinator went away")


async def _connect(host: str, port: int, wait_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect, retrying while the coordinator is not listening yet (pods may start first)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await asyncio.open_connection(host, port, limit=MAX_MESSAGE_BYTES)
        except OSError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)


async def serve(coordinator: str, index: int, token: str, *, connect_wait_s: float = 60.0) -> int:
    """Serve one coordinator until it says exit or goes away; the process exit code."""
    host, port = parse_address(coordinator)
    reader, writer = await _connect(host, port, connect_wait_s)
    await send_message(writer, "hello", index=index, token=token, pid=os.getpid(), cores=usable_cores())
    session = _Session(writer)
    try:
        while (message := await read_message(reader)) is not None and message["type"] != "exit":
            await session.handle(message)
    finally:
        session.close()
        if session.task is not None:
            session.task.cancel()
            with contextlib.suppress(BaseException):
                await session.task
        writer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diagnoser-worker")
    parser.add_argument("--coordinator", required=True, help="host:port the coordinator listens on")
    parser.add_argument("--index", type=int, default=int(os.environ.get("JOB_COMPLETION_INDEX", "0")))
    args = parser.parse_args(argv)
    return run_worker(args.coordinator, args.index)


def run_worker(coordinator: str, index: int) -> int:
    """Run a worker in this process (the ``diagnose worker`` command and ``python -m``)."""
    from diagnoser.probe.entry import run_event_loop

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    token = os.environ.get(TOKEN_ENV, "")
    try:
        return run_event_loop(serve(coordinator, index, token))
    except (OSError, DiagnoserError, ValueError) as exc:
        sys.stderr.write(f"diagnoser worker {index}: {exc}\n")
        return 1

