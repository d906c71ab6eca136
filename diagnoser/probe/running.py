"""A probe run as the commands drive it, in this process or spread over worker processes.

Both kinds of run offer the same four things (:class:`RunningProbe`): ``result()`` runs it,
``stop(reason)`` ends it early, ``live()`` feeds a progress line and ``tally()`` a capacity
step's watcher. A :class:`Launcher` starts one from a spec: :class:`InProcess` here, or a
:class:`~diagnoser.probe.workers.WorkerPool` of processes or pods. The spec travels as a
model, so whatever the open loop sends (HTTP/1.1 today) a worker runs it the same way.
"""

from __future__ import annotations

import math
from typing import Protocol

from diagnoser.config import ProbeSettings
from diagnoser.probe.live import LiveStats, SlowCounter, Tally
from diagnoser.probe.open_loop import INTERRUPTED, ProbeRun
from diagnoser.probe.result import ProbeResult
from diagnoser.probe.spec import ProbeSpec, check_resolved_addresses
from diagnoser.probe.worker import usable_cores

__all__ = [
    "RATE_PER_WORKER",
    "InProcess",
    "Launcher",
    "LocalRun",
    "RunningProbe",
    "default_workers",
]

#: Below this rate per worker another process costs more than it gives (its start-up, a core
#: taken from the target when both share a machine): a rate up to the probe's ceiling runs in
#: one process, as the daemon's probe always does.
RATE_PER_WORKER = 1000.0


def default_workers(rate: float, cores: int | None = None) -> int:
    """One worker per usable core, no more than the rate needs (one per ``RATE_PER_WORKER``)."""
    available = cores if cores is not None else usable_cores()
    return max(1, min(available, math.ceil(rate / RATE_PER_WORKER)))


class RunningProbe(Protocol):
    """One run, however many processes send it."""

    async def result(self) -> ProbeResult: ...

    def stop(self, reason: str = INTERRUPTED) -> None: ...

    def live(self) -> LiveStats: ...

    def tally(self) -> Tally: ...


class Launcher(Protocol):
    """Starts runs: in this process (:class:`InProcess`) or on workers."""

    def launch(
        self, spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool, slow_ms: float | None = None
    ) -> RunningProbe: ...


class LocalRun:
    """A run in this process: the resolved-address check, then the open loop."""

    def __init__(
        self, spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool, slow_ms: float | None = None
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.explicit_target = explicit_target
        self.run = ProbeRun(spec, settings, explicit_target=explicit_target)
        self._counter = SlowCounter(self.run.recorder, slow_ms)

    async def result(self) -> ProbeResult:
        await check_resolved_addresses(self.spec, self.settings, explicit_target=self.explicit_target)
        return await self.run.run()

    def stop(self, reason: str = INTERRUPTED) -> None:
        self.run.stop(reason)

    def live(self) -> LiveStats:
        return self.run.live()

    def tally(self) -> Tally:
        return self._counter.tally()


class InProcess:
    """The launcher of runs in this process (one worker: the daemon's, ``now --probe``'s)."""

    workers = 1

    def launch(
        self, spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool, slow_ms: float | None = None
    ) -> LocalRun:
        return LocalRun(spec, settings, explicit_target=explicit_target, slow_ms=slow_ms)
