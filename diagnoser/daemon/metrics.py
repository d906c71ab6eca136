"""The daemon's own metrics, served on ``/metrics``: diagnoses, findings, coverage, probes, notifications.

:class:`DaemonMetrics` keeps them in a registry of its own (several daemons can share a process,
as the tests do); the outbox delivery (:mod:`diagnoser.notify.delivery`) moves the notification
counters, the jobs the rest. Probe latencies arrive as one HdrHistogram per run and are added up
into a Prometheus histogram by a collector of their own. ::

    metrics = DaemonMetrics()
    metrics.record_diagnosis(diagnosis, seconds=0.4, trigger="schedule")
    body = metrics.exposition()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from diagnoser.daemon.capacity_record import CapacityRun
from diagnoser.errors import StateError
from diagnoser.models import Diagnosis

__all__ = ["PROBE_BUCKETS_S", "CapacityCollector", "DaemonMetrics"]

log = logging.getLogger(__name__)

#: Probe latency buckets in seconds: from a fast health check to a request timing out.
PROBE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _ProbeLatencyCollector(Collector):
    """Cumulative probe latency buckets, filled from each run's HdrHistogram.

    A run's latencies arrive as one HdrHistogram rather than one value at a time, so the buckets
    are added up here and exposed as a Prometheus histogram.
    """

    def __init__(self) -> None:
        self.buckets: dict[str, list[float]] = {}
        self.sums: dict[str, float] = {}

    def add(self, probe: str, values_us: Iterable[tuple[int, int]]) -> None:
        counts = self.buckets.setdefault(probe, [0.0] * (len(PROBE_BUCKETS_S) + 1))
        total = self.sums.get(probe, 0.0)
        for value_us, count in values_us:
            seconds = value_us / 1e6
            total += seconds * count
            for index, bound in enumerate(PROBE_BUCKETS_S):
                if seconds <= bound:
                    counts[index] += count
                    break
            else:
                counts[-1] += count
        self.sums[probe] = total

    def collect(self) -> Iterable[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "diagnoser_probe_latency_seconds",
            "Probe request latency from the intended send time, by probe definition.",
            labels=["probe"],
        )
        for probe, counts in self.buckets.items():
            cumulative: list[tuple[str, float]] = []
            running = 0.0
            for bound, count in zip((*map(str, PROBE_BUCKETS_S), "+Inf"), counts, strict=True):
                running += count
                cumulative.append((bound, running))
            family.add_metric([probe], cumulative, self.sums[probe])
        yield family


class DaemonMetrics:
    """The daemon's own metrics, in a registry of its own (several daemons can share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        #: The last scheduled diagnosis' coverage line, for /readyz.
        self.coverage_summary: str | None = None
        self._add_diagnosis_metrics(self.registry)
        self._add_probe_metrics(self.registry)
        self._add_notification_metrics(self.registry)
        self._add_health_metrics(self.registry)
        self._add_capacity_metrics(self.registry)

    def _add_diagnosis_metrics(self, r: CollectorRegistry) -> None:
        self.diagnoses = Counter(
            "diagnoser_diagnoses",
            "Diagnoses run, by trigger and outcome.",
            ["trigger", "outcome"],
            registry=r,
        )
        self.diagnosis_duration = Histogram(
            "diagnoser_diagnosis_duration_seconds",
            "Wall time of one diagnosis.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.findings = Gauge(
            "diagnoser_findings",
            "Findings of the last scheduled diagnosis.",
            ["cause", "severity"],
            registry=r,
        )
        self.source_errors = Counter(
            "diagnoser_source_errors", "Source failures met by diagnoses, by source.", ["source"], registry=r
        )
        self.rule_coverage = Gauge(
            "diagnoser_rules",
            "Rules of the last scheduled diagnosis, by coverage status "
            "(evaluated, no_data, skipped, error, silenced).",
            ["status"],
            registry=r,
        )
        self.source_coverage = Gauge(
            "diagnoser_source_status",
            "1 for each source's coverage status in the last scheduled diagnosis "
            "(evaluated, no_data, skipped, error).",
            ["source", "status"],
            registry=r,
        )
        self.last_diagnosis = Gauge(
            "diagnoser_last_diagnosis_timestamp_seconds", "When the last diagnosis finished.", registry=r
        )

    def _add_probe_metrics(self, r: CollectorRegistry) -> None:
        self.probe_runs = Counter(
            "diagnoser_probe_runs", "Probe runs, by probe and outcome.", ["probe", "outcome"], registry=r
        )
        self.confirm_probes = Counter(
            "diagnoser_confirm_probes",
            "Confirm probes after a resolution, by outcome (confirmed, not_confirmed, refused, failed).",
            ["outcome"],
            registry=r,
        )
        self.probe_p99 = Gauge(
            "diagnoser_probe_last_p99_seconds",
            "p99 latency of the last run of each probe.",
            ["probe"],
            registry=r,
        )
        self.probe_latency = _ProbeLatencyCollector()
        r.register(self.probe_latency)

    def _add_notification_metrics(self, r: CollectorRegistry) -> None:
        self.notifications_sent = Counter(
            "diagnoser_notifications_sent", "Notifications Slack accepted, by kind.", ["kind"], registry=r
        )
        self.notifications_failed = Counter(
            "diagnoser_notifications_failed", "Attempts to notify that failed, by kind.", ["kind"], registry=r
        )
        self.notifications_queued = Gauge(
            "diagnoser_notifications_queued", "Notifications waiting in the outbox.", registry=r
        )
        self.notifications_dead_lettered = Counter(
            "diagnoser_notifications_dead_lettered",
            "Notifications Slack refused for good (kept in the state's dead_letters table),"
            " by kind and error.",
            ["kind", "reason"],
            registry=r,
        )
        self.notifications_in_doubt = Counter(
            "diagnoser_notifications_in_doubt",
            "Posts whose answer never came, by what a look at the channel found: found, absent,"
            " reposted_unverified (a webhook, or no permission to read the channel).",
            ["outcome"],
            registry=r,
        )
        self.slack_threads_lost = Counter(
            "diagnoser_slack_threads_lost",
            "Replies whose Slack thread was gone, posted at top level instead.",
            registry=r,
        )
        self.receiver_stuck = Gauge(
            "diagnoser_receiver_stuck",
            "1 while a receiver's oldest queued notification is undelivered for longer than"
            " notify.delivery.stuck_after_s.",
            ["receiver"],
            registry=r,
        )

    def _add_health_metrics(self, r: CollectorRegistry) -> None:
        self.leader = Gauge("diagnoser_leader", "1 while this replica is the leader (notifies).", registry=r)
        self.alert_webhooks = Counter(
            "diagnoser_alert_webhooks",
            "Alertmanager webhooks with firing alerts, by outcome: accepted, duplicate (same groupKey"
            " within the cooldown), busy (backlog full, answered 503).",
            ["outcome"],
            registry=r,
        )
        self.http_dropped = Counter(
            "diagnoser_http_connections_dropped",
            "HTTP connections closed by the daemon: connection_cap and peer_cap (answered 503), "
            "header_timeout (408).",
            ["reason"],
            registry=r,
        )
        self.state_errors = Counter(
            "diagnoser_state_errors",
            "Writes or reads of the state file that failed, by reason (disk_full, read_only, io...).",
            ["reason"],
            registry=r,
        )

    def record_diagnosis(self, diagnosis: Diagnosis, seconds: float, *, trigger: str) -> None:
        """Count one diagnosis; a scheduled one also sets the findings and coverage gauges."""
        outcome = "source_errors" if diagnosis.errors else "ok"
        self.diagnoses.labels(trigger, outcome).inc()
        self.diagnosis_duration.observe(seconds)
        for error in diagnosis.errors:
            self.source_errors.labels(error.source).inc()
        if trigger == "schedule":
            counts: dict[tuple[str, str], int] = {}
            for finding in diagnosis.findings:
                key = (finding.cause, finding.severity.value)
                counts[key] = counts.get(key, 0) + 1
            # Causes that went away must drop to nothing, not stay at their last count.
            self.findings.clear()
            for (cause, severity), count in counts.items():
                self.findings.labels(cause, severity).set(count)
            self._record_coverage(diagnosis)

    def _record_coverage(self, diagnosis: Diagnosis) -> None:
        coverage = diagnosis.coverage
        if coverage is None:
            return
        self.coverage_summary = coverage.summary
        for status in ("evaluated", "no_data", "skipped", "error", "silenced"):
            self.rule_coverage.labels(status).set(coverage.counts.get(status, 0))
        self.source_coverage.clear()
        for source in coverage.sources:
            self.source_coverage.labels(source.source, source.status).set(1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def _add_capacity_metrics(self, r: CollectorRegistry) -> None:
        #: The capacity on record of each target, read from the state once the daemon opened it.
        self.capacity = CapacityCollector(lambda: [])
        r.register(self.capacity)



class CapacityCollector(Collector):
    """The capacity on record of each target, read from the state file at each scrape.

    Read at scrape time rather than kept in gauges: a ``diagnose capacity`` run records into the
    state file the daemon has open, and ``/metrics`` shows it at the next scrape without a restart.
    A state file that cannot be read at that moment exports none of them (the error is counted by
    the job that meets it next).
    """

    def __init__(self, runs: Callable[[], Sequence[CapacityRun]]) -> None:
        self.runs = runs

    def collect(self) -> Iterable[GaugeMetricFamily]:
        rps = GaugeMetricFamily(
            "diagnoser_capacity_rps",
            "Capacity on record of each diagnose capacity target: the highest rate that held its SLO.",
            labels=["target", "service"],
        )
        p99 = GaugeMetricFamily(
            "diagnoser_capacity_slo_p99_seconds",
            "The p99 latency SLO the capacity on record was measured against.",
            labels=["target"],
        )
        measured = GaugeMetricFamily(
            "diagnoser_capacity_measured_timestamp_seconds",
            "When the capacity on record was measured (the run's last step ended).",
            labels=["target"],
        )
        try:
            runs = self.runs()
        except StateError as exc:
            log.warning("capacity on record not exported: %s", exc)
            runs = []
        for run in runs:
            if run.capacity_rps is None:
                continue
            rps.add_metric([run.target, run.service or ""], run.capacity_rps)
            p99.add_metric([run.target], run.slo_p99_ms / 1000)
            measured.add_metric([run.target], run.measured_at)
        yield from (rps, p99, measured)
