"""Verified fixes: when an incident resolves, a confirm probe at the load it failed under, told in its thread.

With ``verify.enabled`` (off by default), each incident the leader resolves whose service has a
probe target gets one bounded confirm probe (:mod:`diagnoser.probe.confirm`), and its thread a
reply: ``p99 at 95 req/s: 2.4 s -> 140 ms, confirmed`` or ``not confirmed: p99 still 1.9 s at
95 req/s (SLO 300 ms; 2.4 s before)``.

- **Which target**: the one that measures the incident's service, as capacity on record maps
  them (:mod:`~diagnoser.daemon.capacity_record`), said and never guessed from a URL: a
  ``daemon.probe_files`` file with ``service:`` (and ``namespace:``) first, else a
  ``capacity.schedule`` entry's ``service``, else the target of the service's capacity on record.
  A finding about no service, or a service without one, gets no probe.
- **Which rate**: the service's request rate when its cause was last seen (over the rules' window
  before it cleared), read from Prometheus as the capacity line reads it
  (:func:`~diagnoser.daemon.capacity_record.current_load`); else the load its message showed
  against its capacity on record; else the probe file's own rate. Lowered to ``probe.max_rate`` when above
  it, and the line says so (``at 1,000 req/s (capped from 2,400 by probe.max_rate)``).
- **Before**: the p99 of its ``latency_slo_breach`` finding as the message last showed it.
- **The SLO**: ``slo.p99_ms`` and ``slo.error_ratio``.
- **Safety**: nobody typed the target, so it is held to what a probe file is: its host in
  ``probe.allowed_hosts``, the address rule, every ``probe.*`` cap. A refused probe sends
  nothing and posts nothing: one WARNING line and ``diagnoser_confirm_probes_total{outcome=
  "refused"}`` (a refusal is the operator's to fix, where the probe job's refusals already are;
  the thread tells only what was measured).
- **Bounds**: the leader only (checked again when the probe starts), one at a time, at most
  :data:`MAX_WAITING` waiting (more are dropped with a WARNING), ``verify.delay_s`` after the
  resolution, ``verify.duration_s`` long (at most ``probe.max_duration_s``); an incident back
  before its probe starts is not probed (its thread says it is back). Shutdown waits for a
  probe in flight like any job, then cancels it. ::

    probes = ConfirmProbes(host)
    probes.resolved(queued)     # the outbox entries one diagnosis queued
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from diagnoser.config import Settings
from diagnoser.daemon.capacity_record import CapacityRun, current_load
from diagnoser.daemon.incidents import service_of
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.daemon.schedule import GuardedRun
from diagnoser.daemon.state import StateStore
from diagnoser.errors import ConfigError, DiagnoserError, ProbeSafetyError, StateError
from diagnoser.models import Finding, evidence_unit
from diagnoser.notify.outbox import OutboxEntry
from diagnoser.notify.payloads import IncidentPayload, IncidentView, NotificationKind
from diagnoser.probe.confirm import Confirmation, confirm, confirm_spec
from diagnoser.probe.entry import build_spec
from diagnoser.signals import Catalogue
from diagnoser.sources.base import Sources

__all__ = [
    "MAX_WAITING",
    "ConfirmHost",
    "ConfirmProbes",
    "ConfirmTarget",
    "before_p99_ms",
    "confirm_targets",
    "target_for",
]

log = logging.getLogger(__name__)

#: Confirm probes waiting for the one in flight: a storm of resolutions must not queue an hour of load.
MAX_WAITING = 4
#: The cause whose p99 is the "before" of the line.
_LATENCY = "latency_slo_breach"


@dataclass(frozen=True)
class ConfirmTarget:
    """A target (a probe file or a URL) and the service it measures, and where that was said."""

    target: str
    service: str
    namespace: str | None
    said_by: str


def confirm_targets(settings: Settings, on_record: Iterable[CapacityRun] = ()) -> list[ConfirmTarget]:
    """Every target that says which service it measures, in the order they are preferred:
    the daemon's probe files, ``capacity.schedule``'s entries, then the capacities on record."""
    found: list[ConfirmTarget] = []
    for i, path in enumerate(settings.daemon.probe_files):
        try:
            spec, _ = build_spec(str(path))
        except ConfigError:  # the probe job reports it at each run
            continue
        if spec.service:
            found.append(ConfirmTarget(str(path), spec.service, spec.namespace, f"daemon.probe_files[{i}]"))
    for entry in settings.capacity.schedule:
        service, namespace = entry.service, entry.namespace
        if not service and not entry.target.startswith(("http://", "https://", "grpc://", "grpcs://")):
            try:
                spec, _ = build_spec(entry.target)
            except ConfigError:
                continue
            service, namespace = spec.service, namespace or spec.namespace
        if service:
            found.append(ConfirmTarget(entry.target, service, namespace, "capacity.schedule"))
    for run in sorted(on_record, key=lambda r: -r.measured_at):
        if run.service:
            found.append(ConfirmTarget(run.target, run.service, run.namespace, "capacity on record"))
    return found


def target_for(targets: Sequence[ConfirmTarget], findings: Iterable[Finding]) -> ConfirmTarget | None:
    """The target of the first finding (lead first) whose service one measures (in its namespace
    when the target names one)."""
    for finding in findings:
        namespace, service = service_of(finding)
        if not service:
            continue
        for target in targets:
            if target.service == service and target.namespace in (None, namespace):
                return target
    return None


def before_p99_ms(view: IncidentView) -> float | None:
    """The p99 (ms) of the incident's latency finding as its message last showed it, if it has one
    whose unit is known."""
    for finding in view.findings:
        if finding.cause != _LATENCY:
            continue
        for row in finding.evidence:
            if row.value is None:
                continue
            unit = evidence_unit(row)
            if unit == "s":
                return row.value * 1000
            if unit == "ms":
                return row.value
    return None


class ConfirmHost(Protocol):
    """What the confirm probes need from the daemon."""

    settings: Settings
    metrics: DaemonMetrics
    state: StateStore | None

    @property
    def notifies(self) -> bool: ...

    @property
    def prometheus_sources(self) -> Sources | None: ...

    @property
    def catalogue(self) -> Catalogue: ...

    @property
    def window(self) -> str: ...

    def wake_outbox(self) -> None: ...

    def guarded(self, name: str, func: Callable[[], Awaitable[Any]]) -> GuardedRun: ...


class ConfirmProbes:
    """The confirm probes of resolved incidents, one at a time; see the module docstring."""

    def __init__(self, host: ConfirmHost) -> None:
        self.host = host
        self.config = host.settings.verify
        self._one = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._scheduled: set[int] = set()

    def resolved(self, entries: Iterable[OutboxEntry]) -> None:
        """Schedule a confirm probe for each incident ``entries`` resolve (one per incident,
        whatever the receivers)."""
        if not self.config.enabled:
            return
        for entry in entries:
            payload = entry.payload
            if entry.kind is not NotificationKind.resolved or entry.incident_id is None:
                continue
            if not isinstance(payload, IncidentPayload) or entry.incident_id in self._scheduled:
                continue
            if len(self._tasks) > MAX_WAITING:
                log.warning("confirm probe of incident %d not scheduled: %d already waiting",
                            entry.incident_id, len(self._tasks))  # fmt: skip
                continue
            self._schedule(entry.incident_id, payload.view)

    def _schedule(self, incident_id: int, view: IncidentView) -> None:
        self._scheduled.add(incident_id)

        async def confirm_probe() -> None:
            try:
                await self._confirm(incident_id, view)
            finally:
                self._scheduled.discard(incident_id)

        task = asyncio.get_running_loop().create_task(self.host.guarded("confirm", confirm_probe)())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _confirm(self, incident_id: int, view: IncidentView) -> None:
        host = self.host
        state = host.state
        if state is None:
            return
        targets = confirm_targets(host.settings, state.capacities_on_record())
        target = target_for(targets, view.findings)
        if target is None:
            log.info("no confirm probe for incident %d: no probe target measures its service", incident_id)
            return
        if self.config.delay_s:
            await asyncio.sleep(self.config.delay_s)
        async with self._one:
            thread = state.incident_thread(incident_id)
            if thread is None or not thread.cleared:
                log.info("no confirm probe for incident %d: it is back", incident_id)
                return
            if not host.notifies:  # leadership moved meanwhile: the new leader says nothing of it
                return
            await self._probe(incident_id, view, target)

    async def _probe(self, incident_id: int, view: IncidentView, target: ConfirmTarget) -> None:
        host, probe_settings = self.host, self.host.settings.probe
        extra: dict[str, Any] = {"incident": incident_id, "target": target.target, "service": target.service}
        try:
            spec, _ = build_spec(target.target)
            rate, read_from = await self._rate(view, target, spec.peak_rate)
            plan = confirm_spec(spec, rate=rate, duration_s=self.config.duration_s, settings=probe_settings,
                                cap=True)  # fmt: skip
            slo = host.settings.slo
            # Nobody typed this target: the allowlist and the address rule apply, as to a probe file.
            before = before_p99_ms(view)
            found = await confirm(plan, probe_settings, explicit_target=False, slo_p99_ms=slo.p99_ms,
                                  slo_error_ratio=slo.error_ratio, before_p99_ms=before)  # fmt: skip
        except ProbeSafetyError as exc:
            host.metrics.confirm_probes.labels("refused").inc()
            log.warning("confirm probe of incident %d refused (%s said %s measures %s): %s", incident_id,
                        target.said_by, target.target, target.service, exc, extra=extra)  # fmt: skip
            return
        except DiagnoserError as exc:
            host.metrics.confirm_probes.labels("failed").inc()
            log.warning("confirm probe of incident %d did not run: %s", incident_id, exc, extra=extra)
            return
        outcome = "confirmed" if found.confirmed else "not_confirmed"
        host.metrics.confirm_probes.labels(outcome).inc()
        log.info("confirm probe done: %s", found.text(),
                 extra={**extra, "outcome": outcome, "rate": found.rate, "rate_from": read_from,
                        "p99_ms": found.p99_ms})  # fmt: skip
        self._tell(incident_id, view, found)

    def _tell(self, incident_id: int, view: IncidentView, found: Confirmation) -> None:
        """Queue the verdict for the incident's thread (every receiver whose ``match`` takes it)."""
        state = self.host.state
        if state is None or not self.host.notifies:
            return
        payload = IncidentPayload(view=view, note=found.text(), confirmation=found)
        try:
            state.enqueue(NotificationKind.verified, payload, view.lead.identity, incident_id=incident_id)
        except StateError as exc:
            log.error("confirm probe of incident %d not queued: %s", incident_id, exc)
            return
        self.host.wake_outbox()

    async def _rate(self, view: IncidentView, target: ConfirmTarget, own: float) -> tuple[float, str]:
        """The service's request rate when its cause was last seen, and where it was read.

        The window before the cause cleared holds the load the service was failing under most
        recently; earlier in a long incident (or one reopened) the load may have been a load
        test's steps or a spike that is not the load the fix must hold.
        """
        sources = self.host.prometheus_sources
        if sources is not None:
            namespace, service = target.namespace or "", target.service
            cleared = view.cause_cleared_at or (view.resolved_at or view.opened_at) - view.resolve_after_s
            at = datetime.fromtimestamp(max(cleared, view.opened_at), UTC)
            loads = await current_load(sources, self.host.catalogue, window=self.host.window, at=at,
                                       services=[service])  # fmt: skip
            value = loads.get((namespace, service))
            if value is None:  # scraped outside Kubernetes: its series name no namespace
                value = loads.get(("", service))
            if value is None and not namespace:
                value = sum(v for (_, s), v in loads.items() if s == service) or None
            if value is not None and value > 0:
                return max(round(value, 1), 0.1), "prometheus"
        if view.capacity is not None and view.capacity.rps_now:
            return max(round(view.capacity.rps_now, 1), 0.1), "the load its message showed"
        return own, "the probe's own rate"
