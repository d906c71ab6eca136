"""``diagnose serve``: probe and diagnose on a schedule, tell Slack once per problem, shut down cleanly.

An APScheduler ``AsyncIOScheduler`` runs the daemon's jobs on one event loop, each with its own
interval and jitter, never two runs of the same job at once (``max_instances=1``), missed runs
merged into one (``coalesce``) and dropped when too late (``misfire_grace_time``):

- *diagnose*: :func:`diagnoser.engine.run.run_diagnosis` over sources built once and kept open, with
  the latest probe result; the result goes through the :class:`~diagnoser.state.StateStore`
  (new, repeat after cooldown, severity change, resolved) and what must be said is queued;
- *probe*: each configured probe definition (``probes/*.yaml``), its latency into ``/metrics``;
- *outbox*: delivers queued notifications to Slack in order (:mod:`diagnoser.notify.delivery`:
  Retry-After and backoff by rescheduling, in-doubt posts looked for before a second post,
  refused ones dead-lettered), and keeps them while Slack is unreachable; woken up right after
  a diagnosis queues something, which never waits for Slack;
- *leader*: renews or contends for the Kubernetes Lease; only the leader queues and delivers.

On SIGTERM or SIGINT the scheduler stops starting jobs, in-flight runs get
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
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from diagnoser.config import Settings
from diagnoser.daemon_http import DaemonMetrics, alert_scopes, build_app, finding_in_scope
from diagnoser.engine.run import BuiltSources, build_sources, load_ruleset, run_diagnosis
from diagnoser.errors import StateError
from diagnoser.http_limits import ConnectionLimits, start_limited_server
from diagnoser.leader import LeaderElector, SoleLeader, elector_for
from diagnoser.models import Diagnosis, Finding, Severity
from diagnoser.notify.delivery import OutboxDelivery
from diagnoser.notify.slack import (
    SlackMessage,
    render_alert_report,
    render_finding,
    render_repeat,
    render_resolved,
    render_severity_change,
)
from diagnoser.notify.slack_sender import SlackSender
from diagnoser.ruleset import RuleSet
from diagnoser.state import NotificationKind, OutboxEntry, StateStore, fingerprint

__all__ = ["Daemon", "render_entry", "run_daemon"]

log = logging.getLogger(__name__)


def render_entry(entry: OutboxEntry) -> SlackMessage:
    """The Slack message for a queued notification (pure; the time shown is when it was decided)."""
    at = datetime.fromtimestamp(entry.created_at, UTC)
    if entry.kind is NotificationKind.alert_report:
        diagnosis = Diagnosis.model_validate(entry.payload["diagnosis"])
        return render_alert_report(
            diagnosis,
            alert=str(entry.payload.get("alert", "an alert")),
            scope=dict(entry.payload.get("scope") or {}),
        )
    finding = entry.finding
    assert finding is not None, f"outbox entry {entry.id} of kind {entry.kind} has no finding"
    if entry.kind is NotificationKind.resolved:
        return render_resolved(finding, at=at)
    if entry.kind is NotificationKind.repeat:
        return render_repeat(finding, at=at)
    if entry.kind is NotificationKind.severity_changed:
        return render_severity_change(finding, previous=str(entry.payload.get("previous_severity")), at=at)
    return render_finding(finding, at=at)


def _listen_address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)  # ":8080" means every interface, as usual


class Daemon:
    """The always-on diagnoser; one instance per process.

    The rules, the Slack sender and the leader elector can be passed in; whatever is not is
    built from ``settings`` (no Slack configured: state is kept, nothing is sent).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        rules: RuleSet | None = None,
        sender: SlackSender | None = None,
        elector: LeaderElector | None = None,
    ) -> None:
        self.settings = settings
        self.config = settings.daemon
        self.metrics = DaemonMetrics()
        self.rules = rules
        self.sender = sender
        self.elector = elector
        self.state: StateStore | None = None
        self.sources: BuiltSources | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self.runs = 0
        self.http_port: int | None = None
        self._runner: web.AppRunner | None = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._flush_lock = asyncio.Lock()
        self._flush_again = False
        self.delivery: OutboxDelivery | None = None
        self._alert_slots = asyncio.Semaphore(self.config.alert_concurrency)
        self._alert_tasks: set[asyncio.Task[Any]] = set()
        #: groupKey -> when its diagnosis was accepted (monotonic), for the cooldown.
        self._alert_groups: dict[str, float] = {}
        self._http_server: asyncio.Server | None = None
        self._last_diagnosis: float | None = None
        self._probe_results: dict[str, tuple[float, Any]] = {}
        self._stopping = False

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the state, build sources, serve HTTP and start the jobs (the first runs at once)."""
        cfg = self.config
        self.state = StateStore(Path(cfg.state_path))
        if self.rules is None:
            self.rules = load_ruleset(self.settings)
        for problem in self.rules.problems:
            log.warning("rule not loaded: %s", problem)
        self.sources = build_sources(self.settings)
        if self.sender is None:
            self.sender = SlackSender.from_settings(self.settings.slack)
        if self.sender is not None:
            self.delivery = OutboxDelivery(
                self.state, self.sender, self.metrics, render_entry, self.settings.slack
            )
        if self.elector is None:
            self.elector = elector_for(self.settings.kubernetes, cfg.leader_election)
        await self._elect()
        await self._serve_http()
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        grace = max(1, round(cfg.misfire_grace_s))
        common: dict[str, Any] = {
            "trigger": "interval",
            "max_instances": 1,
            "coalesce": True,
            "misfire_grace_time": grace,
        }
        now = datetime.now(UTC)
        self.scheduler.add_job(
            self._job(self.diagnose_job),
            id="diagnose",
            seconds=cfg.diagnose_interval_s,
            jitter=cfg.jitter_s or None,
            next_run_time=now,
            **common,
        )
        if cfg.probe_files:
            self.scheduler.add_job(
                self._job(self.probe_job),
                id="probe",
                seconds=cfg.probe_interval_s,
                jitter=cfg.jitter_s or None,
                next_run_time=now,
                **common,
            )
        self.scheduler.add_job(
            self._job(self.flush_outbox),
            id="outbox",
            seconds=cfg.outbox_retry_s,
            next_run_time=now,  # what an earlier life of the daemon left queued goes out at once
            **common,
        )
        if not isinstance(self.elector, SoleLeader):
            self.scheduler.add_job(
                self._job(self._elect), id="leader", seconds=cfg.leader_election.renew_interval_s, **common
            )
        self.scheduler.start()
        self.metrics.notifications_queued.set(self.state.pending_count())
        log.info(
            "daemon started",
            extra={
                "rules": len(self.rules.rules),
                "diagnose_interval_s": cfg.diagnose_interval_s,
                "listen": f"{_listen_address(cfg.listen)[0]}:{self.http_port}",
                "state": str(cfg.state_path),
                "slack": self.sender.target if self.sender else "not configured",
                "identity": self.elector.identity,
            },
        )

    async def stop(self) -> None:
        """Stop scheduling, let in-flight work finish within the grace period, flush and close."""
        if self._stopping:
            return
        self._stopping = True
        started = time.monotonic()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.pause()  # no new runs; shutdown() would cancel in-flight ones at once
        inflight = {t for t in self._inflight if not t.done()}
        if inflight:
            log.info("waiting for %d in-flight job(s)", len(inflight))
            _, late = await asyncio.wait(inflight, timeout=self.config.shutdown_grace_s)
            for task in late:
                task.cancel()
            if late:
                log.warning(
                    "cancelled %d job(s) still running after %gs", len(late), self.config.shutdown_grace_s
                )
                await asyncio.gather(*late, return_exceptions=True)
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self.elector is not None:
            await self.elector.release()
            close = getattr(self.elector, "close", None)
            if close is not None:
                close()
        if self._http_server is not None:
            self._http_server.close()  # no new connections; cleanup() closes the open ones
        if self._runner is not None:
            await self._runner.cleanup()
        if self.sources is not None:
            await self.sources.aclose()
        if self.state is not None:
            queued = self.state.pending_count()
            self.state.close()
            log.info(
                "daemon stopped", extra={"seconds": round(time.monotonic() - started, 3), "queued": queued}
            )

    def _job(self, func: Callable[[], Awaitable[Any]]) -> Callable[[], Coroutine[Any, Any, None]]:
        """Wrap a job so shutdown can see it in flight and a failure is logged, never fatal."""

        async def run() -> None:
            if self._stopping:
                return
            task = asyncio.current_task()
            if task is not None:
                self._inflight.add(task)
            try:
                await func()
            except asyncio.CancelledError:
                # Only shutdown cancels a job, and nothing awaits it but the scheduler, which
                # would report a cancelled job as a failure.
                log.info("job %s cancelled by shutdown", getattr(func, "__name__", func))
            except Exception:  # one failing run must not stop the schedule
                log.exception("job %s failed", getattr(func, "__name__", func))
            finally:
                if task is not None:
                    self._inflight.discard(task)

        run.__name__ = getattr(func, "__name__", "job")
        return run

    async def _serve_http(self) -> None:
        host, port = _listen_address(self.config.listen)
        timeout = self.config.http_header_timeout_s
        self._runner = web.AppRunner(
            build_app(self), access_log=None, handle_signals=False, keepalive_timeout=timeout
        )
        await self._runner.setup()
        limits = ConnectionLimits(
            max_connections=self.config.http_max_connections,
            header_timeout_s=timeout,
            on_drop=lambda reason: self.metrics.http_dropped.labels(reason).inc(),
        )
        self._http_server = await start_limited_server(self._runner, host, port, limits)
        sockets = self._http_server.sockets
        self.http_port = int(sockets[0].getsockname()[1]) if sockets else port

    # --- jobs ---------------------------------------------------------------------------------

    @property
    def notifies(self) -> bool:
        """True when this replica sends: it leads and Slack is configured."""
        return self.sender is not None and self.elector is not None and self.elector.is_leader

    async def diagnose_job(self) -> Diagnosis:
        """One scheduled diagnosis: evaluate, update state, queue and deliver notifications."""
        assert self.state is not None
        started = time.perf_counter()
        diagnosis = await self._diagnose()
        seconds = time.perf_counter() - started
        self.metrics.record_diagnosis(diagnosis, seconds, trigger="schedule")
        self.runs += 1
        self._last_diagnosis = time.monotonic()
        self.metrics.last_diagnosis.set(time.time())
        try:
            before = {fingerprint(f): f for f in self.state.active_findings()}
            queued = self.state.reconcile(
                diagnosis,
                cooldown_s=self.config.cooldown_s,
                min_severity=Severity(self.config.notify_min_severity),
                notify=self.notifies,
                silenced=[fingerprint(s) for s in diagnosis.coverage.silenced] if diagnosis.coverage else (),
            )
            _log_transitions(before, {fingerprint(f): f for f in self.state.active_findings()})
            self.metrics.notifications_queued.set(self.state.pending_count())
        except StateError as exc:
            # Nothing was half-written (one transaction): the next run decides again, whole.
            self._state_failed(exc)
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
            self.wake_outbox()
        return diagnosis

    def _state_failed(self, exc: StateError) -> None:
        self.metrics.state_errors.labels(exc.reason).inc()
        log.error("%s", exc, extra={"reason": exc.reason})

    def wake_outbox(self) -> None:
        """Have the outbox job run now, without waiting for it (a diagnosis never waits for Slack)."""
        if self._flush_lock.locked():
            self._flush_again = True  # the running flush goes round once more
            return
        if self.scheduler is None or not self.scheduler.running:
            return
        job = self.scheduler.get_job("outbox")
        if job is not None:
            job.modify(next_run_time=datetime.now(UTC))

    async def _diagnose(self) -> Diagnosis:
        return await run_diagnosis(
            self.settings, rules=self.rules, probe=self._latest_probe, sources=self.sources
        )

    async def _latest_probe(self) -> Any:
        # The newest probe result, if fresh: a probe that stopped running must not keep
        # feeding an old measurement to the rules.
        if not self._probe_results:
            return None
        finished, result = max(self._probe_results.values(), key=lambda item: item[0])
        if time.monotonic() - finished > 2 * self.config.probe_interval_s + 60:
            return None
        return result

    async def probe_job(self) -> None:
        """Run each configured probe definition once; keep its result for the next diagnosis."""
        from diagnoser.probe import build_spec, run_probe

        for path in self.config.probe_files:
            name = path.stem
            try:
                spec, explicit = build_spec(str(path))
                result = await run_probe(spec, self.settings.probe, explicit_target=explicit)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a refused or broken probe is reported, the others still run
                self.metrics.probe_runs.labels(name, "failed").inc()
                log.warning("probe %s did not run: %s", name, exc)
                continue
            self._probe_results[name] = (time.monotonic(), result)
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
            log.info(
                "probe done", extra={"probe": name, "sent": result.sent, "p99_ms": result.latency_ms.p99}
            )

    async def flush_outbox(self) -> None:
        """Deliver the due notifications oldest first (:class:`~diagnoser.notify.delivery.OutboxDelivery`)."""
        if self.state is None or self.delivery is None or not self.notifies:
            return
        async with self._flush_lock:
            try:
                self._flush_again = True
                while self._flush_again:
                    self._flush_again = False
                    await self.delivery.flush()
            except StateError as exc:
                self._state_failed(exc)
            finally:
                with contextlib.suppress(StateError):
                    self.metrics.notifications_queued.set(self.state.pending_count())

    async def _elect(self) -> None:
        if self.elector is None:
            return
        leader = await self.elector.try_acquire_or_renew()
        self.metrics.leader.set(1 if leader else 0)
        if leader and self.state is not None and self.state.pending_count():
            self.wake_outbox()

    # --- what the HTTP side asks --------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        if self._stopping:
            return False, "shutting down"
        if self.scheduler is None or not self.scheduler.running:
            return False, "scheduler not running"
        if self._last_diagnosis is None:
            return False, "no diagnosis finished yet"
        bound = self.config.ready_max_age_s or (
            3 * self.config.diagnose_interval_s + self.settings.deadline_s
        )
        age = time.monotonic() - self._last_diagnosis
        if age > bound:
            return False, f"last diagnosis {age:.0f}s ago (bound {bound:g}s)"
        return True, f"ok: last diagnosis {age:.1f}s ago"

    def active_findings(self) -> list[Finding]:
        return self.state.active_findings() if self.state is not None else []

    def alertmanager_token(self) -> str | None:
        token = self.config.alertmanager_token
        return token.get_secret_value() if token is not None else None

    def accept_alert(self, payload: Mapping[str, Any]) -> tuple[str, str]:
        """Start a diagnosis for an Alertmanager group in the background, once per cooldown.

        Returns ``(outcome, detail)``: ``accepted``; ``duplicate`` (this ``groupKey`` was
        diagnosed less than ``daemon.alert_group_cooldown_s`` ago: Alertmanager's retries and
        repeats do not multiply posts); ``busy`` (the backlog is full: the HTTP side answers
        503 and Alertmanager retries later).
        """
        key = str(payload.get("groupKey") or json.dumps(alert_scopes(payload), sort_keys=True))
        now = time.monotonic()
        cooldown = self.config.alert_group_cooldown_s
        for old in [k for k, at in self._alert_groups.items() if now - at >= cooldown]:
            del self._alert_groups[old]
        accepted_at = self._alert_groups.get(key)
        if accepted_at is not None:
            self.metrics.alert_webhooks.labels("duplicate").inc()
            ago = now - accepted_at
            return "duplicate", f"this alert group was diagnosed {ago:.0f}s ago (cooldown {cooldown:g}s)"
        if len(self._alert_tasks) >= self.config.alert_concurrency + self.config.alert_backlog:
            self.metrics.alert_webhooks.labels("busy").inc()
            return "busy", "too many alert diagnoses waiting"
        self._alert_groups[key] = now

        async def alert_diagnosis() -> None:
            try:
                async with self._alert_slots:  # bounded: an alert storm must not multiply queries
                    await self.diagnose_for_alert(payload)
            except BaseException:
                self._alert_groups.pop(key, None)  # failed: the next webhook of the group may try again
                raise

        task = asyncio.create_task(self._job(alert_diagnosis)())
        self._alert_tasks.add(task)
        task.add_done_callback(self._alert_tasks.discard)
        self.metrics.alert_webhooks.labels("accepted").inc()
        return "accepted", "diagnosing in the background; the report goes to Slack"

    async def diagnose_for_alert(self, payload: Mapping[str, Any]) -> Diagnosis:
        """A diagnosis restricted to the alerts' workloads; queued for Slack when this replica leads.

        The report goes into the Slack thread of the most important finding it contains that
        already has one (the alert is about that incident), else to the channel.
        """
        scopes = alert_scopes(payload)
        started = time.perf_counter()
        diagnosis = await self._diagnose()
        self.metrics.record_diagnosis(diagnosis, time.perf_counter() - started, trigger="alertmanager")
        findings: list[Finding] = [
            f for f in diagnosis.findings if not scopes or any(finding_in_scope(f, s) for s in scopes)
        ]
        scoped = diagnosis.model_copy(update={"findings": findings})
        name = _alert_name(payload)
        log.info("alert diagnosed", extra={"alert": name, "scopes": scopes, "findings": len(findings)})
        if self.notifies and self.state is not None:
            scope = scopes[0] if len(scopes) == 1 else {}
            threaded = (fingerprint(f) for f in findings)
            thread_of = next((fp for fp in threaded if self.state.thread_of(fp)[1] is not None), None)
            self.state.enqueue(
                NotificationKind.alert_report,
                {"diagnosis": scoped.model_dump(mode="json"), "alert": name, "scope": scope},
                fingerprint=thread_of,
            )
            self.wake_outbox()
        return scoped


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


def _alert_name(payload: Mapping[str, Any]) -> str:
    for key in ("commonLabels", "groupLabels"):
        labels = payload.get(key)
        if isinstance(labels, dict) and labels.get("alertname"):
            return str(labels["alertname"])
    alerts = payload.get("alerts") or []
    if alerts and isinstance(alerts[0], dict):
        return str((alerts[0].get("labels") or {}).get("alertname", "an alert"))
    return "an alert"


async def run_daemon(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    """Run the daemon until SIGTERM/SIGINT (or ``stop`` is set), then shut down gracefully."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    daemon = Daemon(settings)
    try:
        await daemon.start()
        await stop.wait()
        log.info("stop requested: shutting down")
    finally:
        await daemon.stop()
