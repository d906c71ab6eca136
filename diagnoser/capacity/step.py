"""One step of the search: a constant open-loop rate for a while, measured and judged.

A step is one run of the target's probe definition with a constant schedule, started by the
run's launcher (in this process, or over worker processes or pods whose results are merged
exactly) and checked against the load test's caps (a step above ``capacity.max_rate`` or longer
than ``capacity.max_duration_s`` is refused before it sends anything).
While it runs, a watcher reads the probe's live counters every quarter second to

- stop the step as soon as its verdict can no longer change: once more than 1 % of the requests
  it plans to send are slower than the SLO, its p99 is over the SLO whatever follows, and once
  more than the allowed share of them failed, so is its error ratio. An overloaded step then
  costs a few seconds of overload instead of a full step. It runs at least ``min_step_s``
  first, so that Prometheus has scraped enough of it to show what gave way;
- measure the *served* rate (answers per second over the second half of what ran), which is
  about the service's capacity when the step overloads it;
- sample what is in flight and how far the sender is behind its schedule, to judge whether the
  step reached a steady state at all (:mod:`diagnoser.capacity.sustain`): one that did not fails,
  whatever its p99;
- feed the live progress line.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from diagnoser.capacity.report import Unsustainable
from diagnoser.capacity.sustain import StepSample, judge_sustain
from diagnoser.config import ProbeSettings
from diagnoser.probe import LiveStats, ProbeResult, ProbeSpec, enforce_safety
from diagnoser.probe.caps import LoadCaps
from diagnoser.probe.open_loop import INTERRUPTED
from diagnoser.probe.running import Launcher, RunningProbe
from diagnoser.probe.spec import ConstantSchedule

__all__ = ["StepMeasurement", "StepPlan", "Verdict", "run_step"]

#: Why a step did not hold.
Verdict = Literal["latency", "errors"]

_WATCH_EVERY_S = 0.25
#: Share of a step's planned requests over the SLO that settles its p99 over the SLO.
_P99_SHARE = 0.01

ProgressCallback = Callable[[float, LiveStats], None]


@dataclass(frozen=True)
class StepPlan:
    """What every step shares: the target definition, its time, and the SLO it is judged by."""

    spec: ProbeSpec
    explicit_target: bool
    step_s: float
    min_step_s: float
    slo_p99_ms: float
    max_error_ratio: float


@dataclass
class StepMeasurement:
    rate: float
    result: ProbeResult
    started_at: datetime
    #: When sending stopped: the instant the step's evidence is evaluated at.
    ended_at: datetime
    served_rate: float | None
    failed_on: Verdict | None
    stopped_early: bool
    interrupted: bool
    #: Set when the step reached no steady state (a growing backlog, a sender falling behind).
    unsustainable: Unsustainable | None = None

    @property
    def held(self) -> bool:
        return self.failed_on is None and not self.interrupted


class _Watcher:
    """Reads a running probe's tally; decides when its verdict is settled."""

    def __init__(self, run: RunningProbe, plan: StepPlan, rate: float) -> None:
        self.run = run
        self.plan = plan
        planned = rate * plan.step_s
        self.slow_allowed = _P99_SHARE * planned
        self.failures_allowed = plan.max_error_ratio * planned
        self.slow = 0
        self.failures = 0
        self._scanned = 0
        self.settled: Verdict | None = None
        self.samples: list[StepSample] = []

    def check(self, elapsed: float, *, sending: bool = True) -> None:
        tally = self.run.tally()
        self.slow, self.failures, self._scanned = tally.slow, tally.failures, tally.scanned
        if sending:
            # Answers after sending stopped are the queue draining: not a rate the load held.
            sample = StepSample(elapsed, tally.completed, tally.sent, tally.in_flight, tally.send_lag_s)
            self.samples.append(sample)
        if self.settled is None:
            if self.failures > self.failures_allowed:
                self.settled = "errors"
            elif self.slow > self.slow_allowed:
                self.settled = "latency"

    @property
    def clean(self) -> bool:
        """Not one answer so far slower than the SLO or failed."""
        return self.slow == 0 and not self.failures and self._scanned > 0

    def served_rate(self) -> float | None:
        """Answers per second over the second half of the samples."""
        if len(self.samples) < 3:
            return None
        first = self.samples[len(self.samples) // 2]
        last = self.samples[-1]
        span = last.elapsed_s - first.elapsed_s
        return round((last.completed - first.completed) / span, 1) if span >= 0.5 else None


async def run_step(
    plan: StepPlan,
    settings: ProbeSettings,
    rate: float,
    *,
    launcher: Launcher,
    caps: LoadCaps,
    on_start: Callable[[RunningProbe], None],
    on_progress: ProgressCallback | None = None,
    scout: bool = False,
) -> StepMeasurement:
    """Run one step at ``rate``; ``on_start`` receives the run so that Ctrl-C can stop it.

    A ``scout`` step (while the search climbs) also stops after ``min_step_s`` when not one
    answer so far was slower than the SLO or failed: far below the knee, the rest of the step
    would only confirm it. Its verdict is still computed from everything it sent.
    """
    schedule = ConstantSchedule(rate=rate, duration_s=plan.step_s)
    spec = plan.spec.model_copy(update={"schedule": schedule})
    enforce_safety(spec, settings, explicit_target=plan.explicit_target, caps=caps)
    run = launcher.launch(spec, settings, explicit_target=plan.explicit_target, slow_ms=plan.slo_p99_ms)
    watcher = _Watcher(run, plan, rate)
    on_start(run)
    started_wall, started = datetime.now(UTC), time.monotonic()
    task = asyncio.get_running_loop().create_task(run.result())
    stopped_early = False
    while not task.done():
        await asyncio.wait({task}, timeout=_WATCH_EVERY_S)
        elapsed = time.monotonic() - started
        if elapsed > plan.step_s + 0.1:
            continue  # sending is over: the probe is collecting the last answers
        watcher.check(elapsed, sending=not stopped_early)
        if on_progress is not None:
            on_progress(rate, run.live())
        if elapsed >= plan.min_step_s and not stopped_early and not task.done():
            if watcher.settled:
                stopped_early = True
                run.stop(f"the step's {watcher.settled} verdict was settled")
            elif scout and watcher.clean:
                stopped_early = True
                run.stop("the scouting step held")
    result = task.result()
    watcher.check(plan.step_s, sending=False)
    interrupted = result.abort_reason == INTERRUPTED
    unsustainable = None if interrupted else judge_sustain(watcher.samples, rate)
    failed_on = None if interrupted else _verdict(result, plan, watcher.settled, stopped_early)
    if unsustainable is not None and failed_on is None:
        failed_on = "latency"  # its latency grew through the step: a longer step would show it
    return StepMeasurement(
        rate=rate,
        result=result,
        started_at=started_wall,
        ended_at=started_wall + timedelta(seconds=result.duration_s),
        served_rate=watcher.served_rate(),
        failed_on=failed_on,
        stopped_early=stopped_early,
        interrupted=interrupted,
        unsustainable=unsustainable,
    )


def _verdict(
    result: ProbeResult, plan: StepPlan, settled: Verdict | None, stopped_here: bool
) -> Verdict | None:
    """``None`` when the step held; else ``"latency"`` or ``"errors"``."""
    if settled is not None:
        return settled
    if (result.aborted and not stopped_here) or result.error_ratio > plan.max_error_ratio:
        return "errors"  # the probe's own abort rule stopped it: too many errors
    p99 = result.latency_ms.p99
    if p99 is None or math.isnan(p99) or p99 > plan.slo_p99_ms:
        return "latency"
    return None
