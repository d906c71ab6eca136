"""What the Kubernetes checks share: the base of their parameter models and the reads several make.

Each check is its own module registering the kind ``k8s.<check>`` (a rule writes
``k8s: {check: <check>, ...}``); its parameters are a subclass of :class:`K8sCheckParams`, so
every check accepts ``namespaces`` and rejects, by name, a parameter it does not use::

    class CrashLoopParams(K8sCheckParams):
        check_name: ClassVar[str] = "crash_loop"
        min_restarts: int = Field(default=3, ge=0)

    @check_kind("k8s.crash_loop", params=CrashLoopParams, reads={"kubernetes"})
    async def crash_loop(params: CrashLoopParams, ctx: CheckContext) -> CheckResult:
        source = kubernetes_of(ctx)
        pods = await source.list_objects("pods", namespaces=params.namespaces)
        ...

The helpers read objects as the plain dicts :class:`KubernetesSource` returns, tolerating the
fields the API omits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from diagnoser.checks.registry import CheckContext
from diagnoser.models import SourceError
from diagnoser.sources.kubernetes import KubernetesSource
from diagnoser.sources.kubernetes.objects import event_time, replicaset_owners

__all__ = [
    "SOURCE",
    "K8sCheckParams",
    "WindowParams",
    "container_statuses",
    "involved",
    "join",
    "kubernetes_of",
    "list_namespaced",
    "meta",
    "metric_source",
    "recent_events",
    "ref",
    "rs_owners",
    "seconds",
    "since",
    "with_owners",
]

SOURCE = "kubernetes"


class K8sCheckParams(BaseModel):
    """Parameters every Kubernetes check takes; each check's model adds its own.

    A parameter another check uses is an error naming it ("check oom_killed does not use
    budget_seconds"), and ``null`` means the default, so a rule can pass ``${params.x}`` through
    for a value left unset.
    """

    model_config = ConfigDict(extra="forbid")

    #: The name rules give the check (``k8s: {check: ...}``), for error messages.
    check_name: ClassVar[str] = ""

    #: Narrow the configured namespace scope for this condition (``[]``: all namespaces).
    namespaces: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _only_own_parameters(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        stray = sorted(str(name) for name in data if name not in cls.model_fields)
        if stray:
            raise ValueError(f"check {cls.check_name} does not use {', '.join(stray)}")
        return {name: value for name, value in data.items() if value is not None}


class WindowParams(K8sCheckParams):
    """For checks that look back over events, terminations or pod starts."""

    #: How far back events, terminations and pod starts count, ending at the evaluation instant.
    window_minutes: float = Field(default=60.0, gt=0)


def kubernetes_of(ctx: CheckContext) -> KubernetesSource:
    """The Kubernetes source, or :class:`~diagnoser.errors.SourceNotConfigured` to skip the rule."""
    return ctx.require(ctx.sources.kubernetes, SOURCE)


async def list_namespaced(
    source: KubernetesSource, namespaces: list[str] | None, *resources: str
) -> list[list[dict[str, Any]]] | SourceError:
    """List several resources in the checked namespaces at once; the first failure, if any."""
    results = await asyncio.gather(
        *(source.list_objects(resource, namespaces=namespaces) for resource in resources)
    )
    for result in results:
        if isinstance(result, SourceError):
            return result
    return [r for r in results if not isinstance(r, SourceError)]


async def with_owners(
    source: KubernetesSource, namespaces: list[str] | None, *resources: str
) -> tuple[list[list[dict[str, Any]]], dict[tuple[str, str], str]] | SourceError:
    """:func:`list_namespaced` and :func:`rs_owners` at once: the checks that name a pod's workload
    need both, and neither waits for the other."""
    listed, owners = await asyncio.gather(
        list_namespaced(source, namespaces, *resources), rs_owners(source, namespaces)
    )
    return listed if isinstance(listed, SourceError) else (listed, owners)


async def rs_owners(source: KubernetesSource, namespaces: list[str] | None) -> dict[tuple[str, str], str]:
    """``(namespace, replicaset) -> deployment``, for naming the workload a pod belongs to."""
    replicasets = await source.list_objects("replicasets", namespaces=namespaces, metadata_only=True)
    # Unreadable ReplicaSets are not fatal: workload_of falls back to the controller's naming.
    return {} if isinstance(replicasets, SourceError) else replicaset_owners(replicasets)


def since(params: WindowParams, ctx: CheckContext) -> datetime:
    """The start of the window the check looks back over."""
    return ctx.at - timedelta(minutes=params.window_minutes)


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def ref(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)`` of an object."""
    metadata = meta(obj)
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


def involved(event: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)`` of the object an event is about."""
    obj = event.get("involvedObject") or {}
    return str(obj.get("namespace", "")), str(obj.get("name", ""))


def recent_events(
    events: Iterable[dict[str, Any]], reasons: frozenset[str], start: datetime, object_kind: str | None = None
) -> list[tuple[dict[str, Any], datetime]]:
    """Events with one of ``reasons`` last seen at or after ``start``, with that time."""
    chosen: list[tuple[dict[str, Any], datetime]] = []
    for event in events:
        if event.get("reason") not in reasons:
            continue
        if object_kind and (event.get("involvedObject") or {}).get("kind") != object_kind:
            continue
        when = event_time(event)
        if when is not None and when >= start:
            chosen.append((event, when))
    return chosen


def container_statuses(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Init containers' statuses, then the app containers'."""
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]


def metric_source(metric: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """``(type, metric name, block)`` of an autoscaling/v2 MetricSpec or MetricStatus of an HPA."""
    kind = str(metric.get("type", ""))
    key = kind[:1].lower() + kind[1:]
    block = metric.get(key) or {}
    if kind in ("Resource", "ContainerResource"):
        name = str(block.get("name", ""))
    else:
        name = str((block.get("metric") or {}).get("name", ""))
    return kind, name, block


def seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"


def join(names: Iterable[str], limit: int = 8) -> str:
    """``a, b, c and 4 more``: sorted, without repeats."""
    items = sorted(set(names))
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
