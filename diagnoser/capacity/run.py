"""The capacity run: steps chosen by the search, each measured, its evidence evaluated, then the report.

Steps run one after another, never overlapping: after each, the probe waits for its in-flight
answers (the service's queue empties), the rule pack is evaluated as of the step's end over a
window covering just that step (:meth:`DiagnosisConfig.with_window`), once Prometheus holds the step's last
scrape (:mod:`diagnoser.capacity.evidence`), and a short pause separates it from the next so
that no step's window sees the previous step's load. The rule pack is only evaluated
when a Prometheus is configured; without one the capacity is still found.

A run stops with a partial report on Ctrl-C (:meth:`CapacityRun.stop`), on the probe's abort
rule, when the maximum rate holds, or when the step budget is spent. ::

    run = CapacityRun(plan, CapacityInputs.from_settings(settings), options)
    report = await run.run()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from diagnoser.capacity.bottleneck import EvaluatedStep, find_bottleneck, finding_key
from diagnoser.capacity.evidence import evaluate_step
from diagnoser.capacity.report import CapacityReport, CapacityStep, Limit, SloTarget, StepLatency
from diagnoser.capacity.search import RateSearch
from diagnoser.capacity.shedding import load_shedding
from diagnoser.capacity.step import ProgressCallback, StepMeasurement, StepPlan, run_step
from diagnoser.config import CapacitySettings, ProbeSettings
from diagnoser.engine.config import DiagnosisConfig
from diagnoser.engine.run import BuiltSources, build_sources, load_ruleset
from diagnoser.errors import ProbeWorkerError
from diagnoser.models import Diagnosis, SourceError
from diagnoser.probe.caps import LoadCaps, capacity_caps
from diagnoser.probe.running import InProcess, Launcher, RunningProbe
from diagnoser.ruleset import RuleSet

if TYPE_CHECKING:
    from diagnoser.config import Settings

__all__ = ["CapacityInputs", "CapacityOptions", "CapacityRun"]

log = logging.getLogger(__name__)

#: A step whose served rate is below this share of its offered rate could not keep up.
_SATURATED_SHARE = 0.97


@dataclass(frozen=True)
class CapacityInputs:
    """What a capacity run reads of the settings: each step's diagnosis, the probe's settings
    and the load test's caps (``capacity.*``)."""

    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    caps: LoadCaps = field(default_factory=lambda: capacity_caps(CapacitySettings()))

    @classmethod
    def from_settings(cls, settings: Settings) -> CapacityInputs:
        return cls(DiagnosisConfig.from_settings(settings), settings.probe, capacity_caps(settings.capacity))


@dataclass(frozen=True)
class CapacityOptions:
    start_rate: float
    max_rate: float
    growth: float = 2.0
    precision: float = 0.1
    fixed_steps: list[float] | None = None
    #: Quiet seconds between steps, after the previous step's answers are all in.
    pause_s: float = 1.0
    #: Seconds of unjudged load at the start rate before the first step.
    warmup_s: float = 2.0
    #: Cut climbing steps short once they clearly hold (the capacity is confirmed by a full step).
    scout: bool = True
    max_steps: int = 16
    expect_rps: float | None = None


@dataclass
class _Step:
    measurement: StepMeasurement
    diagnosis: Diagnosis | None
    #: False for a latency failure that was run again and so does not count (see ``_noise``).
    counted: bool = True


def _backlog(step: StepMeasurement) -> bool:
    """The step's backlog grew while its sender kept its schedule (:mod:`.sustain`)."""
    return step.unsustainable is not None and step.unsustainable.cause == "backlog"


def _saturated(step: StepMeasurement) -> bool:
    """The service could not keep up: it answered below the offered rate, or its backlog grew."""
    if _backlog(step):
        return True
    return step.served_rate is not None and step.served_rate < step.rate * _SATURATED_SHARE


class CapacityRun:
    """One ``diagnose capacity`` run; ``stop()`` (Ctrl-C) ends it with a partial report."""

    def __init__(
        self,
        plan: StepPlan,
        inputs: CapacityInputs,
        options: CapacityOptions,
        *,
        rules: RuleSet | None = None,
        on_progress: ProgressCallback | None = None,
        on_step: Callable[[CapacityStep], None] | None = None,
        launcher: Launcher | None = None,
        caps: LoadCaps | None = None,
    ) -> None:
        """``launcher`` sends each step (default: this process; a
        :class:`~diagnoser.probe.workers.WorkerPool` for processes or pods); ``caps``: the load
        test's, ``inputs.caps`` by default."""
        self.plan = plan
        self.launcher: Launcher = launcher if launcher is not None else InProcess()
        self.caps = caps if caps is not None else inputs.caps
        #: Why the run ended without an answer: a worker died during a step.
        self.worker_failure: str | None = None
        self.diagnosis = inputs.diagnosis
        self.probe = inputs.probe
        self.options = options
        self.rules = rules
        self.on_progress = on_progress
        self.on_step = on_step
        self.search = RateSearch(
            start_rate=options.start_rate,
            max_rate=options.max_rate,
            growth=options.growth,
            precision=options.precision,
            fixed_steps=options.fixed_steps,
        )
        self._current: RunningProbe | None = None
        self._stopped = asyncio.Event()

    @property
    def stopped(self) -> asyncio.Event:
        """Set once :meth:`stop` was called (Ctrl-C)."""
        return self._stopped

    def stop(self) -> None:
        """End the run now: the running step stops, its partial numbers are kept, no step follows."""
        self._stopped.set()
        if self._current is not None:
            self._current.stop()

    def _started(self, run: RunningProbe) -> None:
        self._current = run
        if self._stopped.is_set():
            run.stop()

    async def run(self) -> CapacityReport:
        config = self.diagnosis
        sources = build_sources(config.sources) if config.sources.prometheus.url else None
        rules = self.rules if self.rules is not None or sources is None else load_ruleset(config.rules)
        steps: list[_Step] = []
        try:
            await self._steps(steps, sources, rules)
        except ProbeWorkerError as exc:
            # The step did not run at its rate: it counts for nothing, and no step follows.
            self.worker_failure = str(exc)
            log.error("capacity run stopped: %s", exc)
        finally:
            if sources is not None:
                await sources.aclose()
        return self._report(steps, sources)

    async def _warm_up(self) -> None:
        """A short unjudged run at the start rate: connections opened, caches and pools filled."""
        if self.options.warmup_s <= 0:
            return
        rate = self.search.next_rate()
        if rate is not None:
            plan = replace(self.plan, step_s=self.options.warmup_s, min_step_s=self.options.warmup_s)
            await run_step(plan, self.probe, rate, launcher=self.launcher, caps=self.caps,
                           on_start=self._started)  # fmt: skip
            await self._pause()

    async def _pause(self, quiet_since: float | None = None) -> None:
        """The quiet time between steps; the part since ``quiet_since`` (monotonic) counts towards it."""
        left = self.options.pause_s - (time.monotonic() - quiet_since if quiet_since is not None else 0.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), max(0.0, left))

    async def _steps(self, steps: list[_Step], sources: BuiltSources | None, rules: RuleSet | None) -> None:
        await self._warm_up()
        retried: set[float] = set()
        quiet_since: float | None = None
        while not self._stopped.is_set() and len(steps) < self.options.max_steps:
            rate = self.search.next_rate()
            if rate is None:
                return
            if steps:
                # Waiting for the last step's scrapes was quiet time too.
                await self._pause(quiet_since)
                if self._stopped.is_set():
                    return
            # Climbing steps scout (see run_step); a rate run again to confirm it never does.
            scout = self.options.scout and not self.search.failed and rate not in self.search.scouted
            measurement = await run_step(
                self.plan,
                self.probe,
                rate,
                launcher=self.launcher,
                caps=self.caps,
                on_start=self._started,
                on_progress=self.on_progress,
                scout=scout and self.options.fixed_steps is None,
            )
            diagnosis = None
            quiet_since = time.monotonic()
            if sources is not None and rules is not None and not measurement.interrupted:
                diagnosis = await self._evaluate(measurement, sources, rules)
            step = _Step(measurement, diagnosis)
            steps.append(step)
            if self._noise(measurement, retried):
                step.counted = False  # the search asks for the same rate again
            if self.on_step is not None:
                self.on_step(_step_view(step, steps[:-1]))
            if measurement.interrupted:
                return
            if step.counted:
                self.search.record(
                    rate,
                    held=measurement.held,
                    served_rate=measurement.served_rate,
                    scouted=measurement.stopped_early,
                )
            if measurement.result.aborted and not measurement.stopped_early:
                return  # the probe's own abort rule: no further step, whatever the search says

    def _noise(self, step: StepMeasurement, retried: set[float]) -> bool:
        """Whether a failed step is run once more before it counts.

        A p99 over the SLO can be one stall of the host (a few tens of milliseconds fail a step
        of a few seconds); a knee is sustained behaviour, so such a step counts only if it fails
        again. A step that could not keep up (served below offered) above a rate that held is
        overload, not a stall, and counts at once, as does a step that failed on errors.
        """
        if step.failed_on != "latency" or step.rate in retried:
            return False
        if _saturated(step) and any(rate < step.rate for rate in self.search.held):
            return False
        retried.add(step.rate)
        return True

    async def _evaluate(self, step: StepMeasurement, sources: BuiltSources, rules: RuleSet) -> Diagnosis:
        return await evaluate_step(
            rules, self.diagnosis, sources.sources, started_at=step.started_at, ended_at=step.ended_at
        )

    def _report(self, steps: list[_Step], sources: BuiltSources | None) -> CapacityReport:
        views: list[CapacityStep] = []
        for index, step in enumerate(steps):
            views.append(_step_view(step, steps[:index]))
        counted = [s for s in steps if s.counted]
        evaluated = [
            EvaluatedStep(
                rate=s.measurement.rate,
                held=s.measurement.held,
                failed_on=s.measurement.failed_on,
                findings=s.diagnosis.findings if s.diagnosis is not None else None,
            )
            for s in counted
        ]
        bottleneck, notes = find_bottleneck(evaluated)
        errors = self._errors(steps, sources)
        first_fail = _first_failing(counted)
        shedding = None
        if bottleneck is None and first_fail is not None and first_fail.measurement.failed_on == "errors":
            shedding = load_shedding(first_fail.measurement.rate, first_fail.measurement.result)
        if shedding is not None:
            # The probe's own counters name the limit; what the rule pack did not see is said once.
            bottleneck = shedding
            notes = [_SHEDDING_UNSEEN if sources is not None else _SHEDDING_UNLOOKED]
        if errors and notes and (bottleneck is None or shedding is not None):
            # Silence from a source that could not answer is not "nothing changed".
            notes = [
                f"the rule pack could not read every source ({errors[0]}), so the bottleneck may be "
                "one it could not see; see errors"
            ]
        limit, limit_notes = self._limit(counted)
        if (
            first_fail is not None
            and shedding is None  # the refusals set the knee, not the sender's CPU
            and not _backlog(first_fail.measurement)  # the sender kept its schedule; the service did not
            and first_fail.measurement.result.bottleneck == "scheduler"
        ):
            lag = first_fail.measurement.result.schedule_lag_ms.p99
            notes.append(
                f"at {first_fail.measurement.rate:g} req/s the probe itself fell behind its schedule "
                f"(lag p99 {lag} ms): the load generator's CPU may have set this knee, not the target; "
                "add workers (--workers, --on-cluster) or run it where nothing else competes for the cores"
            )
        retried = len(steps) - len(counted)
        if retried:
            notes.append(
                f"{retried} step(s) went over the SLO while the service kept up and were run again; "
                "only the second run counts (a stall of the host is not a knee)"
            )
        return CapacityReport(
            target=self.plan.spec.target,
            slo=SloTarget(p99_ms=self.plan.slo_p99_ms, error_ratio=self.plan.max_error_ratio),
            steps=views,
            capacity_rps=self.search.capacity,
            limit=limit,
            bottleneck=bottleneck,
            findings=list(first_fail.diagnosis.findings) if first_fail and first_fail.diagnosis else [],
            errors=errors,
            notes=[*limit_notes, *notes],
            max_rate=self.options.max_rate,
            expect_rps=self.options.expect_rps,
            evidence_checked=sources is not None,
        )

    def _errors(self, steps: list[_Step], sources: BuiltSources | None) -> list[SourceError]:
        errors: list[SourceError] = list(sources.errors) if sources is not None else []
        if self.worker_failure is not None:
            errors.append(SourceError(source="probe", message=self.worker_failure))
        for step in steps:
            for error in step.diagnosis.errors if step.diagnosis is not None else []:
                if error not in errors:
                    errors.append(error)
        return errors

    def _limit(self, steps: list[_Step]) -> tuple[Limit, list[str]]:
        if self.worker_failure is not None:
            return Limit.aborted, [
                f"a probe worker failed during a step ({self.worker_failure}): that step does not count "
                "and no step followed; the table is partial"
            ]
        if self._stopped.is_set() or any(s.measurement.interrupted for s in steps):
            return Limit.aborted, ["interrupted: the table is partial"]
        first_fail = _first_failing(steps)
        if first_fail is not None:
            return Limit(first_fail.measurement.failed_on or "latency"), []
        if steps and max(s.measurement.rate for s in steps) >= self.options.max_rate:
            return Limit.max_rate, [
                f"every step up to the maximum rate ({self.options.max_rate:g} req/s) held: "
                "the capacity is at least that (raise --max-rate, within capacity.max_rate, to look further)"
            ]
        if self.options.fixed_steps is not None and steps:
            return Limit.max_rate, ["every fixed step held"]
        return Limit.aborted, [f"stopped after {len(steps)} steps (--max-steps) before an answer"]


_SHEDDING_UNSEEN = (
    "nothing in Prometheus appeared or rose at the knee: the limit is the refusals the probe counted"
)
_SHEDDING_UNLOOKED = (
    "no Prometheus configured: what answers the refusals was not looked for (give --prometheus-url)"
)


def _first_failing(steps: list[_Step]) -> _Step | None:
    failing = [s for s in steps if s.measurement.failed_on is not None]
    return min(failing, key=lambda s: s.measurement.rate) if failing else None


def _causes(diagnosis: Diagnosis | None) -> list[str]:
    if diagnosis is None:
        return []
    return list(dict.fromkeys(f.cause for f in diagnosis.findings))


def _step_view(step: _Step, earlier: list[_Step]) -> CapacityStep:
    m, result = step.measurement, step.measurement.result
    lower = [s for s in earlier if s.counted and s.measurement.rate < m.rate and s.diagnosis is not None]
    new: list[str] = []
    if step.diagnosis is not None:
        below = max(lower, key=lambda s: s.measurement.rate) if lower else None
        known = {finding_key(f) for f in below.diagnosis.findings} if below and below.diagnosis else set()
        new = list(dict.fromkeys(f.cause for f in step.diagnosis.findings if finding_key(f) not in known))
    latency = result.latency_ms
    return CapacityStep(
        rate=m.rate,
        achieved_rate=result.achieved_rate,
        served_rate=m.served_rate,
        duration_s=result.duration_s,
        latency_ms=StepLatency(p50=latency.p50, p90=latency.p90, p99=latency.p99, max=latency.max),
        error_ratio=round(result.error_ratio, 6),
        held=m.held,
        failed_on=m.failed_on,
        unsustainable=m.unsustainable,
        stopped_early=m.stopped_early,
        counted=step.counted,
        sent=result.sent,
        failures=result.failures.total,
        findings=_causes(step.diagnosis),
        new_findings=new,
        started_at=m.started_at,
        ended_at=m.ended_at,
    )
