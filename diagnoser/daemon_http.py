"""The daemon's HTTP side: /healthz, /readyz, /metrics and the Alertmanager webhook receiver.

It is an aiohttp application on the daemon's own event loop: the Alertmanager receiver runs a
diagnosis, which is asyncio code sharing the daemon's sources, so serving from a thread (the
standard library's ``http.server``) would mean crossing threads for every request. aiohttp is
already a dependency of slack-sdk's asyncio clients.

- ``GET /healthz``: 200 while the process serves requests.
- ``GET /readyz``: 200 when the scheduler runs and the last diagnosis is recent enough; the
  body adds the last diagnosis' coverage line (what was evaluated, without data, skipped).
- ``GET /findings``: the active findings (what Slack was told about, or would have been) as JSON.
- ``GET /metrics``: Prometheus text format (prometheus-client), see :class:`DaemonMetrics`.
- ``POST /alertmanager``: Alertmanager's webhook JSON (version 4) with ``Authorization: Bearer
  <daemon.alertmanager_token>``; answers ``202`` at once and runs, in the background, a diagnosis
  restricted to the alerts' labels (namespace, job, service, pod...: a finding stays when the
  labels it shares with an alert agree), posted to Slack in the thread of the finding it
  concerns. One diagnosis per ``groupKey`` within ``daemon.alert_group_cooldown_s`` (repeats:
  ``202 duplicate``), at most ``daemon.alert_concurrency`` at once, ``503`` when the backlog is
  full; a body that is not JSON, or nested deeper than :data:`MAX_JSON_DEPTH`, is ``400``.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from diagnoser.models import Diagnosis, Finding

__all__ = [
    "NON_SCOPE_LABELS",
    "DaemonMetrics",
    "DaemonView",
    "alert_scopes",
    "build_app",
    "finding_in_scope",
]

log = logging.getLogger(__name__)

#: Alert labels that describe the alert rather than what it is about; every other label of a
#: firing alert (namespace, job, service, pod, pool...) narrows the diagnosis.
NON_SCOPE_LABELS = frozenset({"alertname", "severity", "alertstate", "prometheus", "receiver", "priority"})
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
        r = self.registry
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
        self.notifications_sent = Counter(
            "diagnoser_notifications_sent", "Notifications Slack accepted, by kind.", ["kind"], registry=r
        )
        self.notifications_failed = Counter(
            "diagnoser_notifications_failed", "Attempts to notify that failed, by kind.", ["kind"], registry=r
        )
        self.notifications_queued = Gauge(
            "diagnoser_notifications_queued", "Notifications waiting in the outbox.", registry=r
        )
        self.last_diagnosis = Gauge(
            "diagnoser_last_diagnosis_timestamp_seconds", "When the last diagnosis finished.", registry=r
        )
        self.leader = Gauge("diagnoser_leader", "1 while this replica is the leader (notifies).", registry=r)
        self.probe_runs = Counter(
            "diagnoser_probe_runs", "Probe runs, by probe and outcome.", ["probe", "outcome"], registry=r
        )
        self.probe_p99 = Gauge(
            "diagnoser_probe_last_p99_seconds",
            "p99 latency of the last run of each probe.",
            ["probe"],
            registry=r,
        )
        self.probe_latency = _ProbeLatencyCollector()
        r.register(self.probe_latency)
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
        #: The last scheduled diagnosis' coverage line, for /readyz.
        self.coverage_summary: str | None = None
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
        self.alert_webhooks = Counter(
            "diagnoser_alert_webhooks",
            "Alertmanager webhooks with firing alerts, by outcome: accepted, duplicate (same groupKey"
            " within the cooldown), busy (backlog full, answered 503).",
            ["outcome"],
            registry=r,
        )
        self.http_dropped = Counter(
            "diagnoser_http_connections_dropped",
            "HTTP connections closed by the daemon: connection_cap (answered 503), header_timeout (408).",
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


class DaemonView(Protocol):
    """What the HTTP side needs from the daemon."""

    metrics: DaemonMetrics

    def readiness(self) -> tuple[bool, str]: ...

    def alertmanager_token(self) -> str | None: ...

    def active_findings(self) -> list[Finding]: ...

    def accept_alert(self, payload: Mapping[str, Any]) -> tuple[str, str]: ...


def alert_scopes(payload: Mapping[str, Any]) -> list[dict[str, str]]:
    """One scope (the alert's labels but :data:`NON_SCOPE_LABELS`) per firing alert, no duplicates."""
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise ValueError("'alerts' must be a list")
    scopes: list[dict[str, str]] = []
    for alert in alerts:
        if not isinstance(alert, dict) or alert.get("status", "firing") != "firing":
            continue
        labels = alert.get("labels") or {}
        if not isinstance(labels, dict):
            raise ValueError("an alert's 'labels' must be an object")
        scope = {str(k): str(v) for k, v in labels.items() if k not in NON_SCOPE_LABELS}
        if scope not in scopes:
            scopes.append(scope)
    return scopes


def finding_in_scope(finding: Finding, scope: Mapping[str, str]) -> bool:
    """True when the finding is about the alert's workload, or about nothing narrower.

    Labels the finding and the alert share must agree, on the finding itself or on one of its
    evidence rows (a pool finding grouped by job still names its namespace in the evidence).
    A cluster-wide cause (no scope label at all, e.g. a missing metrics-server) can explain
    any alert and stays in.
    """
    rows = [finding.labels, *(e.labels for e in finding.evidence)]
    shared_any = False
    for labels in rows:
        shared = [k for k in scope if k in labels]
        if shared:
            shared_any = True
            if all(labels[k] == scope[k] for k in shared):
                return True
    return not shared_any


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Alertmanager's webhook is 4 levels deep; anything far deeper is not one.
MAX_JSON_DEPTH = 32


def _nesting_depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (iterative: no recursion to exhaust)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item)
    return deepest


def build_app(daemon: DaemonView) -> web.Application:
    """The aiohttp application serving the daemon's endpoints."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        ready, reason = daemon.readiness()
        coverage = daemon.metrics.coverage_summary
        text = reason + (f"\ncoverage: {coverage}" if coverage else "")
        return web.Response(status=200 if ready else 503, text=text + "\n")

    async def findings(request: web.Request) -> web.Response:
        active = [finding.model_dump(mode="json") for finding in daemon.active_findings()]
        return web.json_response({"findings": active})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=daemon.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def alertmanager(request: web.Request) -> web.Response:
        token = daemon.alertmanager_token()
        if token is None:
            return web.json_response(
                {"error": "the Alertmanager receiver is off (set daemon.alertmanager_token)"}, status=404
            )
        sent = request.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return web.json_response(
                {"error": "unauthorized"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="diagnoser"'},
            )
        try:
            payload = json.loads(await request.read())
            if _nesting_depth(payload) > MAX_JSON_DEPTH:
                raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
            if not isinstance(payload, dict):
                raise ValueError("the body must be a JSON object")
            scopes = alert_scopes(payload)
        except RecursionError:  # nested deeper than the parser's own limit
            too_deep = f"not an Alertmanager webhook payload: JSON nested deeper than {MAX_JSON_DEPTH} levels"
            return web.json_response({"error": too_deep}, status=400)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            return web.json_response({"error": f"not an Alertmanager webhook payload: {exc}"}, status=400)
        if not scopes:
            # A group whose alerts all resolved (send_resolved): nothing to explain.
            return web.json_response({"status": "ignored", "reason": "no firing alerts"})
        # Answer at once: Alertmanager's webhook timeout must never see a diagnosis's duration
        # (it would retry, and each retry used to be one more diagnosis and one more post).
        outcome, detail = daemon.accept_alert(payload)
        body = {"status": outcome, "detail": detail, "groupKey": payload.get("groupKey")}
        if outcome == "busy":
            return web.json_response(body, status=503, headers={"Retry-After": "30"})
        return web.json_response(body, status=202)

    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/findings", findings)
    app.router.add_post("/alertmanager", alertmanager)
    return app
