"""``k8s.pod_startup``: a workload's pods take too long from being scheduled to being Ready.

Per workload, the start time of each pod that started in the window is ``PodScheduled`` to
``Ready`` (pods that restarted are left out: their Ready transition marks the restart). When
the p50 or p99 (``statistic``) is over budget, the finding also gives the image pull time the
kubelet reported in its ``Pulled`` events, the usual suspect.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field

from diagnoser.checks.k8s.common import (
    SOURCE,
    WindowParams,
    involved,
    kubernetes_of,
    recent_events,
    ref,
    seconds,
    since,
    with_owners,
)
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.promql import duration_seconds
from diagnoser.sources.kubernetes.objects import (
    condition,
    parse_time,
    percentile,
    workload_of,
)

__all__ = ["PodStartupParams", "pod_startup"]

#: The kubelet's message; the time is a Go duration (``350ms``, ``2.5s``, ``1m2.345s``).
_PULLED = re.compile(r'Successfully pulled image "[^"]+" in ([0-9.]+[0-9a-z\u00b5\u03bc.]*)')

#: (namespace, workload kind, workload name)
_Workload = tuple[str, str, str]


class PodStartupParams(WindowParams):
    check_name: ClassVar[str] = "pod_startup"

    #: Seconds from PodScheduled to Ready that the statistic may reach.
    budget_seconds: float = Field(default=1.5, gt=0)
    statistic: Literal["p50", "p99"] = "p99"
    #: Judge a workload only with at least this many pod starts in the window.
    min_pods: int = Field(default=1, ge=1)


@check_kind("k8s.pod_startup", params=PodStartupParams, reads={"kubernetes"})
async def pod_startup(params: PodStartupParams, ctx: CheckContext) -> CheckResult:
    """One row per workload whose start-time statistic is over ``budget_seconds``."""
    source = kubernetes_of(ctx)
    read = await with_owners(source, params.namespaces, "pods", "events")
    if isinstance(read, SourceError):
        return read
    (pods, events), owners = read
    start = since(params, ctx)
    pod_workload = {ref(pod): (ref(pod)[0], *workload_of(pod, owners)) for pod in pods}
    starts = _start_durations(pods, pod_workload, start)
    pulls = _pull_durations(events, pod_workload, start)
    rows: list[Evidence] = []
    for (namespace, kind, workload), durations in sorted(starts.items()):
        if len(durations) < params.min_pods:
            continue
        p50, p99 = percentile(durations, 0.5), percentile(durations, 0.99)
        value = p50 if params.statistic == "p50" else p99
        if value <= params.budget_seconds:
            continue
        pull = pulls.get((namespace, kind, workload), [])
        pull_text = f"image pull p50 {seconds(percentile(pull, 0.5))}" if pull else "no image pulls (cached)"
        rows.append(
            Evidence(
                source=SOURCE,
                query="list pods (PodScheduled -> Ready); list events reason=Pulled",
                labels={
                    "namespace": namespace,
                    "workload": f"{kind}/{workload}",
                    "pods": str(len(durations)),
                    "p50": seconds(p50),
                    "p99": seconds(p99),
                    "statistic": params.statistic,
                    "image_pull_p50": seconds(percentile(pull, 0.5)) if pull else "none",
                },
                value=value,
                threshold=params.budget_seconds,
                detail=f"{namespace}/{workload}: {len(durations)} pods took p50 {seconds(p50)}, "
                f"p99 {seconds(p99)} from PodScheduled to Ready; {pull_text}",
            )
        )
    return rows


def _start_durations(
    pods: list[dict[str, Any]], pod_workload: dict[tuple[str, str], _Workload], start: datetime
) -> dict[_Workload, list[float]]:
    """Seconds from PodScheduled to Ready of each pod scheduled since ``start``, by workload."""
    starts: dict[_Workload, list[float]] = defaultdict(list)
    for pod in pods:
        statuses = (pod.get("status") or {}).get("containerStatuses") or ()
        if any(int(s.get("restartCount") or 0) > 0 for s in statuses):
            continue  # the Ready transition then marks a restart, not the start
        scheduled, ready = condition(pod, "PodScheduled"), condition(pod, "Ready")
        if not scheduled or not ready or scheduled.get("status") != "True" or ready.get("status") != "True":
            continue
        t0, t1 = parse_time(scheduled.get("lastTransitionTime")), parse_time(ready.get("lastTransitionTime"))
        if t0 is None or t1 is None or t0 < start or t1 < t0:
            continue
        starts[pod_workload[ref(pod)]].append((t1 - t0).total_seconds())
    return starts


def _seconds_or_none(text: str) -> float | None:
    try:
        return duration_seconds(text)
    except ValueError:  # a message this check does not understand counts no pull
        return None


def _pull_durations(
    events: list[dict[str, Any]], pod_workload: dict[tuple[str, str], _Workload], start: datetime
) -> dict[_Workload, list[float]]:
    """Seconds of each image pull the kubelet reported since ``start``, by workload."""
    pulls: dict[_Workload, list[float]] = defaultdict(list)
    for event, _ in recent_events(events, frozenset({"Pulled"}), start, "Pod"):
        match = _PULLED.search(str(event.get("message", "")))
        owner = pod_workload.get(involved(event))
        took = _seconds_or_none(match.group(1)) if match else None
        if took is not None and owner:
            pulls[owner].append(took)
    return pulls
