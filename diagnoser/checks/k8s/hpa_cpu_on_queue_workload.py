"""``k8s.hpa_cpu_on_queue_workload``: a queue consumer is scaled by an HPA on CPU only.

I/O-bound work waiting in a queue does not raise CPU, so such an HPA never reacts to a backlog.
A workload consumes the queue when the rule names it in ``workloads``, or else when the queue
metric's name contains the workload's name (``shop_worker_queue_length`` and ``worker``). When
Prometheus is configured the queue's current length is shown (the finding does not depend on
it); the query is declared, so ``rules lint`` checks it and coverage names the metric.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from diagnoser.checks.k8s.common import SOURCE, K8sCheckParams, kubernetes_of, metric_source, ref
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError

if TYPE_CHECKING:
    from diagnoser.signals import Catalogue

__all__ = ["HpaCpuOnQueueWorkloadParams", "hpa_cpu_on_queue_workload"]


class HpaCpuOnQueueWorkloadParams(K8sCheckParams):
    check_name: ClassVar[str] = "hpa_cpu_on_queue_workload"

    #: The queue-length metric (``signals.queue_length``); unset: the check does not apply.
    queue_metric: str | None = None
    #: Workloads (Deployment names) that consume the queue; empty: those whose name the metric contains.
    workloads: list[str] = Field(default_factory=list)


def _queries(params: HpaCpuOnQueueWorkloadParams, catalogue: Catalogue) -> list[tuple[str, str]]:
    return [("", _queue_query(params.queue_metric))] if params.queue_metric else []


@check_kind(
    "k8s.hpa_cpu_on_queue_workload",
    params=HpaCpuOnQueueWorkloadParams,
    reads={"kubernetes"},
    also_reads={"prometheus"},
    queries=_queries,
)
async def hpa_cpu_on_queue_workload(params: HpaCpuOnQueueWorkloadParams, ctx: CheckContext) -> CheckResult:
    """One row per CPU-only HPA scaling a workload that consumes ``queue_metric``."""
    if not params.queue_metric:
        return []
    hpas = await kubernetes_of(ctx).list_objects("horizontalpodautoscalers", namespaces=params.namespaces)
    if isinstance(hpas, SourceError):
        return hpas
    queue_length = await _queue_length(params.queue_metric, ctx)
    rows: list[Evidence] = []
    for hpa in hpas:
        spec = hpa.get("spec") or {}
        metrics = [metric_source(m) for m in spec.get("metrics") or ()]
        resource_only = bool(metrics) and all(
            kind in ("Resource", "ContainerResource") for kind, _, _ in metrics
        )
        if not resource_only or not any(name == "cpu" for _, name, _ in metrics):
            continue
        target = spec.get("scaleTargetRef") or {}
        workload = str(target.get("name", ""))
        if not _consumes(workload, params.queue_metric, params.workloads):
            continue
        namespace, name = ref(hpa)
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


def _normalised(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _consumes(workload: str, queue_metric: str, workloads: list[str]) -> bool:
    if workloads:
        return workload in workloads
    return bool(workload) and _normalised(workload) in _normalised(queue_metric)


def _queue_query(metric: str) -> str:
    return f"sum({metric})"


def _target_text(target: Mapping[str, Any]) -> str:
    if "averageUtilization" in target:
        return f"{target['averageUtilization']}%"
    return str(target.get("averageValue", target.get("value", "?")))


async def _queue_length(metric: str, ctx: CheckContext) -> float | None:
    """The queue's current length when Prometheus is configured; the finding does not depend on it."""
    prometheus = ctx.sources.prometheus
    if prometheus is None:
        return None
    samples = await prometheus.query(_queue_query(metric), ctx.at)
    if isinstance(samples, SourceError) or not samples:
        return None
    return samples[0].value
