"""``k8s.oom_killed``: containers were OOMKilled (current or last termination) within the window.

Rows are per workload and container, so ten replicas killed for the same reason are one
finding. The finding gives the container's memory limit and a starting point for a new one
(half again the limit, rounded up to 64Mi), to be checked against the working set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from pydantic import Field

from diagnoser.checks.k8s.common import (
    SOURCE,
    WindowParams,
    container_statuses,
    join,
    kubernetes_of,
    ref,
    since,
    with_owners,
)
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes.objects import format_bytes, parse_quantity, parse_time, workload_of

__all__ = ["OomKilledParams", "oom_killed"]


class OomKilledParams(WindowParams):
    check_name: ClassVar[str] = "oom_killed"

    #: Report a container only when it was OOMKilled in at least this many pods.
    min_count: int = Field(default=1, ge=1)


@dataclass
class _Kills:
    pods: set[str] = field(default_factory=set)
    restarts: int = 0
    limit: str | None = None
    last: datetime | None = None


@check_kind("k8s.oom_killed", params=OomKilledParams, reads={"kubernetes"})
async def oom_killed(params: OomKilledParams, ctx: CheckContext) -> CheckResult:
    """One row per (namespace, workload, container) OOMKilled in at least ``min_count`` pods."""
    source = kubernetes_of(ctx)
    read = await with_owners(source, params.namespaces, "pods")
    if isinstance(read, SourceError):
        return read
    [pods], owners = read
    start = since(params, ctx)
    groups: dict[tuple[str, str, str], _Kills] = {}
    for pod in pods:
        for status in container_statuses(pod):
            terminated = _oom_termination(status)
            if terminated is None:
                continue
            finished = parse_time(terminated.get("finishedAt"))
            if finished is not None and finished < start:
                continue
            namespace, pod_name = ref(pod)
            kind, workload = workload_of(pod, owners)
            container = str(status.get("name"))
            group = groups.setdefault((namespace, f"{kind}/{workload}", container), _Kills())
            group.pods.add(pod_name)
            group.restarts += int(status.get("restartCount") or 0)
            group.limit = group.limit or _memory_limits(pod).get(container)
            if finished and (group.last is None or finished > group.last):
                group.last = finished
    return [
        _row(namespace, workload, container, group, params.min_count)
        for (namespace, workload, container), group in sorted(groups.items())
        if len(group.pods) >= params.min_count
    ]


def _oom_termination(status: Mapping[str, Any]) -> dict[str, Any] | None:
    """The container's current or last termination, when it was an OOM kill."""
    state, last = status.get("state") or {}, status.get("lastState") or {}
    for terminated in (state.get("terminated"), last.get("terminated")):
        if terminated and terminated.get("reason") == "OOMKilled":
            return dict(terminated)
    return None


def _memory_limits(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> memory limit, for the containers that have one."""
    spec = pod.get("spec") or {}
    limits: dict[str, str] = {}
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if memory is not None:
            limits[str(container.get("name"))] = str(memory)
    return limits


def _row(namespace: str, workload: str, container: str, group: _Kills, min_count: int) -> Evidence:
    limit_bytes = parse_quantity(group.limit) if group.limit else None
    # Half again the limit, rounded up to 64Mi: a starting point, to be checked against the working set.
    suggested = format_bytes(math.ceil(limit_bytes * 1.5 / 2**26) * 2**26) if limit_bytes else "set a limit"
    last = group.last.strftime("%Y-%m-%dT%H:%M:%SZ") if group.last else "unknown"
    return Evidence(
        source=SOURCE,
        query="list pods (containerStatuses[].lastState.terminated.reason=OOMKilled)",
        labels={
            "namespace": namespace,
            "workload": workload,
            "container": container,
            "pods": join(group.pods, 3),
            "memory_limit": group.limit or "none",
            "suggested_limit": suggested,
            "restarts": str(group.restarts),
            "last_oom": last,
        },
        value=float(len(group.pods)),
        threshold=float(min_count),
        detail=f"container {container} of {namespace}/{workload} was OOMKilled in "
        f"{len(group.pods)} pod(s) (memory limit {group.limit or 'none'}, "
        f"{group.restarts} restarts, last at {last})",
    )
