"""``k8s.hpa_at_max``: an HPA runs at maxReplicas while its metric is still over target.

The HPA wants more replicas than it may have, so the load per pod stays high: the finding says
by how much (current/target) and about how many replicas would bring the metric to target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field

from diagnoser.checks.k8s.common import SOURCE, K8sCheckParams, kubernetes_of, metric_source, ref
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes.objects import parse_quantity

__all__ = ["HpaAtMaxParams", "hpa_at_max"]


class HpaAtMaxParams(K8sCheckParams):
    check_name: ClassVar[str] = "hpa_at_max"

    #: Current/target metric ratio that counts as over target (the HPA's own tolerance is 10 %).
    min_ratio: float = Field(default=1.1, gt=0)


def _metric_ratio(
    spec_metric: Mapping[str, Any], current: list[dict[str, Any]]
) -> tuple[str, str, str, float] | None:
    """``(metric, current, target, current/target)`` for one spec metric, if its status is known."""
    kind, name, block = metric_source(spec_metric)
    target = block.get("target") or {}
    for status in current:
        s_kind, s_name, s_block = metric_source(status)
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


@check_kind("k8s.hpa_at_max", params=HpaAtMaxParams, reads={"kubernetes"})
async def hpa_at_max(params: HpaAtMaxParams, ctx: CheckContext) -> CheckResult:
    """One row per HPA at its maximum with its most loaded metric at least ``min_ratio`` over target."""
    hpas = await kubernetes_of(ctx).list_objects("horizontalpodautoscalers", namespaces=params.namespaces)
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
        namespace, name = ref(hpa)
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
