"""The coordinator's side of the worker protocol: a pool of workers and one run spread over them.

::

    pool = WorkerPool(4)                      # four local processes, one event loop each
    await pool.start()                        # spawned, connected, through the barrier
    run = pool.launch(spec, settings, explicit_target=True)
    result = await run.result()               # one ProbeResult, histograms merged exactly
    await pool.aclose()

``WorkerPool(n, spawn=False, listen=("10.0.0.5", 7070), token=token)`` waits instead for ``n``
workers started elsewhere (the pods of ``diagnose capacity --on-cluster``, or ``diagnose worker``
processes): nothing is sent until all of them have passed the handshake of
:mod:`~diagnoser.probe.wire` (each side proves it holds the run's token, which never crosses the
wire), and every run starts at one wall-clock instant on all of them. The processes it spawns
itself get ``limits``, the caps and targets they enforce on what they are told
(:class:`~diagnoser.probe.worker.WorkerLimits`). Worker ``i`` of ``n`` sends every n-th request
from the i-th, so the aggregate schedule is the one a single process would send, evenly spaced.

A worker that dies, closes its connection, reports an error or goes silent for
:data:`SILENCE_LIMIT_S` fails the run with :class:`~diagnoser.errors.ProbeWorkerError` (the
others are stopped); a pool that lost a worker runs nothing more. A worker that aborts on its
error ratio stops every other one with its reason, as Ctrl-C and the caps do.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from diagnoser.config import ProbeSettings
from diagnoser.errors import ConfigError, ProbeWorkerError
from diagnoser.probe.live import LiveStats, Tally
from diagnoser.probe.open_loop import INTERRUPTED, SCHEDULE_LAG_LIMIT_MS
from diagnoser.probe.parts import RunPart, latency_p99, merge_parts
from diagnoser.probe.result import ProbeResult, TailSums, shares_from
from diagnoser.probe.spec import ProbeSpec, with_bodies_inline
from diagnoser.probe.wire import Channel, check_token, coordinator_handshake, new_token
from diagnoser.probe.worker import TOKEN_ENV, WorkerLimits

__all__ = ["SILENCE_LIMIT_S", "PooledRun", "WorkerPool"]

#: A worker that says nothing for this long is taken for dead. A process that exits closes its
#: connection and is seen at once; this is for one hung or cut off, and leaves room for a long
#: run's histograms to be built (the loop is busy a few seconds per ten million requests).
SILENCE_LIMIT_S = 30.0
#: Seconds between the run order and the common start: every worker has its loop ready by then.
_START_LEAD_S = 0.3
_STARTUP_S = 30.0
#: Connections still in their handshake at once; any more are closed on arrival (a stranger
#: opening connections by the thousand holds no more than this many small buffers).
_MAX_HANDSHAKES = 64
#: What a local worker process runs (``-m diagnoser.probe.worker`` would import the module twice).
_WORKER_MAIN = "import sys; from diagnoser.probe.worker import main; sys.exit(main())"


@dataclass
class _Worker:
    index: int
    channel: Channel
    pid: int | None = None
    process: asyncio.subprocess.Process | None = None
    last_heard: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        return f"worker {self.index}" + (f" (pid {self.pid})" if self.pid else "")


class WorkerPool:
    """``count`` workers: spawned here as local processes, or awaited from elsewhere."""

    def __init__(
        self,
        count: int,
        *,
        spawn: bool = True,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        token: str | None = None,
        startup_s: float = _STARTUP_S,
        limits: WorkerLimits | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("a worker pool needs at least one worker")
        if token is not None:
            check_token(token, "the worker token")
        self.workers = count
        self.spawn = spawn
        self.listen = listen
        self.token = token if token is not None else new_token()
        self.startup_s = startup_s
        self.limits = limits if limits is not None else WorkerLimits()
        self._handshakes = 0
        self.address: tuple[str, int] | None = None
        self.broken: str | None = None
        self._members: dict[int, _Worker] = {}
        self._processes: list[asyncio.subprocess.Process] = []
        self._server: asyncio.Server | None = None
        self._all_here = asyncio.Event()
        self._run: PooledRun | None = None
        self._run_ids = itertools.count(1)
        self._readers: set[asyncio.Task[None]] = set()
        #: The parts of the last run (each worker's counters, histograms and CPU seconds).
        self.last_parts: list[RunPart] = []

    async def start(self) -> None:
        """Listen, spawn the local workers, and wait until every worker has said hello."""
        await self.open()
        await self.wait_for_workers()

    async def open(self) -> tuple[str, int]:
        """Listen (and spawn the local workers); the address listened on.

        Raises :class:`~diagnoser.errors.ConfigError` when the address cannot be listened on."""
        host, port = self.listen
        try:
            self._server = await asyncio.start_server(self._accept, host, port)
        except OSError as exc:
            raise ConfigError(f"--listen {host}:{port}: cannot listen there: {exc.strerror or exc}") from exc
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = (host, port)
        if self.spawn:
            await self._spawn(host, port)
        return self.address

    async def wait_for_workers(self) -> None:
        """The barrier: until all workers have said hello (``ProbeWorkerError`` after ``startup_s``)."""
        try:
            await asyncio.wait_for(self._barrier(), self.startup_s)
        except TimeoutError:
            here = sorted(self._members)
            await self.aclose()
            raise ProbeWorkerError(
                f"only {len(here)} of {self.workers} workers connected within {self.startup_s:g} s "
                f"(present: {here or 'none'})"
            ) from None

    async def _spawn(self, host: str, port: int) -> None:
        env = {**os.environ, **self.limits.environment(), TOKEN_ENV: self.token}
        for index in range(self.workers):
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _WORKER_MAIN, "--coordinator", f"{host}:{port}",
                "--index", str(index), *self.limits.arguments(), env=env, stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            self._processes.append(process)

    async def _barrier(self) -> None:
        while not self._all_here.is_set():
            for process in self._processes:
                if process.returncode is not None:
                    raise ProbeWorkerError(
                        f"a worker process (pid {process.pid}) exited with code {process.returncode} "
                        "before it connected"
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_here.wait(), 0.2)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = Channel(reader, writer, role="coordinator")
        if self._handshakes >= _MAX_HANDSHAKES:
            channel.close()
            return
        self._handshakes += 1
        try:
            hello = await coordinator_handshake(channel, self.token)
        except (ProbeWorkerError, OSError):
            channel.close()  # not one of ours: it learnt nothing, and nothing more is read
            return
        finally:
            self._handshakes -= 1
        index = hello["index"]
        if not 0 <= index < self.workers or index in self._members:
            channel.close()  # an index out of range, or a second worker with the same one
            return
        pid = hello.get("pid")
        worker = _Worker(index=index, channel=channel, pid=pid if isinstance(pid, int) else None)
        worker.process = next((p for p in self._processes if p.pid == worker.pid), None)
        self._members[worker.index] = worker
        if len(self._members) == self.workers:
            self._all_here.set()
        await self._read(worker)

    async def _read(self, worker: _Worker) -> None:
        while True:
            try:
                message = await worker.channel.receive()
            except ProbeWorkerError as exc:
                self._lost(worker, f"{worker.describe()}: {exc}")
                return
            if message is None:
                self._lost(worker, await self._why_gone(worker))
                return
            worker.last_heard = time.monotonic()
            if self._run is not None:
                self._run.on_message(worker, message)

    async def _why_gone(self, worker: _Worker) -> str:
        if worker.process is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.process.wait(), 1.0)
            code = worker.process.returncode
            if code is not None:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                return f"{worker.describe()} {how}"
        return f"{worker.describe()} closed its connection"

    def _lost(self, worker: _Worker, why: str) -> None:
        self._members.pop(worker.index, None)
        if self.broken is None:
            self.broken = why
        if self._run is not None:
            self._run.fail(why)

    def launch(
        self, spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool, slow_ms: float | None = None
    ) -> PooledRun:
        """A run of ``spec`` over every worker; ``await run.result()`` sends it."""
        if self.broken is not None:
            raise ProbeWorkerError(f"the worker pool lost a worker ({self.broken}); no run can start")
        if self._run is not None and not self._run.finished:
            raise RuntimeError("one run at a time on a worker pool")
        spec = with_bodies_inline(spec)  # a worker reads no file of its own (ConfigError here if it must)
        run = PooledRun(self, next(self._run_ids), spec, settings, explicit_target, slow_ms)
        self._run = run
        return run

    def members(self) -> list[_Worker]:
        return [self._members[i] for i in sorted(self._members)]

    async def aclose(self) -> None:
        """Tell every worker to exit, then make sure the local processes are gone."""
        for worker in self.members():
            with contextlib.suppress(OSError, RuntimeError):
                await worker.channel.send("exit")
                worker.channel.close()
        if self._server is not None:
            self._server.close()
        for process in self._processes:
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                process.kill()
                await process.wait()


class PooledRun:
    """One run over every worker of a pool: the run order, their live counters, the merge."""

    def __init__(
        self,
        pool: WorkerPool,
        run_id: int,
        spec: ProbeSpec,
        settings: ProbeSettings,
        explicit_target: bool,
        slow_ms: float | None,
    ) -> None:
        self.pool = pool
        self.run_id = run_id
        self.spec = spec
        self.settings = settings
        self.explicit_target = explicit_target
        self.slow_ms = slow_ms
        self.finished = False
        self._stop_reason: str | None = None
        self._failure: str | None = None
        self._live: dict[int, LiveStats] = {}
        self._tallies: dict[int, Tally] = {}
        self._parts: dict[int, RunPart] = {}
        self._tails: dict[int, TailSums] = {}
        self._changed = asyncio.Event()
        self._sends: set[asyncio.Task[None]] = set()
        #: The run orders went out: a stop can follow them.
        self._ordered = False

    # -- what the workers say -----------------------------------------------------------------

    def on_message(self, worker: _Worker, message: dict[str, Any]) -> None:
        if message.get("run_id") != self.run_id:
            return  # a late word about an earlier run
        kind = message["type"]
        try:
            if kind == "live":
                self._live[worker.index] = LiveStats(**message["live"])
                self._tallies[worker.index] = Tally(**message["tally"])
                reason = message.get("stopped")
                if reason and self._stop_reason is None:
                    self.stop(str(reason))  # one worker's abort stops them all
            elif kind == "part":
                self._parts[worker.index] = RunPart.model_validate(message["part"])
            elif kind == "tail":
                self._tails[worker.index] = TailSums.model_validate(message["sums"])
            elif kind == "error":
                self.fail(f"{worker.describe()}: {message.get('message')}")
        except (TypeError, ValueError, KeyError) as exc:
            self.fail(f"{worker.describe()} sent a malformed {kind} message: {exc}")
        self._changed.set()

    def fail(self, why: str) -> None:
        """A worker is gone or broke: the run fails, the others stop."""
        if self._failure is None:
            self._failure = why
            self.stop(f"a worker failed: {why}")
        self._changed.set()

    # -- control ------------------------------------------------------------------------------

    def stop(self, reason: str = INTERRUPTED) -> None:
        if self._stop_reason is not None or self.finished:
            return
        self._stop_reason = reason
        if self._ordered:  # else the run orders are not out yet: result() sends the stop after them
            self._broadcast("stop", reason=reason)

    def _broadcast(self, kind: str, **fields: Any) -> None:
        loop = asyncio.get_running_loop()
        for worker in self.pool.members():
            task = loop.create_task(self._send(worker, kind, **fields))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _send(self, worker: _Worker, kind: str, **fields: Any) -> None:
        try:
            await worker.channel.send(kind, run_id=self.run_id, **fields)
        except (OSError, RuntimeError) as exc:
            self.fail(f"{worker.describe()} could not be reached: {exc}")

    # -- the run ------------------------------------------------------------------------------

    async def result(self) -> ProbeResult:
        """Send the run to every worker, wait for their parts, merge them (exactly)."""
        try:
            members = self.pool.members()
            if len(members) != self.pool.workers:
                raise ProbeWorkerError(f"only {len(members)} of {self.pool.workers} workers are connected")
            start_at = time.time() + _START_LEAD_S
            # Whether the target was typed here is not told: each worker decides that by its
            # own --allow-target (WorkerLimits), as it applies its own caps.
            order = {
                "spec": self.spec.model_dump(mode="json"),
                "settings": self.settings.model_dump(mode="json"),
                "start_at": start_at,
                "slow_ms": self.slow_ms,
            }
            for worker in members:
                worker.last_heard = time.monotonic() + _START_LEAD_S
                await self._send(worker, "run", share=[worker.index, len(members)], **order)
            self._ordered = True
            if self._stop_reason is not None:  # stopped while the orders went out (Ctrl-C early)
                self._broadcast("stop", reason=self._stop_reason)
            await self._wait_for(self._parts, members)
            parts = [self._parts[w.index] for w in members]
            self._broadcast("tail", cut_ms=latency_p99(parts))
            await self._wait_for(self._tails, members)
            self.pool.last_parts = parts
            return merge_parts(
                parts,
                shares_from(self._tails.values()),
                target=self.spec.target,
                requested_rate=self.spec.mean_rate,
                lag_limit_ms=SCHEDULE_LAG_LIMIT_MS,
                abort_reason=self._stop_reason,
            )
        finally:
            self.finished = True

    async def _wait_for(self, answers: dict[int, Any], members: list[_Worker]) -> None:
        """Until every member has answered; a failure, or a member silent too long, raises.

        Silence counts from this wait's start at the earliest: a worker that finished its share
        first is quiet, not dead, while the others finish theirs."""
        since = time.monotonic()
        while True:
            if self._failure is not None:
                raise ProbeWorkerError(f"the run failed: {self._failure}")
            if all(w.index in answers for w in members):
                return
            now = time.monotonic()
            for worker in members:
                silent = now - max(worker.last_heard, since)
                if worker.index not in answers and silent > SILENCE_LIMIT_S:
                    self.fail(f"{worker.describe()} said nothing for {silent:.0f} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.5)

    # -- what the progress line and a step's watcher read -------------------------------------

    def live(self) -> LiveStats:
        views = list(self._live.values())
        p99s = [v.recent_p99_ms for v in views if v.recent_p99_ms is not None]
        return LiveStats(
            elapsed_s=max((v.elapsed_s for v in views), default=0.0),
            planned_s=self.spec.duration_s,
            sent=sum(v.sent for v in views),
            finished=sum(v.finished for v in views),
            failures=sum(v.failures for v in views),
            achieved_rate=sum(v.achieved_rate for v in views),
            recent_p99_ms=max(p99s) if p99s else None,  # the worst worker's: a view, not a measure
            in_flight=sum(v.in_flight for v in views),
        )

    def tally(self) -> Tally:
        tallies = list(self._tallies.values())
        return Tally(
            completed=sum(t.completed for t in tallies),
            failures=sum(t.failures for t in tallies),
            slow=sum(t.slow for t in tallies),
            scanned=sum(t.scanned for t in tallies),
            sent=sum(t.sent for t in tallies),
            finished=sum(t.finished for t in tallies),
            send_lag_s=max((t.send_lag_s for t in tallies), default=0.0),
        )
