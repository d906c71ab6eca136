"""Scheduled capacity runs: ``capacity.schedule``, the daemon measuring its targets' capacity itself.

Off by default (an empty list). Each entry is a ``diagnose capacity`` run of one target, every
``every_s`` (the first one that long after the daemon starts), made by the leader only (two
replicas never load-test one service twice), one at a time, and recorded in the daemon's state
as ``diagnose capacity --state`` records (:mod:`~diagnoser.daemon.capacity_record`).

No one typed the target, so it is held to what a probe file is: its host must be in
``probe.allowed_hosts`` and its resolved address pass the probe's address rule; no step goes above
``capacity.max_rate`` or lasts longer than ``capacity.max_duration_s``, and an entry asking more
is refused when the daemon starts (one ERROR line; the other entries run). The steps are sent
from the daemon's own process, on its event loop (no worker processes): a scheduled run is for
rates one core sends comfortably (a few thousand requests per second); a bigger load test is
``diagnose capacity`` with its workers. A run that fails is one WARNING line and no record. ::

    job = CapacityScheduleJob(entry, settings, state, leads=lambda: elector.is_leader)
    schedule.add(job.job_id, job, every_s=entry.every_s, first_run_now=False)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from diagnoser.capacity.report import CapacityReport
from diagnoser.capacity.run import CapacityInputs, CapacityOptions, CapacityRun
from diagnoser.capacity.step import StepPlan
from diagnoser.config import Settings
from diagnoser.config.sections import ScheduledCapacityRun
from diagnoser.daemon.capacity_record import run_from_report, service_measured
from diagnoser.daemon.state import StateStore
from diagnoser.errors import ConfigError, DiagnoserError, StateError
from diagnoser.probe import build_spec, enforce_safety
from diagnoser.probe.caps import capacity_caps
from diagnoser.probe.entry import resolve_target
from diagnoser.probe.spec import check_resolved_addresses

__all__ = ["DEFAULT_STEP_ERROR_RATIO", "CapacityScheduleJob", "scheduled_options"]

log = logging.getLogger(__name__)

#: As ``diagnose capacity``'s: a load test looks for the first errors.
DEFAULT_STEP_ERROR_RATIO = 0.001


def _settings_for(entry: ScheduledCapacityRun, settings: Settings) -> Settings:
    """The daemon's settings with this entry's SLO: each step's rules judge by it too."""
    p99_ms = entry.slo_p99_ms if entry.slo_p99_ms is not None else settings.slo.p99_ms
    error_ratio = entry.slo_error_ratio if entry.slo_error_ratio is not None else DEFAULT_STEP_ERROR_RATIO
    slo = settings.slo.model_copy(update={"p99_ms": p99_ms, "error_ratio": error_ratio})
    return settings.model_copy(update={"slo": slo})


def scheduled_options(entry: ScheduledCapacityRun, settings: Settings) -> CapacityOptions:
    """The search of one entry, within the caps (``ConfigError`` naming the entry otherwise)."""
    caps = capacity_caps(settings.capacity)
    where = f"capacity.schedule entry {entry.target!r}"
    max_rate = entry.max_rate if entry.max_rate is not None else caps.max_rate
    steps = sorted(entry.steps) if entry.steps else None
    if max_rate > caps.max_rate or (steps and steps[-1] > caps.max_rate):
        raise ConfigError(f"{where}: a rate above capacity.max_rate of {caps.max_rate:g} req/s")
    if entry.step_s > caps.max_duration_s or max(entry.pause_s, entry.warmup_s) > caps.max_duration_s:
        raise ConfigError(f"{where}: a step, pause or warm-up longer than {caps.duration_setting}")
    if steps and steps[0] <= 0:
        raise ConfigError(f"{where}: steps must be positive rates")
    if steps:
        max_rate = steps[-1]
    start = entry.start_rate if entry.start_rate is not None else max(1.0, max_rate / 10)
    if start > max_rate:
        raise ConfigError(f"{where}: start_rate {start:g} is above max_rate {max_rate:g}")
    return CapacityOptions(
        start_rate=start, max_rate=max_rate, fixed_steps=steps, pause_s=entry.pause_s,
        warmup_s=entry.warmup_s, max_steps=entry.max_steps,
    )  # fmt: skip


class CapacityScheduleJob:
    """One ``capacity.schedule`` entry as a job: run it (when this replica leads), record it."""

    def __init__(
        self, entry: ScheduledCapacityRun, settings: Settings, state: StateStore, *, leads: Callable[[], bool]
    ) -> None:
        self.entry = entry
        self.settings = _settings_for(entry, settings)
        self.options = scheduled_options(entry, settings)  # refused at start when over the caps
        self.state = state
        self.leads = leads
        self.runs = 0
        self._run: CapacityRun | None = None
        #: The service the target measures: the entry's, else its probe file's.
        self._service: tuple[str | None, str | None] = (entry.service, entry.namespace)

    @property
    def job_id(self) -> str:
        return f"capacity:{self.entry.target}"

    async def __call__(self) -> None:
        if not self.leads():
            return
        try:
            report = await self.measure()
        except asyncio.CancelledError:
            if self._run is not None:
                self._run.stop()
            raise
        except DiagnoserError as exc:  # refused (the allowlist, the address rule) or broken
            log.warning("scheduled capacity run of %s did not run: %s", self.entry.target, exc)
            return
        finally:
            self._run = None
        self.runs += 1
        self.record(report)

    async def measure(self) -> CapacityReport:
        """The run, with the safety checks a probe file gets, before the first request."""
        entry, settings = self.entry, self.settings
        spec, _ = build_spec(entry.target, rate=1.0, duration_s=entry.step_s)
        self._service = (entry.service or spec.service, entry.namespace or spec.namespace)
        caps = capacity_caps(settings.capacity)
        # Nobody typed this target: the allowlist and the address rule apply, as for a probe file.
        enforce_safety(spec, settings.probe, explicit_target=False, caps=caps)
        spec = resolve_target(spec, settings.probe, explicit_target=False)
        await check_resolved_addresses(spec, settings.probe, explicit_target=False)
        plan = StepPlan(
            spec=spec, explicit_target=False, step_s=entry.step_s,
            min_step_s=min(entry.step_s, max(3.0, entry.step_s / 3)),
            slo_p99_ms=settings.slo.p99_ms, max_error_ratio=settings.slo.error_ratio,
        )  # fmt: skip
        self._run = CapacityRun(plan, CapacityInputs.from_settings(settings), self.options)
        log.info("scheduled capacity run started", extra={"target": entry.target})
        return await self._run.run()

    def record(self, report: CapacityReport) -> None:
        """Keep the run in the state (the service: the entry's, its probe file's, else the one
        whose symptom the rules found at the knee)."""
        service, namespace = self._service
        if not service and (found := service_measured(report)) is not None:
            namespace, service = found[0] or None, found[1]
        run = run_from_report(report, service=service, namespace=namespace)
        extra: dict[str, Any] = {
            "target": run.target, "capacity_rps": run.capacity_rps, "limit": run.limit,
            "service": run.service or "",
        }  # fmt: skip
        try:
            self.state.record_capacity(run)
        except StateError as exc:
            log.error("scheduled capacity run not recorded: %s", exc, extra=extra)
            return
        log.info("scheduled capacity run recorded", extra=extra)
