"""Capacity on record: each ``diagnose capacity`` run kept in the state file, and read against the load now.

A run is one row of the state's ``capacity_runs`` table (:class:`CapacityRun`: the target, the
service it measures, the capacity found, the SLO it was judged by, why it stopped there, the
bottleneck's cause, when). Every run is kept; the *capacity on record* of a target is its newest
run that found one (a run that was interrupted, or in which no step held, is kept but is not it).

Which service a target measures is said, never guessed from its URL: ``--service`` (and
``--service-namespace``) on the command line, else ``service:`` (and ``namespace:``) in the
probe file, else the one service whose latency or error symptom the rules found at the run's
first failing step (:func:`service_measured`); with none of those, the run is kept without a
service and no incident shows it.

The daemon reads the service's request rate now (:func:`current_load`: the ``http.server.duration``
signal's count through the catalogue, every convention Prometheus holds) and
:class:`CapacityBook` gives each incident its :class:`~diagnoser.notify.payloads.CapacityReading`:
the load now against the capacity of the service one of its findings is about. ::

    store.record_capacity(run_from_report(report, service="checkout", namespace="shop"))
    book = CapacityBook(store.capacities_on_record(), loads, now=time.time(), max_age_s=30 * 86400)
    reading = book.reading_for(view.findings)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from diagnoser.capacity.report import CapacityReport, Limit
from diagnoser.checks.registry import CheckContext
from diagnoser.checks.signal import SignalParams, signal_check
from diagnoser.models import Finding, SourceError
from diagnoser.notify.payloads import CapacityReading
from diagnoser.signals import Catalogue
from diagnoser.sources.base import Sources

__all__ = [
    "LOAD_QUERY",
    "CapacityBook",
    "CapacityRun",
    "capacity_book",
    "current_load",
    "run_from_report",
    "service_measured",
]

log = logging.getLogger(__name__)

#: A service's request rate: the count of its server-side duration histogram, per service, in
#: whichever convention Prometheus holds (the same signal the dependency rules divide by).
LOAD_QUERY = "sum by (namespace, service) (rate({{http.server.duration:count}}[${window}]))"


@dataclass(frozen=True)
class CapacityRun:
    """One ``diagnose capacity`` run as the state keeps it."""

    target: str
    capacity_rps: float | None
    slo_p99_ms: float
    slo_error_ratio: float
    #: :class:`~diagnoser.capacity.report.Limit`'s value: latency, errors, max_rate, aborted.
    limit: str
    measured_at: float
    service: str | None = None
    namespace: str | None = None
    bottleneck_cause: str | None = None

    @property
    def on_record(self) -> bool:
        """A capacity was found (an interrupted run's, or one where no step held, is not one)."""
        return self.capacity_rps is not None and self.limit != Limit.aborted.value


def service_measured(report: CapacityReport) -> tuple[str, str] | None:
    """``(namespace, service)`` of the one service whose symptom the rules found at the run's first
    failing step; ``None`` when none did, or several did (a target's service is then not known)."""
    found = {
        (f.labels.get("namespace", ""), f.service)
        for f in report.findings
        if f.kind == "symptom" and f.service
    }
    return found.pop() if len(found) == 1 else None


def run_from_report(
    report: CapacityReport,
    *,
    service: str | None,
    namespace: str | None = None,
    measured_at: float | None = None,
) -> CapacityRun:
    """The row a report makes (``measured_at``: its last step's end, else now)."""
    if measured_at is None:
        ends = [s.ended_at.timestamp() for s in report.steps]
        measured_at = max(ends) if ends else time.time()
    return CapacityRun(
        target=report.target,
        capacity_rps=report.capacity_rps,
        slo_p99_ms=report.slo.p99_ms,
        slo_error_ratio=report.slo.error_ratio,
        limit=report.limit.value,
        measured_at=measured_at,
        service=service or None,
        namespace=namespace or None,
        bottleneck_cause=report.bottleneck.cause if report.bottleneck is not None else None,
    )


async def current_load(
    sources: Sources,
    catalogue: Catalogue,
    *,
    window: str,
    at: datetime,
    services: Iterable[str] = (),
) -> dict[tuple[str, str], float]:
    """Requests per second each service serves at ``at``, by ``(namespace, service)``.

    Read through the ``signal`` check kind, so every convention of the catalogue (and every OTLP
    spelling Prometheus holds) answers; ``services``: keep only these (all when empty). A
    Prometheus that fails or is not configured reads as nothing: the line then says so.
    """
    if sources.prometheus is None:
        return {}
    params = SignalParams.model_validate(
        {"query": LOAD_QUERY.replace("${window}", window)}, context={"catalogue": catalogue}
    )
    context = CheckContext(at=at, sources=sources, catalogue=catalogue, window=window)
    try:
        rows = await signal_check(params, context)
    except Exception as exc:  # a reading is a refinement: the incident goes out without it
        log.warning("cannot read the services' request rates: %s", exc)
        return {}
    if isinstance(rows, SourceError):
        log.info("cannot read the services' request rates: %s", rows.message)
        return {}
    wanted = set(services)
    loads: dict[tuple[str, str], float] = {}
    for row in rows:
        service = row.labels.get("service", "")
        if not service or row.value is None or (wanted and service not in wanted):
            continue
        key = (row.labels.get("namespace", ""), service)
        loads[key] = loads.get(key, 0.0) + row.value
    return loads


class CapacityBook:
    """The capacities on record that are fresh enough, and the loads read now: an incident's line."""

    def __init__(
        self,
        runs: Sequence[CapacityRun],
        loads: Mapping[tuple[str, str], float],
        *,
        now: float,
        max_age_s: float,
    ) -> None:
        #: A capacity older than ``max_age_s`` is left out: the service has changed since (a
        #: release, a resize), and a stale number would mislead more than no number.
        self.runs = [r for r in runs if r.on_record and r.service and now - r.measured_at <= max_age_s]
        self.loads = dict(loads)

    @property
    def services(self) -> set[str]:
        return {r.service for r in self.runs if r.service}

    def load_of(self, namespace: str, service: str) -> float | None:
        """The service's request rate in ``namespace``; else the one its series read without a
        namespace (scraped outside Kubernetes, where a pool exporter may still add one)."""
        found = self.loads.get((namespace, service))
        return found if found is not None else self.loads.get(("", service))

    def reading_for(self, findings: Iterable[Finding]) -> CapacityReading | None:
        """The reading for the first finding (lead first) whose service has a capacity on record:
        the newest run for it, in its namespace when the run names one."""
        for finding in findings:
            service = finding.service
            if not service:
                continue
            namespace = finding.labels.get("namespace", "")
            matching = [
                r for r in self.runs if r.service == service and r.namespace in (None, namespace)
            ]
            if not matching:
                continue
            run = max(matching, key=lambda r: r.measured_at)
            assert run.capacity_rps is not None  # on record
            return CapacityReading(
                service=service,
                target=run.target,
                capacity_rps=run.capacity_rps,
                at_least=run.limit == Limit.max_rate.value,
                slo_p99_ms=run.slo_p99_ms,
                slo_error_ratio=run.slo_error_ratio,
                measured_at=run.measured_at,
                rps_now=self.load_of(namespace, service),
            )
        return None


async def capacity_book(
    runs: Sequence[CapacityRun],
    findings: Iterable[Finding],
    *,
    sources: Sources | None,
    catalogue: Catalogue,
    window: str,
    at: datetime,
    max_age_s: float,
) -> CapacityBook | None:
    """The book for one diagnosis: the fresh capacities on record, and the load now of the services
    ``findings`` are about that have one (no query at all when none has)."""
    book = CapacityBook(runs, {}, now=time.time(), max_age_s=max_age_s)
    if not book.runs:
        return None
    wanted = book.services & {f.service for f in findings}
    if wanted and sources is not None:
        book.loads = await current_load(sources, catalogue, window=window, at=at, services=wanted)
    return book
