"""``k8s.hpa_scale_up_slow``: an HPA scaled up, but its new pods took too long to become Ready.

A scale-up is a ``SuccessfulRescale`` event whose reason says a metric is *above* target; the
pods it created are the target workload's pods created from that event until the next one.
How long it took is from the event to the last of those pods being Ready (or until now for
pods still not Ready), and the slowest scale-up in the window is the one reported.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pydantic import Field

from diagnoser.checks.k8s.common import (
    SOURCE,
    WindowParams,
    involved,
    kubernetes_of,
    meta,
    recent_events,
    ref,
    seconds,
    since,
    with_owners,
)
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes.objects import condition, parse_time, workload_of

__all__ = ["HpaScaleUpSlowParams", "hpa_scale_up_slow"]

_NEW_SIZE = re.compile(r"New size: (\d+); reason: (.*)")


class HpaScaleUpSlowParams(WindowParams):
    check_name: ClassVar[str] = "hpa_scale_up_slow"

    #: Seconds from the scale-up event to all its new pods Ready.
    budget_seconds: float = Field(default=90.0, gt=0)


@dataclass(frozen=True)
class _ScaleUp:
    started: datetime
    size: int
    took_s: float
    new_pods: int
    not_ready: int


@check_kind("k8s.hpa_scale_up_slow", params=HpaScaleUpSlowParams, reads={"kubernetes"})
async def hpa_scale_up_slow(params: HpaScaleUpSlowParams, ctx: CheckContext) -> CheckResult:
    """One row per HPA whose slowest scale-up in the window took over ``budget_seconds``."""
    source = kubernetes_of(ctx)
    read = await with_owners(source, params.namespaces, "horizontalpodautoscalers", "events", "pods")
    if isinstance(read, SourceError):
        return read
    (hpas, events, pods), owners = read
    targets = {ref(h): (h.get("spec") or {}).get("scaleTargetRef") or {} for h in hpas}
    by_workload: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        kind, name = workload_of(pod, owners)
        by_workload[(ref(pod)[0], kind, name)].append(pod)

    rows: list[Evidence] = []
    for (namespace, hpa_name), ups in _scale_ups(events, since(params, ctx)).items():
        target = targets.get((namespace, hpa_name))
        if not target:
            continue
        workload_pods = by_workload.get((namespace, str(target.get("kind")), str(target.get("name"))), [])
        worst = _slowest(sorted(ups), workload_pods, ctx.at)
        if worst is None or worst.took_s <= params.budget_seconds:
            continue
        still = f", {worst.not_ready} still not Ready" if worst.not_ready else ""
        rows.append(
            Evidence(
                source=SOURCE,
                query="list events reason=SuccessfulRescale; list pods (Ready condition)",
                labels={
                    "namespace": namespace,
                    "hpa": hpa_name,
                    "workload": f"{target.get('kind')}/{target.get('name')}",
                    "new_size": str(worst.size),
                    "new_pods": str(worst.new_pods),
                    "not_ready": str(worst.not_ready),
                    "started": worst.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "duration": seconds(worst.took_s),
                },
                value=worst.took_s,
                threshold=params.budget_seconds,
                detail=f"scale-up of {namespace}/{hpa_name} to {worst.size} at {worst.started:%H:%M:%S} took "
                f"{seconds(worst.took_s)} until its {worst.new_pods} new pods were Ready{still}",
            )
        )
    return rows


def _scale_ups(
    events: list[dict[str, Any]], start: datetime
) -> dict[tuple[str, str], list[tuple[datetime, int]]]:
    """``(namespace, hpa) -> [(when, new size)]`` of scale-ups (not scale-downs) since ``start``."""
    ups: dict[tuple[str, str], list[tuple[datetime, int]]] = defaultdict(list)
    for event, when in recent_events(
        events, frozenset({"SuccessfulRescale"}), start, "HorizontalPodAutoscaler"
    ):
        match = _NEW_SIZE.search(str(event.get("message", "")))
        if match and "above" in match.group(2):
            ups[involved(event)].append((when, int(match.group(1))))
    return ups


def _slowest(
    ups: list[tuple[datetime, int]], workload_pods: list[dict[str, Any]], at: datetime
) -> _ScaleUp | None:
    """The scale-up (in time order) whose new pods took longest to be Ready; None if none made pods."""
    worst: _ScaleUp | None = None
    for index, (started, size) in enumerate(ups):
        # Pods created by this scale-up: from the event (second resolution) to the next one.
        until = ups[index + 1][0] if index + 1 < len(ups) else at
        new = [
            p
            for p in workload_pods
            if (c := parse_time(meta(p).get("creationTimestamp")))
            and started - timedelta(seconds=1) <= c < until
        ]
        if not new:
            continue
        ready_times = [_ready_at(pod) for pod in new]
        not_ready = sum(1 for t in ready_times if t is None)
        took = (max(t if t is not None else until for t in ready_times) - started).total_seconds()
        if worst is None or took > worst.took_s:
            worst = _ScaleUp(started, size, took, len(new), not_ready)
    return worst


def _ready_at(pod: dict[str, Any]) -> datetime | None:
    ready = condition(pod, "Ready")
    if ready and ready.get("status") == "True":
        return parse_time(ready.get("lastTransitionTime"))
    return None
