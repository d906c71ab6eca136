"""The ``k8s`` check kind: named checks over the Kubernetes API.

A rule condition selects one check by name and tunes it with parameters::

    when:
      - k8s: {check: pod_startup, budget_seconds: "${params.budget_seconds}", statistic: p99}

Checks: ``metrics_server`` (metrics APIService absent or not Available, confirmed by HPAs that
cannot read metrics), ``hpa_at_max``, ``hpa_scale_up_slow``, ``hpa_cpu_on_queue_workload``,
``config_mount_failure``, ``pod_startup``, ``cross_zone_dependency``, ``oom_killed``,
``crash_loop`` and ``pvc_pending_storage_class``. Each returns one evidence row per thing to act
on (one HPA, one workload, one PVC...), so the engine emits one finding per row; a failed read
is returned as the source's :class:`SourceError`.

The API shows the cluster as it is now: with ``diagnose now --at`` in the past, time windows
(events, terminations, pod starts) end at that instant but objects are read as they are today.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes import KubernetesSource
from diagnoser.sources.kubernetes_objects import (
    condition,
    event_time,
    format_bytes,
    labels_match,
    parse_label_selector,
    parse_quantity,
    parse_time,
    percentile,
    replicaset_owners,
    workload_of,
)

__all__ = ["K8sCheckName", "K8sParams", "k8s_check"]

SOURCE = "kubernetes"
ZONE_LABEL = "topology.kubernetes.io/zone"

K8sCheckName = Literal[
    "metrics_server",
    "hpa_at_max",
    "hpa_scale_up_slow",
    "hpa_cpu_on_queue_workload",
    "config_mount_failure",
    "pod_startup",
    "cross_zone_dependency",
    "oom_killed",
    "crash_loop",
    "pvc_pending_storage_class",
]

#: Which optional parameters each check understands; any other one set in a rule is an error.
_CHECK_PARAMS: dict[str, frozenset[str]] = {
    "metrics_server": frozenset({"apiservice", "require_confirmation", "window_minutes"}),
    "hpa_at_max": frozenset({"min_ratio"}),
    "hpa_scale_up_slow": frozenset({"budget_seconds", "window_minutes"}),
    "hpa_cpu_on_queue_workload": frozenset({"queue_metric", "workloads"}),
    "config_mount_failure": frozenset({"window_minutes"}),
    "pod_startup": frozenset({"budget_seconds", "statistic", "min_pods", "window_minutes"}),
    "cross_zone_dependency": frozenset(
        {
            "service",
            "service_namespace",
            "clients",
            "min_share",
            "latency_seconds",
            "latency_query",
            "latency_threshold_seconds",
            "when_latency",
        }
    ),
    "oom_killed": frozenset({"min_count", "window_minutes"}),
    "crash_loop": frozenset({"min_restarts"}),
    "pvc_pending_storage_class": frozenset(),
}
_DEFAULT_BUDGET_S = {"hpa_scale_up_slow": 90.0, "pod_startup": 1.5}
#: HPA condition reasons that mean "the metrics API did not answer".
_METRIC_FAILURES = frozenset({"FailedGetResourceMetric", "FailedGetContainerResourceMetric"})


class K8sParams(BaseModel):
    """Parameters of a ``k8s`` condition. ``check`` picks the check; the others tune it."""

    model_config = ConfigDict(extra="forbid")

    check: K8sCheckName
    #: Narrow the configured namespace scope for this condition (``[]``: all namespaces).
    namespaces: list[str] | None = None
    #: How far back events, terminations and pod starts count, ending at the evaluation instant.
    window_minutes: float = Field(default=60.0, gt=0)
    apiservice: str = "v1beta1.metrics.k8s.io"
    #: Report a missing metrics API only when some HPA or event shows it matters.
    require_confirmation: bool = True
    #: hpa_at_max: current/target metric ratio that counts as over target (the HPA's own tolerance is 10 %).
    min_ratio: float = Field(default=1.1, gt=0)
    budget_seconds: float | None = Field(default=None, gt=0)
    statistic: Literal["p50", "p99"] = "p99"
    min_pods: int = Field(default=1, ge=1)
    queue_metric: str | None = None
    #: Workloads (Deployment names) that consume the queue; empty: those whose name the metric contains.
    workloads: list[str] = Field(default_factory=list)
    service: str | None = None
    service_namespace: str | None = None
    #: Label selector of the client pods (``app=web``).
    clients: str | None = None
    min_share: float = Field(default=0.5, ge=0, le=1)
    latency_seconds: float | None = Field(default=None, ge=0)
    latency_query: str | None = None
    latency_threshold_seconds: float = Field(default=0.05, ge=0)
    #: high: only with latency over threshold; unknown: only when no latency is measurable; any: always.
    when_latency: Literal["high", "unknown", "any"] = "high"
    min_count: int = Field(default=1, ge=1)
    min_restarts: int = Field(default=3, ge=0)

    @model_validator(mode="after")
    def _parameters_fit_the_check(self) -> K8sParams:
        allowed = _CHECK_PARAMS[self.check] | {"check", "namespaces"}
        stray = sorted(self.model_fields_set - allowed)
        if stray:
            raise ValueError(f"check {self.check} does not use {', '.join(stray)}")
        if self.check == "cross_zone_dependency" and self.clients:
            parse_label_selector(self.clients)
        return self

    @property
    def budget(self) -> float:
        return (
            self.budget_seconds
            if self.budget_seconds is not None
            else _DEFAULT_BUDGET_S.get(self.check, 60.0)
        )


_Check = Callable[[K8sParams, CheckContext, KubernetesSource], Awaitable[CheckResult]]


@check_kind("k8s", params=K8sParams, reads={"kubernetes"}, also_reads={"prometheus"})
async def k8s_check(params: K8sParams, ctx: CheckContext) -> CheckResult:
    """Run the named Kubernetes check; see the module docstring for the list."""
    source: KubernetesSource = ctx.require(ctx.sources.kubernetes, SOURCE)
    return await _CHECKS[params.check](params, ctx, source)


# --- shared reads -----------------------------------------------------------------------------


async def _list_namespaced(
    source: KubernetesSource, params: K8sParams, *resources: str
) -> list[list[dict[str, Any]]] | SourceError:
    """List several resources in the checked namespaces at once; the first failure, if any."""
    results = await asyncio.gather(
        *(source.list_objects(resource, namespaces=params.namespaces) for resource in resources)
    )
    for result in results:
        if isinstance(result, SourceError):
            return result
    return [r for r in results if not isinstance(r, SourceError)]


def _since(params: K8sParams, ctx: CheckContext) -> datetime:
    return ctx.at - timedelta(minutes=params.window_minutes)


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _ref(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = _meta(obj)
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


async def _rs_owners(source: KubernetesSource, params: K8sParams) -> dict[tuple[str, str], str]:
    replicasets = await source.list_objects("replicasets", namespaces=params.namespaces, metadata_only=True)
    # Unreadable ReplicaSets are not fatal: workload_of falls back to the controller's naming.
    return {} if isinstance(replicasets, SourceError) else replicaset_owners(replicasets)


def _recent_events(
    events: Iterable[dict[str, Any]], reasons: frozenset[str], since: datetime, object_kind: str | None = None
) -> list[tuple[dict[str, Any], datetime]]:
    chosen: list[tuple[dict[str, Any], datetime]] = []
    for event in events:
        if event.get("reason") not in reasons:
            continue
        involved = event.get("involvedObject") or {}
        if object_kind and involved.get("kind") != object_kind:
            continue
        when = event_time(event)
        if when is not None and when >= since:
            chosen.append((event, when))
    return chosen


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"


def _join(names: Iterable[str], limit: int = 8) -> str:
    items = sorted(set(names))
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


# --- metrics_server ---------------------------------------------------------------------------


async def _metrics_server(params: K8sParams, ctx: CheckContext, source: KubernetesSource) -> CheckResult:
    api = await source.get_object("apiservices", params.apiservice)
    if isinstance(api, SourceError):
        return api
    if api is None:
        state, why = "absent", f"APIService {params.apiservice} does not exist (metrics-server not installed)"
    else:
        available = condition(api, "Available")
        if available is not None and available.get("status") == "True":
            return []
        reason = (available or {}).get("reason", "no Available condition")
        state = "not_available"
        message = (available or {}).get("message", "")
        why = f"APIService {params.apiservice} is not Available ({reason}: {message})"

    listed = await _list_namespaced(source, params, "horizontalpodautoscalers", "events")
    if isinstance(listed, SourceError):
        return listed
    hpas, events = listed
    stuck: dict[str, str] = {}
    for hpa in hpas:
        active = condition(hpa, "ScalingActive")
        if active and active.get("status") == "False" and active.get("reason") in _METRIC_FAILURES:
            namespace, name = _ref(hpa)
            stuck[f"{namespace}/{name}"] = str(active.get("message", ""))
    for event, _ in _recent_events(events, _METRIC_FAILURES, _since(params, ctx), "HorizontalPodAutoscaler"):
        involved = event.get("involvedObject") or {}
        stuck.setdefault(
            f"{involved.get('namespace', '')}/{involved.get('name', '')}", str(event.get("message", ""))
        )
    if not stuck and params.require_confirmation:
        return []
    detail = why + "".join(f"\n- HPA {name}: {message}" for name, message in sorted(stuck.items()))
    return [
        Evidence(
            source=SOURCE,
            query=f"get apiservices {params.apiservice}; list horizontalpodautoscalers; list events "
            "reason=FailedGetResourceMetric",
            labels={"apiservice": params.apiservice, "state": state, "hpas": _join(stuck) or "none"},
            value=float(len(stuck)),
            detail=detail,
        )
    ]


# --- HPAs -------------------------------------------------------------------------------------


def _metric_source(metric: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """``(type, metric name, block)`` of an autoscaling/v2 MetricSpec or MetricStatus."""
    kind = str(metric.get("type", ""))
    key = kind[:1].lower() + kind[1:]
    block = metric.get(key) or {}
    if kind in ("Resource", "ContainerResource"):
        name = str(block.get("name", ""))
    else:
        name = str((block.get("metric") or {}).get("name", ""))
    return kind, name, block


def _metric_ratio(
    spec_metric: Mapping[str, Any], current: list[dict[str, Any]]
) -> tuple[str, str, str, float] | None:
    """``(metric, current, target, current/target)`` for one spec metric, if its status is known."""
    kind, name, block = _metric_source(spec_metric)
    target = block.get("target") or {}
    for status in current:
        s_kind, s_name, s_block = _metric_source(status)
        if (s_kind, s_name) != (kind, name):
            continue
        now = s_block.get("current") or {}
        if target.get("type") == "Utilization":
            want, have = target.get("averageUtilization"), now.get("averageUtilization")
            if isinstance(want, int | float) and isinstance(have, int | float) and want > 0:
                return name, f"{have}%", f"{want}%", have / want
        else:
            field = "value" if target.get("type") == "Value" else "averageValue"
            want_q, have_q = parse_quantity(target.get(field)), parse_quantity(now.get(field))
            if want_q and have_q is not None:
                return name, str(now.get(field)), str(target.get(field)), have_q / want_q
    return None


async def _hpa_at_max(params: K8sParams, ctx: CheckContext, source: KubernetesSource) -> CheckResult:
    hpas = await source.list_objects("horizontalpodautoscalers", namespaces=params.namespaces)
    if isinstance(hpas, SourceError):
        return hpas
    rows: list[Evidence] = []
    for hpa in hpas:
        spec, status = hpa.get("spec") or {}, hpa.get("status") or {}
        maximum, replicas = spec.get("maxReplicas"), status.get("currentReplicas")
        if not isinstance(maximum, int) or not isinstance(replicas, int) or replicas < maximum:
            continue
        ratios = [
            r
            for m in spec.get("metrics") or ()
            if (r := _metric_ratio(m, status.get("currentMetrics") or []))
        ]
        if not ratios:
            continue
        metric, have, want, ratio = max(ratios, key=lambda r: r[3])
        if ratio < params.min_ratio:
            continue
        namespace, name = _ref(hpa)
        target = spec.get("scaleTargetRef") or {}
        needed = math.ceil(replicas * ratio)
        rows.append(
            Evidence(
                source=SOURCE,
                query="list horizontalpodautoscalers.autoscaling/v2 (status.currentMetrics vs spec.metrics)",
                labels={
                    "namespace": namespace,
                    "hpa": name,
                    "workload": f"{target.get('kind')}/{target.get('name')}",
                    "metric": metric,
                    "current": have,
                    "target": want,
                    "max_replicas": str(maximum),
                    "current_replicas": str(replicas),
                    "needed_replicas": str(needed),
                },
                value=ratio,
                threshold=params.min_ratio,
                detail=f"{namespace}/{name} runs {replicas}/{maximum} replicas while {metric} is {have} "
                f"against a target of {want}; about {needed} replicas would bring it to target",
            )
        )
    return rows


_NEW_SIZE = re.compile(r"New size: (\d+); reason: (.*)")


async def _hpa_scale_up_slow(params: K8sParams, ctx: CheckContext, source: KubernetesSource) -> CheckResult:
    listed = await _list_namespaced(source, params, "horizontalpodautoscalers", "events", "pods")
    if isinstance(listed, SourceError):
        return listed
    hpas, events, pods = listed
    owners = await _rs_owners(source, params)
    targets = {_ref(h): (h.get("spec") or {}).get("scaleTargetRef") or {} for h in hpas}
    by_workload: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        kind, name = workload_of(pod, owners)
        by_workload[(_ref(pod)[0], kind, name)].append(pod)

    scale_ups: dict[tuple[str, str], list[tuple[datetime, int]]] = defaultdict(list)
    for event, when in _recent_events(
        events, frozenset({"SuccessfulRescale"}), _since(params, ctx), "HorizontalPodAutoscaler"
    ):
        match = _NEW_SIZE.search(str(event.get("message", "")))
        if match and "above" in match.group(2):
            involved = event.get("involvedObject") or {}
            scale_ups[(str(involved.get("namespace", "")), str(involved.get("name", "")))].append(
                (when, int(match.group(1)))
            )

    rows: list[Evidence] = []
    for (namespace, hpa_name), ups in scale_ups.items():
        target = targets.get((namespace, hpa_name))
        if not target:
            continue
        workload_pods = by_workload.get((namespace, str(target.get("kind")), str(target.get("name"))), [])
        ups.sort()
        worst: tuple[float, datetime, int, int, int] | None = None
        for index, (started, size) in enumerate(ups):
            # Pods created by this scale-up: from the event (second resolution) to the next one.
            until = ups[index + 1][0] if index + 1 < len(ups) else ctx.at
            new = [
                p
                for p in workload_pods
                if (c := parse_time(_meta(p).get("creationTimestamp")))
                and started - timedelta(seconds=1) <= c < until
            ]
            if not new:
                continue
            ready_times: list[datetime] = []
            not_ready = 0
            for pod in new:
                ready = condition(pod, "Ready")
                ready_at = (
                    parse_time(ready.get("lastTransitionTime"))
                    if ready and ready.get("status") == "True"
                    else None
                )
                if ready_at is None:
                    not_ready += 1
                    ready_at = until
                ready_times.append(ready_at)
            took = (max(ready_times) - started).total_seconds()
            if worst is None or took > worst[0]:
                worst = (took, started, size, len(new), not_ready)
        if worst is None or worst[0] <= params.budget:
            continue
        took, started, size, count, not_ready = worst
        still = f", {not_ready} still not Ready" if not_ready else ""
        rows.append(
            Evidence(
                source=SOURCE,
                query="list events reason=SuccessfulRescale; list pods (Ready condition)",
                labels={
                    "namespace": namespace,
                    "hpa": hpa_name,
                    "workload": f"{target.get('kind')}/{target.get('name')}",
                    "new_size": str(size),
                    "new_pods": str(count),
                    "not_ready": str(not_ready),
                    "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "duration": _seconds(took),
                },
                value=took,
                threshold=params.budget,
                detail=f"scale-up of {namespace}/{hpa_name} to {size} at {started:%H:%M:%S} took "
                f"{_seconds(took)} until its {count} new pods were Ready{still}",
            )
        )
    return rows


def _normalised(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


async def _hpa_cpu_on_queue_workload(
    params: K8sParams, ctx: CheckContext, source: KubernetesSource
) -> CheckResult:
    if not params.queue_metric:
        return []
    hpas = await source.list_objects("horizontalpodautoscalers", namespaces=params.namespaces)
    if isinstance(hpas, SourceError):
        return hpas
    queue_length = await _queue_length(params.queue_metric, ctx)
    rows: list[Evidence] = []
    for hpa in hpas:
        spec = hpa.get("spec") or {}
        metrics = [_metric_source(m) for m in spec.get("metrics") or ()]
        resource_only = bool(metrics) and all(
            kind in ("Resource", "ContainerResource") for kind, _, _ in metrics
        )
        if not resource_only or not any(name == "cpu" for _, name, _ in metrics):
            continue
        target = spec.get("scaleTargetRef") or {}
        workload = str(target.get("name", ""))
        consumes = (
            (workload in params.workloads)
            if params.workloads
            else (bool(workload) and _normalised(workload) in _normalised(params.queue_metric))
        )
        if not consumes:
            continue
        namespace, name = _ref(hpa)
        cpu_target = next(((b.get("target") or {}) for _, n, b in metrics if n == "cpu"), {})
        window = ((spec.get("behavior") or {}).get("scaleUp") or {}).get("stabilizationWindowSeconds")
        rows.append(
            Evidence(
                source=SOURCE,
                query="list horizontalpodautoscalers.autoscaling/v2 (spec.metrics)",
                labels={
                    "namespace": namespace,
                    "hpa": name,
                    "workload": f"{target.get('kind')}/{workload}",
                    "queue_metric": params.queue_metric,
                    "cpu_target": _target_text(cpu_target),
                    "scale_up_stabilization": f"{window}s" if window is not None else "default (0s)",
                    "min_replicas": str(spec.get("minReplicas", 1)),
                    "max_replicas": str(spec.get("maxReplicas")),
                },
                value=queue_length,
                detail=f"{namespace}/{name} scales {workload} on CPU only, but its work arrives through "
                f"{params.queue_metric}"
                + (f" (now {queue_length:.0f} items)" if queue_length is not None else ""),
            )
        )
    return rows


def _target_text(target: Mapping[str, Any]) -> str:
    if "averageUtilization" in target:
        return f"{target['averageUtilization']}%"
    return str(target.get("averageValue", target.get("value", "?")))


async def _queue_length(metric: str, ctx: CheckContext) -> float | None:
    """The queue's current length when Prometheus is configured; the finding does not depend on it."""
    prometheus = ctx.sources.prometheus
    if prometheus is None:
        return None
    samples = await prometheus.query(f"sum({metric})", ctx.at)
    if isinstance(samples, SourceError) or not samples:
        return None
    return samples[0].value


# --- config_mount_failure ---------------------------------------------------------------------

_MISSING_OBJECT = re.compile(r'\b(configmap|secret) "([^"]+)" not found', re.IGNORECASE)
_VOLUME = re.compile(r'volume "([^"]+)"')


async def _config_mount_failure(
    params: K8sParams, ctx: CheckContext, source: KubernetesSource
) -> CheckResult:
    events = await source.list_objects("events", namespaces=params.namespaces)
    if isinstance(events, SourceError):
        return events
    missing: dict[tuple[str, str, str], dict[str, Any]] = {}
    # FailedMount: a volume; Failed ("Error: configmap ... not found"): env/envFrom references.
    for event, _ in _recent_events(events, frozenset({"FailedMount", "Failed"}), _since(params, ctx), "Pod"):
        message = str(event.get("message", ""))
        match = _MISSING_OBJECT.search(message)
        if not match:
            continue
        involved = event.get("involvedObject") or {}
        namespace = str(involved.get("namespace") or _meta(event).get("namespace", ""))
        kind = "ConfigMap" if match.group(1).lower() == "configmap" else "Secret"
        entry = missing.setdefault(
            (namespace, kind, match.group(2)), {"pods": set(), "count": 0, "volume": ""}
        )
        entry["pods"].add(str(involved.get("name", "")))
        entry["count"] += int(event.get("count") or 1)
        volume = _VOLUME.search(message)
        if volume and not entry["volume"]:
            entry["volume"] = volume.group(1)

    rows: list[Evidence] = []
    for (namespace, kind, name), entry in sorted(missing.items()):
        resource = "configmaps" if kind == "ConfigMap" else "secrets"
        # Metadata only, in every namespace: where does an object of that name exist?
        found = await source.list_objects(
            resource, namespaces=[], field_selector=f"metadata.name={name}", metadata_only=True
        )
        if isinstance(found, SourceError):
            found_in, note = "unknown", f" (could not search other namespaces: {found.message})"
        else:
            homes = {str(_meta(obj).get("namespace", "")) for obj in found}
            if namespace in homes:
                continue  # created since the events: resolved
            found_in = _join(homes) if homes else "no other namespace"
            note = f"; it exists in {found_in}" if homes else "; no namespace has it"
        rows.append(
            Evidence(
                source=SOURCE,
                query=f"list events reason=FailedMount; list {resource} fieldSelector=metadata.name={name}",
                labels={
                    "namespace": namespace,
                    "kind": kind,
                    "name": name,
                    "pods": _join(entry["pods"], 3),
                    "volume": entry["volume"] or "env",
                    "found_in": found_in,
                },
                value=float(entry["count"]),
                detail=f"{kind} {name} is not in namespace {namespace} where pods {_join(entry['pods'], 3)} "
                f"need it{note}",
            )
        )
    return rows


# --- pod_startup ------------------------------------------------------------------------------

_PULLED = re.compile(r'Successfully pulled image "[^"]+" in ([\d.]+)(ms|s)')


async def _pod_startup(params: K8sParams, ctx: CheckContext, source: KubernetesSource) -> CheckResult:
    listed = await _list_namespaced(source, params, "pods", "events")
    if isinstance(listed, SourceError):
        return listed
    pods, events = listed
    owners = await _rs_owners(source, params)
    since = _since(params, ctx)
    starts: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    pod_workload: dict[tuple[str, str], tuple[str, str, str]] = {}
    for pod in pods:
        namespace, name = _ref(pod)
        kind, workload = workload_of(pod, owners)
        key = (namespace, kind, workload)
        pod_workload[(namespace, name)] = key
        statuses = (pod.get("status") or {}).get("containerStatuses") or ()
        if any(int(s.get("restartCount") or 0) > 0 for s in statuses):
            continue  # the Ready transition then marks a restart, not the start
        scheduled, ready = condition(pod, "PodScheduled"), condition(pod, "Ready")
        if not scheduled or not ready or scheduled.get("status") != "True" or ready.get("status") != "True":
            continue
        t0, t1 = parse_time(scheduled.get("lastTransitionTime")), parse_time(ready.get("lastTransitionTime"))
        if t0 is None or t1 is None or t0 < since or t1 < t0:
            continue
        starts[key].append((t1 - t0).total_seconds())

    pulls: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for event, _ in _recent_events(events, frozenset({"Pulled"}), since, "Pod"):
        match = _PULLED.search(str(event.get("message", "")))
        involved = event.get("involvedObject") or {}
        owner = pod_workload.get((str(involved.get("namespace", "")), str(involved.get("name", ""))))
        if match and owner:
            pulls[owner].append(float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0))

    rows: list[Evidence] = []
    for (namespace, kind, workload), durations in sorted(starts.items()):
        if len(durations) < params.min_pods:
            continue
        p50, p99 = percentile(durations, 0.5), percentile(durations, 0.99)
        value = p50 if params.statistic == "p50" else p99
        if value <= params.budget:
            continue
        pull = pulls.get((namespace, kind, workload), [])
        pull_text = f"image pull p50 {_seconds(percentile(pull, 0.5))}" if pull else "no image pulls (cached)"
        rows.append(
            Evidence(
                source=SOURCE,
                query="list pods (PodScheduled -> Ready); list events reason=Pulled",
                labels={
                    "namespace": namespace,
                    "workload": f"{kind}/{workload}",
                    "pods": str(len(durations)),
                    "p50": _seconds(p50),
                    "p99": _seconds(p99),
                    "statistic": params.statistic,
                    "image_pull_p50": _seconds(percentile(pull, 0.5)) if pull else "none",
                },
                value=value,
                threshold=params.budget,
                detail=f"{namespace}/{workload}: {len(durations)} pods took p50 {_seconds(p50)}, "
                f"p99 {_seconds(p99)} from PodScheduled to Ready; {pull_text}",
            )
        )
    return rows


# --- cross_zone_dependency --------------------------------------------------------------------


async def _cross_zone_dependency(
    params: K8sParams, ctx: CheckContext, source: KubernetesSource
) -> CheckResult:
    if not params.service or not params.clients:
        return []  # no dependency configured for this rule (rule_params name service and clients)
    latency = params.latency_seconds
    if latency is None and params.latency_query and ctx.sources.prometheus is not None:
        samples = await ctx.sources.prometheus.query(params.latency_query, ctx.at)
        if isinstance(samples, SourceError):
            return samples
        finite = [s.value for s in samples if s.is_finite]
        latency = max(finite) if finite else None
    high = latency is not None and latency > params.latency_threshold_seconds
    if (params.when_latency == "high" and not high) or (
        params.when_latency == "unknown" and latency is not None
    ):
        return []

    service_scope = [params.service_namespace] if params.service_namespace else params.namespaces
    slices = await source.list_objects(
        "endpointslices",
        namespaces=service_scope,
        label_selector=f"kubernetes.io/service-name={params.service}",
    )
    if isinstance(slices, SourceError):
        return slices
    endpoint_zones: Counter[str] = Counter()
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            if endpoint.get("zone"):
                endpoint_zones[str(endpoint["zone"])] += 1
    if not endpoint_zones:
        return []
    pods = await source.list_objects("pods", namespaces=params.namespaces)
    if isinstance(pods, SourceError):
        return pods
    nodes = await source.list_objects("nodes")
    if isinstance(nodes, SourceError):
        return nodes
    node_zone = {
        str(_meta(n).get("name")): str((_meta(n).get("labels") or {}).get(ZONE_LABEL, "")) for n in nodes
    }
    selector = parse_label_selector(params.clients)
    client_zones: Counter[str] = Counter()
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running" or not labels_match(
            _meta(pod).get("labels") or {}, selector
        ):
            continue
        zone = node_zone.get(str((pod.get("spec") or {}).get("nodeName", "")), "")
        if zone:
            client_zones[zone] += 1

    total = sum(endpoint_zones.values())
    latency_text = f"{latency * 1000:.0f}ms" if latency is not None else "unknown"
    rows: list[Evidence] = []
    for zone, clients in sorted(client_zones.items()):
        share = 1.0 - endpoint_zones.get(zone, 0) / total
        if share < params.min_share or share == 0:
            continue
        remote = _join(z for z in endpoint_zones if z != zone)
        rows.append(
            Evidence(
                source=SOURCE,
                query=f"list endpointslices kubernetes.io/service-name={params.service}; "
                f"list pods {params.clients}; list nodes ({ZONE_LABEL})",
                labels={
                    "service": params.service,
                    "client_zone": zone,
                    "endpoint_zones": remote,
                    "clients": str(clients),
                    "share": f"{share:.0%}",
                    "latency": latency_text,
                },
                value=share,
                threshold=params.min_share,
                detail=f"{clients} client pods ({params.clients}) in {zone} reach {params.service}, whose "
                f"ready endpoints are {share:.0%} in other zones ({remote}); latency {latency_text}",
            )
        )
    return rows


# --- container terminations -------------------------------------------------------------------


def _container_limits(pod: Mapping[str, Any]) -> dict[str, str]:
    spec = pod.get("spec") or {}
    limits: dict[str, str] = {}
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if memory is not None:
            limits[str(container.get("name"))] = str(memory)
    return limits


def _container_statuses(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]


async def _oom_killed(params: K8sParams, ctx: CheckContext, source: KubernetesSource) -> CheckResult:
    pods = await source.list_objects("pods", namespaces=params.namespaces)
    if isinstance(pods, SourceError):
        return pods
    owners = await _rs_owners(source, params)
    since = _since(params, ctx)
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for pod in pods:
        for status in _container_statuses(pod):
            state, last = status.get("state") or {}, status.get("lastState") or {}
            terminated = next(
                (
                    t
                    for t in (state.get("terminated"), last.get("terminated"))
                    if t and t.get("reason") == "OOMKilled"
                ),
                None,
            )
            if terminated is None:
                continue
            finished = parse_time(terminated.get("finishedAt"))
            if finished is not None and finished < since:
                continue
            namespace, pod_name = _ref(pod)
            kind, workload = workload_of(pod, owners)
            container = str(status.get("name"))
            group = groups.setdefault(
                (namespace, f"{kind}/{workload}", container),
                {"pods": set(), "restarts": 0, "limit": None, "last": None},
            )
            group["pods"].add(pod_name)
            group["restarts"] += int(status.get("restartCount") or 0)
            group["limit"] = group["limit"] or _container_limits(pod).get(container)
            if finished and (group["last"] is None or finished > group["last"]):
                group["last"] = finished
    rows: list[Evidence] = []
    for (namespace, workload, container), group in sorted(groups.items()):
        if len(group["pods"]) < params.min_count:
            continue
        limit_bytes = parse_quantity(group["limit"]) if group["limit"] else None
        # Half again the limit, rounded up to 64Mi: a starting point, to be checked against the working set.
        suggested = (
            format_bytes(math.ceil(limit_bytes * 1.5 / 2**26) * 2**26) if limit_bytes else "set a limit"
        )
        last = group["last"].strftime("%Y-%m-%dT%H:%M:%SZ") if group["last"] else "unknown"
        rows.append(
            Evidence(
                source=SOURCE,
                query="list pods (containerStatuses[].lastState.terminated.reason=OOMKilled)",
                labels={
                    "namespace": namespace,
                    "workload": workload,
                    "container": container,
                    "pods": _join(group["pods"], 3),
                    "memory_limit": group["limit"] or "none",
                    "suggested_limit": suggested,
                    "restarts": str(group["restarts"]),
                    "last_oom": last,
                },
                value=float(len(group["pods"])),
                threshold=float(params.min_count),
                detail=f"container {container} of {namespace}/{workload} was OOMKilled in "
                f"{len(group['pods'])} pod(s) (memory limit {group['limit'] or 'none'}, "
                f"{group['restarts']} restarts, last at {last})",
            )
        )
    return rows


async def _crash_loop(params: K8sParams, ctx: CheckContext, source: KubernetesSource) -> CheckResult:
    pods = await source.list_objects("pods", namespaces=params.namespaces)
    if isinstance(pods, SourceError):
        return pods
    owners = await _rs_owners(source, params)
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for pod in pods:
        for status in _container_statuses(pod):
            waiting = (status.get("state") or {}).get("waiting") or {}
            restarts = int(status.get("restartCount") or 0)
            if waiting.get("reason") != "CrashLoopBackOff" or restarts < params.min_restarts:
                continue
            namespace, pod_name = _ref(pod)
            kind, workload = workload_of(pod, owners)
            container = str(status.get("name"))
            group = groups.setdefault(
                (namespace, f"{kind}/{workload}", container),
                {"pods": set(), "restarts": 0, "last": "unknown"},
            )
            group["pods"].add(pod_name)
            if restarts >= group["restarts"]:
                group["restarts"] = restarts
                terminated = (status.get("lastState") or {}).get("terminated") or {}
                if terminated:
                    group["last"] = (
                        f"{terminated.get('reason', '?')} (exit code {terminated.get('exitCode', '?')})"
                    )
    rows: list[Evidence] = []
    for (namespace, workload, container), group in sorted(groups.items()):
        rows.append(
            Evidence(
                source=SOURCE,
                query="list pods (containerStatuses[].state.waiting.reason=CrashLoopBackOff)",
                labels={
                    "namespace": namespace,
                    "workload": workload,
                    "container": container,
                    "pods": _join(group["pods"], 3),
                    "restarts": str(group["restarts"]),
                    "last_termination": group["last"],
                },
                value=float(group["restarts"]),
                threshold=float(params.min_restarts),
                detail=f"container {container} of {namespace}/{workload} is in CrashLoopBackOff in "
                f"{len(group['pods'])} pod(s), {group['restarts']} restarts, "
                f"last termination {group['last']}",
            )
        )
    return rows


# --- pvc_pending_storage_class ----------------------------------------------------------------

_DEFAULT_CLASS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


async def _pvc_pending_storage_class(
    params: K8sParams, ctx: CheckContext, source: KubernetesSource
) -> CheckResult:
    claims = await source.list_objects("persistentvolumeclaims", namespaces=params.namespaces)
    if isinstance(claims, SourceError):
        return claims
    pending = [c for c in claims if (c.get("status") or {}).get("phase") == "Pending"]
    if not pending:
        return []
    classes = await source.list_objects("storageclasses")
    if isinstance(classes, SourceError):
        return classes
    names = {str(_meta(c).get("name")) for c in classes}
    defaults = [
        str(_meta(c).get("name"))
        for c in classes
        if any((_meta(c).get("annotations") or {}).get(a) == "true" for a in _DEFAULT_CLASS)
    ]
    available = _join(names) if names else "none"
    rows: list[Evidence] = []
    for claim in pending:
        wanted = (claim.get("spec") or {}).get("storageClassName")
        if wanted == "":
            continue  # explicitly no class: binds to a pre-provisioned volume, not a class problem
        if wanted is None:
            if defaults:
                continue
            wanted_text, why = "(default)", "no StorageClass is marked default"
        elif wanted in names:
            continue
        else:
            wanted_text, why = str(wanted), f"StorageClass {wanted} does not exist"
        namespace, name = _ref(claim)
        created = parse_time(_meta(claim).get("creationTimestamp"))
        age = (ctx.at - created).total_seconds() if created else None
        rows.append(
            Evidence(
                source=SOURCE,
                query="list persistentvolumeclaims (status.phase=Pending); list storageclasses",
                labels={
                    "namespace": namespace,
                    "pvc": name,
                    "storage_class": wanted_text,
                    "available": available,
                },
                value=age,
                detail=f"PVC {namespace}/{name} is Pending: {why} (classes: {available})",
            )
        )
    return rows


_CHECKS: dict[str, _Check] = {
    "metrics_server": _metrics_server,
    "hpa_at_max": _hpa_at_max,
    "hpa_scale_up_slow": _hpa_scale_up_slow,
    "hpa_cpu_on_queue_workload": _hpa_cpu_on_queue_workload,
    "config_mount_failure": _config_mount_failure,
    "pod_startup": _pod_startup,
    "cross_zone_dependency": _cross_zone_dependency,
    "oom_killed": _oom_killed,
    "crash_loop": _crash_loop,
    "pvc_pending_storage_class": _pvc_pending_storage_class,
}
