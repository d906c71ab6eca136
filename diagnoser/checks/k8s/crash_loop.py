"""``k8s.crash_loop``: containers in CrashLoopBackOff with at least ``min_restarts`` restarts.

Rows are per workload and container; the finding gives the highest restart count and how the
most restarted container last ended (reason and exit code), which says where to look first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import Field

from diagnoser.checks.k8s.common import (
    SOURCE,
    K8sCheckParams,
    container_statuses,
    join,
    kubernetes_of,
    ref,
    with_owners,
)
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes.objects import workload_of

__all__ = ["CrashLoopParams", "crash_loop"]


class CrashLoopParams(K8sCheckParams):
    check_name: ClassVar[str] = "crash_loop"

    min_restarts: int = Field(default=3, ge=0)


@dataclass
class _Loop:
    pods: set[str] = field(default_factory=set)
    restarts: int = 0
    last: str = "unknown"


@check_kind("k8s.crash_loop", params=CrashLoopParams, reads={"kubernetes"})
async def crash_loop(params: CrashLoopParams, ctx: CheckContext) -> CheckResult:
    """One row per (namespace, workload, container) in CrashLoopBackOff."""
    source = kubernetes_of(ctx)
    read = await with_owners(source, params.namespaces, "pods")
    if isinstance(read, SourceError):
        return read
    [pods], owners = read
    groups: dict[tuple[str, str, str], _Loop] = {}
    for pod in pods:
        for status in container_statuses(pod):
            waiting = (status.get("state") or {}).get("waiting") or {}
            restarts = int(status.get("restartCount") or 0)
            if waiting.get("reason") != "CrashLoopBackOff" or restarts < params.min_restarts:
                continue
            namespace, pod_name = ref(pod)
            kind, workload = workload_of(pod, owners)
            group = groups.setdefault((namespace, f"{kind}/{workload}", str(status.get("name"))), _Loop())
            group.pods.add(pod_name)
            if restarts >= group.restarts:
                group.restarts = restarts
                terminated = (status.get("lastState") or {}).get("terminated") or {}
                if terminated:
                    group.last = (
                        f"{terminated.get('reason', '?')} (exit code {terminated.get('exitCode', '?')})"
                    )
    return [
        Evidence(
            source=SOURCE,
            query="list pods (containerStatuses[].state.waiting.reason=CrashLoopBackOff)",
            labels={
                "namespace": namespace,
                "workload": workload,
                "container": container,
                "pods": join(group.pods, 3),
                "restarts": str(group.restarts),
                "last_termination": group.last,
            },
            value=float(group.restarts),
            threshold=float(params.min_restarts),
            detail=f"container {container} of {namespace}/{workload} is in CrashLoopBackOff in "
            f"{len(group.pods)} pod(s), {group.restarts} restarts, last termination {group.last}",
        )
        for (namespace, workload, container), group in sorted(groups.items())
    ]
