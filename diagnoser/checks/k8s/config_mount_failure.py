"""``k8s.config_mount_failure``: pods cannot start because a ConfigMap or Secret they need is missing.

The kubelet says so in events: ``FailedMount`` for a volume (``configmap "web-flags" not
found``) and ``Failed`` for env/envFrom references (``Error: secret "db" not found``). For each
missing object the check searches every namespace by name (metadata only: secret values never
cross the wire), because the usual cause is an object created in the wrong namespace. An object
that exists by now is resolved and not reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from diagnoser.checks.k8s.common import (
    SOURCE,
    WindowParams,
    join,
    kubernetes_of,
    meta,
    recent_events,
    since,
)
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes import KubernetesSource

__all__ = ["ConfigMountFailureParams", "config_mount_failure"]

_MISSING_OBJECT = re.compile(r'\b(configmap|secret) "([^"]+)" not found', re.IGNORECASE)
_VOLUME = re.compile(r'volume "([^"]+)"')


class ConfigMountFailureParams(WindowParams):
    check_name: ClassVar[str] = "config_mount_failure"


@dataclass
class _Missing:
    pods: set[str] = field(default_factory=set)
    count: int = 0
    volume: str = ""


@check_kind("k8s.config_mount_failure", params=ConfigMountFailureParams, reads={"kubernetes"})
async def config_mount_failure(params: ConfigMountFailureParams, ctx: CheckContext) -> CheckResult:
    """One row per (namespace, ConfigMap or Secret) that pods need and the namespace lacks."""
    source = kubernetes_of(ctx)
    events = await source.list_objects("events", namespaces=params.namespaces)
    if isinstance(events, SourceError):
        return events
    rows: list[Evidence] = []
    for (namespace, kind, name), entry in sorted(_missing_objects(events, params, ctx).items()):
        resource = "configmaps" if kind == "ConfigMap" else "secrets"
        where = await _where_it_exists(source, resource, namespace, name)
        if where is None:
            continue  # created since the events: resolved
        found_in, note = where
        rows.append(
            Evidence(
                source=SOURCE,
                query=f"list events reason=FailedMount; list {resource} fieldSelector=metadata.name={name}",
                labels={
                    "namespace": namespace,
                    "kind": kind,
                    "name": name,
                    "pods": join(entry.pods, 3),
                    "volume": entry.volume or "env",
                    "found_in": found_in,
                },
                value=float(entry.count),
                detail=f"{kind} {name} is not in namespace {namespace} where pods {join(entry.pods, 3)} "
                f"need it{note}",
            )
        )
    return rows


def _missing_objects(
    events: list[dict[str, Any]], params: ConfigMountFailureParams, ctx: CheckContext
) -> dict[tuple[str, str, str], _Missing]:
    """``(namespace, ConfigMap|Secret, name)`` -> the pods that reported it missing, and how often."""
    missing: dict[tuple[str, str, str], _Missing] = {}
    # FailedMount: a volume; Failed ("Error: configmap ... not found"): env/envFrom references.
    for event, _ in recent_events(events, frozenset({"FailedMount", "Failed"}), since(params, ctx), "Pod"):
        message = str(event.get("message", ""))
        match = _MISSING_OBJECT.search(message)
        if not match:
            continue
        involved = event.get("involvedObject") or {}
        namespace = str(involved.get("namespace") or meta(event).get("namespace", ""))
        kind = "ConfigMap" if match.group(1).lower() == "configmap" else "Secret"
        entry = missing.setdefault((namespace, kind, match.group(2)), _Missing())
        entry.pods.add(str(involved.get("name", "")))
        entry.count += int(event.get("count") or 1)
        volume = _VOLUME.search(message)
        if volume and not entry.volume:
            entry.volume = volume.group(1)
    return missing


async def _where_it_exists(
    source: KubernetesSource, resource: str, namespace: str, name: str
) -> tuple[str, str] | None:
    """``(found_in label, detail note)``, or None when the object now exists where it is needed."""
    # Metadata only, in every namespace: where does an object of that name exist?
    found = await source.list_objects(
        resource, namespaces=[], field_selector=f"metadata.name={name}", metadata_only=True
    )
    if isinstance(found, SourceError):
        return "unknown", f" (could not search other namespaces: {found.message})"
    homes = {str(meta(obj).get("namespace", "")) for obj in found}
    if namespace in homes:
        return None
    if not homes:
        return "no other namespace", "; no namespace has it"
    return join(homes), f"; it exists in {join(homes)}"
