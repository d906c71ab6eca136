"""The daemon's jobs: diagnose, probe, deliver the outbox, keep the Lease; each one run at a time.

- :class:`DiagnoseJob` runs a diagnosis with the newest probe result, passes it through the
  :class:`~diagnoser.daemon.state.StateStore` (new, repeat after cooldown, severity change,
  resolved), logs each finding that appeared or cleared and wakes the outbox when something was
  queued: a diagnosis never waits for Slack.
- :class:`ProbeJob` runs each configured probe definition (``probes/*.yaml``), its latency into
  ``/metrics``, and keeps the newest result while it is fresh.
- :class:`OutboxJob` delivers what is queued (:class:`~diagnoser.notify.delivery.OutboxDelivery`),
  only while this replica notifies; woken while it runs, it goes round once more.
- :class:`LeaderJob` renews or contends for the Kubernetes Lease; the new leader delivers what
  the old one left queued.

A state file that fails (a full disk) costs the run its write, counted and logged: nothing was
half-written, and the next run decides again, whole. ::

    job = DiagnoseJob(daemon)
    diagnosis = await job()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from diagnoser.config import DaemonSettings, ProbeSettings, Settings
from diagnoser.daemon.capacity_record import CapacityBook
from diagnoser.daemon.incidents import IncidentPolicy
from diagnoser.daemon.leader import LeaderElector
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.daemon.schedule import JobSchedule
from diagnoser.daemon.state import StateStore
from diagnoser.errors import StateError
from diagnoser.models import Diagnosis, Evidence, Finding, Severity
from diagnoser.notify.delivery import FanOut, OutboxDelivery
from diagnoser.notify.outbox import OutboxEntry
from diagnoser.ruleset import RuleSet

if TYPE_CHECKING:
    from diagnoser.probe import ProbeResult

__all__ = ["DiagnoseJob", "JobHost", "LeaderJob", "OutboxJob", "ProbeJob", "report_state_error"]

log = logging.getLogger(__name__)


class JobHost(Protocol):
    """What the jobs need from the daemon."""

    config: DaemonSettings
    settings: Settings
    metrics: DaemonMetrics
    state: StateStore | None
    rules: RuleSet | None

    @property
    def notifies(self) -> bool: ...

    async def diagnose(self, trigger: str) -> Diagnosis: ...

    async def read_again(self, causes: list[Finding], at: datetime) -> dict[str, list[Evidence]]: ...

    async def capacity_book(self, diagnosis: Diagnosis) -> CapacityBook | None: ...

    def resolved(self, queued: list[OutboxEntry]) -> None:
        """What a diagnosis queued, for the incidents it resolved (their confirm probes)."""
        ...

    def wake_outbox(self) -> None: ...


def report_state_error(metrics: DaemonMetrics, exc: StateError) -> None:
    """Count and log a state file failure (one ERROR line naming the file and what to do)."""
    metrics.state_errors.labels(exc.reason).inc()
    log.error("%s", exc, extra={"reason": exc.reason})


class DiagnoseJob:
    """One scheduled diagnosis: evaluate, update state, queue notifications and wake the outbox."""

    def __init__(self, host: JobHost) -> None:
        self.host = host
        self.runs = 0
        #: When the last diagnosis finished (monotonic), and that diagnosis, for readiness.
        self.last_finished: float | None = None
        self.last_diagnosis: Diagnosis | None = None
        self.policy = IncidentPolicy.from_settings(host.settings)

    async def __call__(self) -> Diagnosis:
        host = self.host
        assert host.state is not None, "the daemon is not started"
        if not self.policy.confirming_rules and host.rules is not None:
            self.policy = IncidentPolicy.from_settings(host.settings, host.rules)  # the loaded pack
        started = time.perf_counter()
        diagnosis = await host.diagnose("schedule")
        seconds = time.perf_counter() - started
        self.runs += 1
        self.last_finished = time.monotonic()
        self.last_diagnosis = diagnosis
        host.metrics.last_diagnosis.set(time.time())
        try:
            readings = await self._readings(host.state, diagnosis)
            capacity = await host.capacity_book(diagnosis)
            queued = self._record(host.state, diagnosis, readings, capacity)
        except StateError as exc:
            # Nothing was half-written (one transaction): the next run decides again, whole.
            report_state_error(host.metrics, exc)
            return diagnosis
        log.info(
            "diagnosis done",
            extra={
                "seconds": round(seconds, 3),
                "findings": len(diagnosis.findings),
                "errors": len(diagnosis.errors),
                "queued": len(queued),
            },
        )
        if queued:
            host.wake_outbox()
            host.resolved(queued)
        return diagnosis

    async def _readings(self, state: StateStore, diagnosis: Diagnosis) -> dict[str, list[Evidence]]:
        """What the causes of incidents that are open (or may reopen) read now, where this
        diagnosis no longer finds them: their messages say that, not the old numbers."""
        found = {f.identity for f in diagnosis.findings}
        since = time.time() - self.policy.reopen_within_s
        absent = [c for c in state.incident_causes(since=since) if c.identity not in found]
        return await self.host.read_again(absent, diagnosis.evaluated_at) if absent else {}

    def _record(
        self, state: StateStore, diagnosis: Diagnosis, readings: dict[str, list[Evidence]],
        capacity: CapacityBook | None = None,
    ) -> list[OutboxEntry]:
        config = self.host.config
        before = {f.identity: f for f in state.active_findings()}
        silenced = diagnosis.coverage.silenced if diagnosis.coverage else ()
        queued = state.reconcile(
            diagnosis,
            cooldown_s=config.cooldown_s,
            min_severity=Severity(config.notify_min_severity),
            notify=self.host.notifies,
            silenced=[s.identity for s in silenced],
            policy=self.policy,
            readings=readings,
            capacity=capacity,
        )
        _log_transitions(before, {f.identity: f for f in state.active_findings()})
        self.host.metrics.notifications_queued.set(state.pending_count())
        return queued


def _log_transitions(before: Mapping[str, Finding], after: Mapping[str, Finding]) -> None:
    """One INFO line per finding that appeared or cleared: a daemon without Slack still tells."""
    changes = [("new", f) for fp, f in after.items() if fp not in before]
    changes += [("resolved", f) for fp, f in before.items() if fp not in after]
    for change, finding in changes:
        log.info(
            "%s finding: %s: %s",
            change,
            finding.cause,
            finding.summary,
            extra={"cause": finding.cause, "rule_id": finding.rule_id, "severity": finding.severity.value},
        )


class ProbeJob:
    """Runs each configured probe definition once per run; keeps its result for the next diagnosis."""

    def __init__(
        self, probe_files: Sequence[Path], caps: ProbeSettings, metrics: DaemonMetrics, *, interval_s: float
    ) -> None:
        self.probe_files = list(probe_files)
        self.caps = caps
        self.interval_s = interval_s
        self.metrics = metrics
        self._results: dict[str, tuple[float, ProbeResult]] = {}

    async def __call__(self) -> None:
        from diagnoser.probe import build_spec, run_probe

        for path in self.probe_files:
            name = path.stem
            try:
                spec, explicit = build_spec(str(path))
                result = await run_probe(spec, self.caps, explicit_target=explicit)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a refused or broken probe is reported, the others still run
                self.metrics.probe_runs.labels(name, "failed").inc()
                log.warning("probe %s did not run: %s", name, exc)
                continue
            self._results[name] = (time.monotonic(), result)
            self._record(name, result)

    def _record(self, name: str, result: ProbeResult) -> None:
        self.metrics.probe_runs.labels(name, "aborted" if result.aborted else "ok").inc()
        if result.latency_ms.p99 is not None:
            self.metrics.probe_p99.labels(name).set(result.latency_ms.p99 / 1000)
        histogram = result.latency_histogram()
        self.metrics.probe_latency.add(
            name,
            (
                (item.value_iterated_to, item.count_at_value_iterated_to)
                for item in histogram.get_recorded_iterator()
            ),
        )
        log.info("probe done", extra={"probe": name, "sent": result.sent, "p99_ms": result.latency_ms.p99})

    async def latest(self) -> ProbeResult | None:
        """The newest probe result, if fresh, else ``None``.

        A probe that stopped running must not keep feeding an old measurement to the rules.
        """
        if not self._results:
            return None
        finished, result = max(self._results.values(), key=lambda item: item[0])
        if time.monotonic() - finished > 2 * self.interval_s + 60:
            return None
        return result


class OutboxJob:
    """Delivers the due notifications oldest first, while this replica notifies."""

    JOB_ID = "outbox"

    def __init__(
        self, host: JobHost, delivery: OutboxDelivery | FanOut | None, schedule: JobSchedule
    ) -> None:
        self.host = host
        self.delivery = delivery
        self.schedule = schedule
        self._lock = asyncio.Lock()
        self._again = False

    def wake(self) -> None:
        """Have the job run now, without waiting for it (a diagnosis never waits for Slack)."""
        if self._lock.locked():
            self._again = True  # the running flush goes round once more
            return
        self.schedule.run_soon(self.JOB_ID)

    async def __call__(self) -> None:
        state = self.host.state
        if state is None or self.delivery is None or not self.host.notifies:
            return
        async with self._lock:
            try:
                self._again = True
                while self._again:
                    self._again = False
                    await self.delivery.flush()
            except StateError as exc:
                report_state_error(self.host.metrics, exc)
            finally:
                with contextlib.suppress(StateError):
                    self.host.metrics.notifications_queued.set(state.pending_count())


class LeaderJob:
    """Renews or contends for leadership; a replica that becomes leader delivers what is queued."""

    def __init__(self, host: JobHost, elector: LeaderElector) -> None:
        self.host = host
        self.elector = elector

    async def __call__(self) -> None:
        leader = await self.elector.try_acquire_or_renew()
        self.host.metrics.leader.set(1 if leader else 0)
        state = self.host.state
        if leader and state is not None and state.pending_count():
            self.host.wake_outbox()
