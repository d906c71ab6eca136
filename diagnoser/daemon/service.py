"""The always-on diagnoser: opens its state, builds its sources once, serves HTTP and runs its jobs.

:class:`Daemon` puts the parts together and answers what the HTTP side asks (readiness, the
active findings, an Alertmanager webhook). The jobs (:mod:`~diagnoser.daemon.jobs`) run on one
event loop through :class:`~diagnoser.daemon.schedule.JobSchedule`: *diagnose* at
``daemon.diagnose_interval_s``, *probe* at ``daemon.probe_interval_s`` when probe files are
configured, *outbox* at ``daemon.outbox_retry_s`` and whenever something is queued, *leader* at
the Lease's renew interval when leader election is on. Only the leader with a receiver
configured (``notify.receivers``, or the older ``slack.*`` / ``daemon.notify_webhook_url``)
queues and sends, one outbox row per receiver whose ``match`` takes the notification; the others
keep their state in step, silently.

On SIGTERM or SIGINT (:func:`run_daemon`) the schedule stops starting jobs, in-flight runs get
``daemon.shutdown_grace_s`` to finish and are then cancelled, the Lease is released and the
state file is checkpointed and closed. ::

    daemon = Daemon(settings)
    await daemon.start()
    ...
    await daemon.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from diagnoser.config import Settings
from diagnoser.daemon.alerts import AlertReceiver
from diagnoser.daemon.capacity_record import CapacityBook, capacity_book
from diagnoser.daemon.capacity_schedule import CapacityScheduleJob
from diagnoser.daemon.http import HttpServer
from diagnoser.daemon.jobs import DiagnoseJob, LeaderJob, OutboxJob, ProbeJob
from diagnoser.daemon.leader import LeaderElector, SoleLeader, elector_for
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.daemon.readings import current_readings
from diagnoser.daemon.schedule import GuardedRun, JobSchedule
from diagnoser.daemon.state import StateStore
from diagnoser.daemon.verify import ConfirmProbes
from diagnoser.engine.config import DiagnosisConfig
from diagnoser.engine.run import BuiltSources, build_sources, load_ruleset, run_diagnosis
from diagnoser.errors import ConfigError
from diagnoser.models import Diagnosis, Evidence, Finding
from diagnoser.notify.delivery import FanOut, OutboxDelivery
from diagnoser.notify.outbox import OutboxEntry, render_entry
from diagnoser.notify.receivers import (
    ReceiverConfig,
    build_receivers,
    delivery_settings,
    deprecations,
    receiver_configs,
    routes,
)
from diagnoser.notify.sender import Receiver, Sender
from diagnoser.ruleset import RuleSet
from diagnoser.signals import Catalogue
from diagnoser.sources.base import Sources
from diagnoser.sources.kubernetes.credentials import Credentials, load_credentials

__all__ = ["Daemon", "run_daemon"]

log = logging.getLogger(__name__)


class Daemon:
    """The always-on diagnoser; one instance per process.

    The rules, the sender (one, in place of the configured receivers), the leader elector and
    the Kubernetes credentials (loaded once, shared by the source and leader election) can be
    passed in; whatever is not is built from ``settings`` (no receiver configured: state is
    kept, nothing is sent).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        rules: RuleSet | None = None,
        sender: Sender[Any] | None = None,
        elector: LeaderElector | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.settings = settings
        self.credentials = credentials
        self.config = settings.daemon
        #: What each diagnosis reads of the settings, taken apart once.
        self.diagnosis_config = DiagnosisConfig.from_settings(settings)
        self.metrics = DaemonMetrics()
        self.rules = rules
        self.sender = sender
        self.receivers: list[Receiver[Any]] = []
        self.elector = elector
        self.state: StateStore | None = None
        self.sources: BuiltSources | None = None
        self.schedule = JobSchedule(
            misfire_grace_s=self.config.misfire_grace_s, jitter_s=self.config.jitter_s
        )
        self.probes = ProbeJob(
            self.config.probe_files, settings.probe, self.metrics, interval_s=self.config.probe_interval_s
        )
        self.diagnoses = DiagnoseJob(self)
        self.alerts = AlertReceiver(self)
        self.http = HttpServer(self, self.config)
        self.outbox: OutboxJob | None = None
        #: ``capacity.schedule``'s jobs, once started.
        self.capacity_jobs: list[CapacityScheduleJob] = []
        #: The confirm probes of resolved incidents (``verify.*``).
        self.confirms = ConfirmProbes(self)
        self._stopping = False

    @property
    def runs(self) -> int:
        """Scheduled diagnoses finished so far."""
        return self.diagnoses.runs

    @property
    def http_port(self) -> int | None:
        """The port ``/healthz``, ``/metrics``... are served on, once started."""
        return self.http.port

    @property
    def notifies(self) -> bool:
        """True when this replica sends: it leads and a receiver is configured."""
        has_one = self.sender is not None or bool(self.receivers)
        return has_one and self.elector is not None and self.elector.is_leader

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the state, build sources, serve HTTP and start the jobs (the first runs at once)."""
        configs = self._receiver_configs()
        state = self.state = StateStore(Path(self.config.state_path), routes=routes(configs))
        self.metrics.capacity.runs = state.capacities_on_record
        self._build_parts(state, configs)
        assert self.elector is not None
        assert self.rules is not None
        assert self.outbox is not None
        leader = LeaderJob(self, self.elector)
        await leader()
        await self.http.start()
        cfg = self.config
        self.schedule.add("diagnose", self.diagnoses, every_s=cfg.diagnose_interval_s)
        if cfg.probe_files:
            self.schedule.add("probe", self.probes, every_s=cfg.probe_interval_s)
        # What an earlier life of the daemon left queued goes out at once.
        self.schedule.add(OutboxJob.JOB_ID, self.outbox, every_s=cfg.outbox_retry_s, jitter=False)
        self._schedule_capacity_runs(state)
        if not isinstance(self.elector, SoleLeader):
            renew_s = cfg.leader_election.renew_interval_s
            self.schedule.add("leader", leader, every_s=renew_s, jitter=False, first_run_now=False)
        self.schedule.start()
        self.metrics.notifications_queued.set(state.pending_count())
        log.info(
            "daemon started",
            extra={
                "rules": len(self.rules.rules),
                "diagnose_interval_s": cfg.diagnose_interval_s,
                "listen": f"{self.http.host}:{self.http.port}",
                "state": str(cfg.state_path),
                "receivers": ", ".join(self._targets()) or "not configured",
                "identity": self.elector.identity,
            },
        )

    def _schedule_capacity_runs(self, state: StateStore) -> None:
        """``capacity.schedule``'s runs (none by default); an entry over the caps is refused alone."""
        elector = self.elector
        assert elector is not None
        for entry in self.settings.capacity.schedule:
            try:
                job = CapacityScheduleJob(entry, self.settings, state, leads=lambda: elector.is_leader)
            except ConfigError as exc:
                log.error("capacity run not scheduled: %s", exc)
                continue
            self.capacity_jobs.append(job)
            self.schedule.add(job.job_id, job, every_s=entry.every_s, first_run_now=False)

    def _receiver_configs(self) -> list[ReceiverConfig]:
        """The receivers' typed configs (none when a sender was passed in); older keys logged."""
        if self.sender is not None:
            return []
        notify, slack = self.settings.notify, self.settings.slack
        webhook_url = self.config.notify_webhook_url
        for line in deprecations(notify, slack=slack, webhook_url=webhook_url):
            log.warning("deprecated configuration: %s (see docs/configuration.md)", line)
        return receiver_configs(notify, slack=slack, webhook_url=webhook_url)

    def _targets(self) -> list[str]:
        if self.sender is not None:
            return [self.sender.target]
        return [f"{r.name}: {r.target}" for r in self.receivers]

    def _build_parts(self, state: StateStore, configs: list[ReceiverConfig]) -> None:
        """Whatever was not passed in: rules, sources, the receivers, the leader elector."""
        if self.rules is None:
            self.rules = load_ruleset(self.diagnosis_config.rules)
        for problem in self.rules.problems:
            log.warning("rule not loaded: %s", problem)
        credentials = self.credentials or self._load_credentials()
        self.sources = build_sources(self.diagnosis_config.sources, credentials=credentials)
        knobs = delivery_settings(self.settings.notify, slack=self.settings.slack)
        delivery: OutboxDelivery | FanOut | None = None
        if self.sender is not None:
            delivery = OutboxDelivery(state, self.sender, self.metrics, render_entry, knobs)
        else:
            self.receivers = build_receivers(configs)
            if self.receivers:
                delivery = FanOut([
                    OutboxDelivery(state.outbox_for(r.name), r, self.metrics, settings=knobs)
                    for r in self.receivers
                ])
        self.outbox = OutboxJob(self, delivery, self.schedule)
        if self.elector is None:
            self.elector = elector_for(
                self.settings.kubernetes, self.config.leader_election, credentials=credentials
            )

    def _load_credentials(self) -> Credentials | None:
        """The Kubernetes credentials, read once for the source and leader election; ``None``
        without Kubernetes, or when they do not load (each part then reports that its own way)."""
        if not self.settings.kubernetes.enabled:
            return None
        try:
            return load_credentials(self.settings.kubernetes)
        except ConfigError:
            return None

    async def stop(self) -> None:
        """Stop scheduling, let in-flight work finish within the grace period, flush and close."""
        if self._stopping:
            return
        self._stopping = True
        started = time.monotonic()
        await self.schedule.drain(self.config.shutdown_grace_s)
        if self.elector is not None:
            await self.elector.release()
            self.elector.close()
        await self.http.close()
        if self.sources is not None:
            await self.sources.aclose()
        if self.state is not None:
            queued = self.state.pending_count()
            self.state.close()
            log.info(
                "daemon stopped", extra={"seconds": round(time.monotonic() - started, 3), "queued": queued}
            )

    # --- what the jobs and the alert receiver share -------------------------------------------

    async def diagnose(self, trigger: str) -> Diagnosis:
        """One diagnosis over the daemon's sources with the newest probe result, counted in ``/metrics``."""
        started = time.perf_counter()
        diagnosis = await run_diagnosis(
            self.diagnosis_config, rules=self.rules, probe=self.probes.latest, sources=self.sources
        )
        self.metrics.record_diagnosis(diagnosis, time.perf_counter() - started, trigger=trigger)
        return diagnosis

    async def read_again(self, causes: list[Finding], at: datetime) -> dict[str, list[Evidence]]:
        """What the evidence of ``causes`` (no longer found) reads at ``at``, by their identity."""
        prometheus = self.sources.sources.prometheus if self.sources is not None else None
        if prometheus is None:
            return {}
        return await current_readings(prometheus, causes, at=at)

    async def capacity_book(self, diagnosis: Diagnosis) -> CapacityBook | None:
        """The capacities on record and the load now of the services ``diagnosis`` found something
        about: each incident message's headroom line (``None``: no capacity on record)."""
        if self.state is None:
            return None
        return await capacity_book(
            self.state.capacities_on_record(),
            diagnosis.findings,
            sources=self.sources.sources if self.sources is not None else None,
            catalogue=self.diagnosis_config.rules.catalogue,
            window=self.diagnosis_config.window,
            at=diagnosis.evaluated_at,
            max_age_s=self.settings.capacity.record_max_age_days * 86400,
        )

    async def diagnose_job(self) -> Diagnosis:
        """One scheduled diagnosis: evaluate, update state, queue and deliver notifications."""
        return await self.diagnoses()

    def resolved(self, queued: list[OutboxEntry]) -> None:
        """A diagnosis queued these: the incidents it resolved get their confirm probe."""
        self.confirms.resolved(queued)

    @property
    def prometheus_sources(self) -> Sources | None:
        """The sources the diagnoses read (the confirm probe reads the services' load from them)."""
        return self.sources.sources if self.sources is not None else None

    @property
    def catalogue(self) -> Catalogue:
        return self.diagnosis_config.rules.catalogue

    @property
    def window(self) -> str:
        return self.diagnosis_config.window

    def wake_outbox(self) -> None:
        """Have the outbox job run now, without waiting for it (a diagnosis never waits for Slack)."""
        if self.outbox is not None:
            self.outbox.wake()

    def guarded(self, name: str, func: Callable[[], Awaitable[Any]]) -> GuardedRun:
        """``func`` as a run that shutdown waits for and whose failure is logged, never fatal."""
        return self.schedule.guarded(name, func)

    # --- what the HTTP side asks --------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """Ready while the schedule runs, the last diagnosis is recent enough and no receiver is stuck."""
        if self._stopping:
            return False, "shutting down"
        if not self.schedule.running:
            return False, "scheduler not running"
        last = self.diagnoses.last_finished
        if last is None:
            return False, "no diagnosis finished yet"
        bound = self.config.ready_max_age_s or (
            3 * self.config.diagnose_interval_s + self.settings.deadline_s
        )
        age = time.monotonic() - last
        if age > bound:
            return False, f"last diagnosis {age:.0f}s ago (bound {bound:g}s)"
        stuck = self.outbox.delivery.stuck if self.outbox and self.outbox.delivery and self.notifies else None
        if stuck is not None:
            return False, stuck
        ok = f"ok: last diagnosis {age:.1f}s ago"
        diagnosis = self.diagnoses.last_diagnosis
        if diagnosis is None or not diagnosis.rules_not_run:
            return True, ok
        return _rules_not_run(diagnosis, ok)

    def active_findings(self) -> list[Finding]:
        return self.state.active_findings() if self.state is not None else []

    def alertmanager_token(self) -> str | None:
        token = self.config.alertmanager_token
        return token.get_secret_value() if token is not None else None

    def accept_alert(self, payload: Mapping[str, Any]) -> tuple[str, str]:
        """Diagnose for an Alertmanager group in the background (:meth:`AlertReceiver.accept`)."""
        return self.alerts.accept(payload)



#: Statuses of a rule that looked at its data (whatever it found).
_RAN = ("evaluated", "no_data", "silenced")
#: Source errors quoted in /readyz.
_ERRORS_SHOWN = 3


def _rules_not_run(diagnosis: Diagnosis, ok: str) -> tuple[bool, str]:
    """Readiness when rules could not run: not ready when none ran at all (a daemon whose every
    rule errored watches nothing), ready otherwise; either way the rules and sources are named."""
    not_run = sorted(diagnosis.rules_not_run)
    counts = diagnosis.coverage.counts if diagnosis.coverage is not None else {}
    ran = sum(counts.get(status, 0) for status in _RAN)
    errors = "; ".join(str(e) for e in diagnosis.errors[:_ERRORS_SHOWN])
    more = len(diagnosis.errors) - _ERRORS_SHOWN
    errors += f" (and {more} more)" if more > 0 else ""
    shown = ", ".join(not_run[:10]) + (f" and {len(not_run) - 10} more" if len(not_run) > 10 else "")
    line = f"{len(not_run)} rules could not run ({shown}): {errors}"
    if ran == 0:
        return False, f"every rule errored in the last diagnosis: {line}"
    return True, f"{ok}; {line}"


async def run_daemon(
    settings: Settings, *, stop: asyncio.Event | None = None, credentials: Credentials | None = None
) -> None:
    """Run the daemon until SIGTERM/SIGINT (or ``stop`` is set), then shut down gracefully.

    ``credentials``: the Kubernetes credentials the command's input check loaded.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    daemon = Daemon(settings, credentials=credentials)
    try:
        await daemon.start()
        await stop.wait()
        log.info("stop requested: shutting down")
    finally:
        await daemon.stop()
