"""A probe worker: connects to its coordinator, proves both sides hold the run's token, runs its share.

The same code runs as a local process (``diagnose probe --workers N``, ``diagnose capacity``)
and as a pod of the Indexed Job of ``diagnose capacity --on-cluster N``::

    diagnose worker --coordinator 10.0.0.5:7070 --index 3 --allow-target checkout.shop.svc
    python -c 'from diagnoser.probe.worker import main; main()' --coordinator 127.0.0.1:41234  # lighter

The token comes from ``$DIAGNOSER_WORKER_TOKEN`` and never crosses the wire
(:mod:`diagnoser.probe.wire`): a coordinator that cannot prove it holds it gets nothing run.

What a worker sends is bounded by its own :class:`WorkerLimits`, never by what it is told: its
caps (``capacity.max_rate`` and ``capacity.max_duration_s`` of its own configuration, for the
aggregate rate a spec asks; ``probe.request_timeout_s``, ``probe.max_connections`` and
``probe.abort_error_ratio`` taken as the lower of its own and the coordinator's), its allowlist
(``probe.allowed_hosts``) and the hosts its own command line names (``--allow-target``: as a URL
typed on its command line, with the address rule that goes with it). A coordinator that holds
the token still cannot raise any of them. Each run is a
:class:`~diagnoser.probe.open_loop.ProbeRun` of the spec, sending every n-th request of the
schedule (its ``share``) from the common ``start_at``; its part goes back without any response
body. A worker ignores Ctrl-C (the terminal sends it to the whole process group): its
coordinator stops it, and a closed connection ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diagnoser.config import CapacitySettings, ProbeSettings, load_settings
from diagnoser.errors import ConfigError, DiagnoserError, ProbeSafetyError
from diagnoser.probe.caps import LoadCaps, capacity_caps
from diagnoser.probe.live import SlowCounter
from diagnoser.probe.open_loop import ProbeRun
from diagnoser.probe.parts import RunPart
from diagnoser.probe.spec import ProbeSpec, check_resolved_addresses, enforce_safety
from diagnoser.probe.wire import Channel, check_token, worker_handshake

__all__ = [
    "TOKEN_ENV",
    "WorkerLimits",
    "main",
    "parse_address",
    "run_worker",
    "serve",
    "usable_cores",
    "worker_token",
]

#: The shared secret a worker and its coordinator prove to each other they hold.
TOKEN_ENV = "DIAGNOSER_WORKER_TOKEN"
_LIVE_EVERY_S = 0.25


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


@dataclass(frozen=True)
class WorkerLimits:
    """What a worker will send whatever its coordinator says: its own caps and allowlist.

    ``WorkerLimits.load(config, targets)`` reads them as ``diagnose worker`` does (its config file
    and ``DIAGNOSER_*`` variables); a coordinator that starts workers itself (local processes, the
    pods of its Job) hands them its own through :meth:`environment` and :meth:`arguments`, in the
    open: what a pod may do is written in its Job.
    """

    probe: ProbeSettings = field(default_factory=ProbeSettings)
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    #: Hosts this worker's own command line names (``--allow-target``), lower case.
    targets: frozenset[str] = frozenset()

    @classmethod
    def load(cls, config: Path | None = None, targets: Iterable[str] = ()) -> WorkerLimits:
        """A worker's own limits: ``config`` and the environment (``ConfigError`` if they do not load)."""
        settings = load_settings(config)
        return cls(settings.probe, settings.capacity, _hosts(targets))

    @classmethod
    def of(cls, probe: ProbeSettings, caps: LoadCaps, targets: Iterable[str] = ()) -> WorkerLimits:
        """The limits a coordinator gives the workers it starts: its own settings and caps."""
        capacity = CapacitySettings(max_rate=caps.max_rate, max_duration_s=caps.max_duration_s)
        return cls(probe, capacity, _hosts(targets))

    @classmethod
    def allowing(cls, *targets: str) -> WorkerLimits:
        """The default caps, and ``targets`` as if typed on the worker's command line."""
        return cls(targets=_hosts(targets))

    def environment(self) -> dict[str, str]:
        """These limits as the ``DIAGNOSER_*`` variables :meth:`load` reads."""
        probe, capacity = self.probe, self.capacity
        return {
            "DIAGNOSER_PROBE__ALLOWED_HOSTS": json.dumps(probe.allowed_hosts),
            "DIAGNOSER_PROBE__REQUEST_TIMEOUT_S": repr(probe.request_timeout_s),
            "DIAGNOSER_PROBE__MAX_CONNECTIONS": str(probe.max_connections),
            "DIAGNOSER_PROBE__ABORT_ERROR_RATIO": repr(probe.abort_error_ratio),
            "DIAGNOSER_CAPACITY__MAX_RATE": repr(capacity.max_rate),
            "DIAGNOSER_CAPACITY__MAX_DURATION_S": repr(capacity.max_duration_s),
        }

    def arguments(self) -> list[str]:
        """These limits' targets as ``diagnose worker`` arguments."""
        return [f"--allow-target={host}" for host in sorted(self.targets)]

    def check(self, spec: ProbeSpec, told: ProbeSettings) -> tuple[ProbeSettings, bool]:
        """The settings a run of ``spec`` gets here, and whether its host counts as typed by this
        worker's user; ``ProbeSafetyError`` for a spec these limits do not allow (or one that
        would have it read a local file: bodies come inline)."""
        if spec.body_file is not None:
            raise ProbeSafetyError("a worker reads no file (body_file): the coordinator sends the body")
        explicit = spec.host.strip("[]").lower() in self.targets
        own = self.probe
        settings = told.model_copy(
            update={
                "max_rate": own.max_rate,
                "max_duration_s": own.max_duration_s,
                "allowed_hosts": list(own.allowed_hosts),
                "request_timeout_s": min(told.request_timeout_s, own.request_timeout_s),
                "max_connections": min(told.max_connections, own.max_connections),
                "abort_error_ratio": min(told.abort_error_ratio, own.abort_error_ratio),
            }
        )
        enforce_safety(spec, settings, explicit_target=explicit, caps=capacity_caps(self.capacity))
        return settings, explicit


def _hosts(targets: Iterable[str]) -> frozenset[str]:
    return frozenset(t.strip().strip("[]").lower() for t in targets if t.strip())


def _without_bodies(part: RunPart) -> RunPart:
    """A part as it leaves the worker: the examples' kinds, statuses and sizes, none of their bodies."""
    examples = [e.model_copy(update={"body": None}) for e in part.counts.examples]
    return part.model_copy(update={"counts": part.counts.model_copy(update={"examples": examples})})


class _Session:
    """One worker's connection: the run it is sending and the last one's measurements."""

    def __init__(self, channel: Channel, limits: WorkerLimits) -> None:
        self.channel = channel
        self.limits = limits
        self.run: ProbeRun | None = None
        self.task: asyncio.Task[None] | None = None
        #: ``run_id -> reason`` of a stop that came while its run was still being set up.
        self._early_stops: dict[Any, str] = {}
        self._run_id: Any = None

    async def handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "run":
            if self.task is not None and not self.task.done():
                await self.channel.send(
                    "error", run_id=message.get("run_id"), message="a run is already in progress"
                )
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
            await self.channel.send("tail", run_id=message.get("run_id"), sums=sums.model_dump())

    async def _run(self, message: dict[str, Any]) -> None:
        run_id = message.get("run_id")
        try:
            spec = ProbeSpec.model_validate(message["spec"])
            told = ProbeSettings.model_validate(message["settings"])
            first, every = (int(v) for v in message["share"])
            if not 0 <= first < every:
                raise ValueError(f"share {first} of {every} is not one")
            settings, explicit = self.limits.check(spec, told)
            await check_resolved_addresses(spec, settings, explicit_target=explicit)
            start_at = time.monotonic() + max(0.0, float(message["start_at"]) - time.time())
            run = ProbeRun(spec, settings, explicit_target=explicit, share=(first, every), start_at=start_at)
        except (DiagnoserError, ValueError, KeyError, TypeError) as exc:
            await self.channel.send("error", run_id=run_id, message=f"refused: {exc}")
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
            await self.channel.send("error", run_id=run_id, message=f"{type(exc).__name__}: {exc}")
            return
        finally:
            ticker.cancel()
        await self._live(run_id, run, counter)
        part = _without_bodies(run.part(cpu_s=time.process_time() - cpu_before))
        await self.channel.send("part", run_id=run_id, part=part.model_dump(mode="json"))

    async def _tick(self, run_id: Any, run: ProbeRun, counter: SlowCounter) -> None:
        while True:
            await asyncio.sleep(_LIVE_EVERY_S)
            await self._live(run_id, run, counter)

    async def _live(self, run_id: Any, run: ProbeRun, counter: SlowCounter) -> None:
        await self.channel.send("live", run_id=run_id, live=asdict(run.live()),
                                tally=asdict(counter.tally()), stopped=run.stop_reason)  # fmt: skip

    def close(self) -> None:
        if self.run is not None:
            self.run.stop("the coordinator went away")


async def _connect(host: str, port: int, wait_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect, retrying while the coordinator is not listening yet (pods may start first)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await asyncio.open_connection(host, port)
        except OSError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)


async def serve(
    coordinator: str,
    index: int,
    token: str,
    limits: WorkerLimits | None = None,
    *,
    connect_wait_s: float = 60.0,
) -> int:
    """Serve one coordinator until it says exit or goes away; the process exit code.

    Raises :class:`ProbeWorkerError` when the coordinator does not prove it holds ``token``.
    """
    host, port = parse_address(coordinator)
    reader, writer = await _connect(host, port, connect_wait_s)
    channel = Channel(reader, writer, role="worker")
    session = _Session(channel, limits if limits is not None else WorkerLimits())
    try:
        await worker_handshake(channel, token, index=index, pid=os.getpid(), cores=usable_cores())
        while (message := await channel.receive()) is not None and message["type"] != "exit":
            await session.handle(message)
    finally:
        session.close()
        if session.task is not None:
            session.task.cancel()
            with contextlib.suppress(BaseException):
                await session.task
        channel.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diagnoser-worker")
    parser.add_argument("--coordinator", required=True, help="host:port the coordinator listens on")
    parser.add_argument("--index", type=int, default=int(os.environ.get("JOB_COMPLETION_INDEX", "0")))
    parser.add_argument("--allow-target", action="append", default=[], help="a host this worker may probe")
    args = parser.parse_args(argv)
    try:
        limits = WorkerLimits.load(None, args.allow_target)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return run_worker(args.coordinator, args.index, limits)


def worker_token() -> str:
    """``$DIAGNOSER_WORKER_TOKEN``, checked (``ConfigError`` when missing or under 128 bits)."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ConfigError(f"set {TOKEN_ENV}: the token a coordinator and its workers share")
    try:
        check_token(token, TOKEN_ENV)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return token


def run_worker(coordinator: str, index: int, limits: WorkerLimits) -> int:
    """Run a worker in this process (the ``diagnose worker`` command and ``python -c``).

    Exit codes: 0 after the coordinator's exit, 1 when it cannot be reached or does not prove
    it holds the token, 2 for a missing or short token.
    """
    from diagnoser.probe.entry import run_event_loop

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        token = worker_token()
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    try:
        return run_event_loop(serve(coordinator, index, token, limits))
    except (OSError, DiagnoserError, ValueError) as exc:
        sys.stderr.write(f"diagnoser worker {index}: {exc}\n")
        return 1
