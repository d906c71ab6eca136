"""``k8s.pvc_pending_storage_class``: a PVC is Pending because its StorageClass does not exist.

A claim naming a class the cluster does not have, or naming none when no class is marked
default, waits forever: no provisioner will ever pick it up. A claim with ``storageClassName:
""`` binds only to pre-provisioned volumes and is not a class problem.
"""

from __future__ import annotations

from typing import ClassVar

from diagnoser.checks.k8s.common import SOURCE, K8sCheckParams, join, kubernetes_of, meta, ref
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes.objects import parse_time

__all__ = ["PvcPendingStorageClassParams", "pvc_pending_storage_class"]

_DEFAULT_CLASS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


class PvcPendingStorageClassParams(K8sCheckParams):
    check_name: ClassVar[str] = "pvc_pending_storage_class"


@check_kind("k8s.pvc_pending_storage_class", params=PvcPendingStorageClassParams, reads={"kubernetes"})
async def pvc_pending_storage_class(params: PvcPendingStorageClassParams, ctx: CheckContext) -> CheckResult:
    """One row per Pending PVC whose class is missing (or unnamed with no default class)."""
    source = kubernetes_of(ctx)
    claims = await source.list_objects("persistentvolumeclaims", namespaces=params.namespaces)
    if isinstance(claims, SourceError):
        return claims
    pending = [c for c in claims if (c.get("status") or {}).get("phase") == "Pending"]
    if not pending:
        return []
    classes = await source.list_objects("storageclasses")
    if isinstance(classes, SourceError):
        return classes
    names = {str(meta(c).get("name")) for c in classes}
    defaults = [
        str(meta(c).get("name"))
        for c in classes
        if any((meta(c).get("annotations") or {}).get(a) == "true" for a in _DEFAULT_CLASS)
    ]
    available = join(names) if names else "none"
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
        namespace, name = ref(claim)
        created = parse_time(meta(claim).get("creationTimestamp"))
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
                value=(ctx.at - created).total_seconds() if created else None,
                detail=f"PVC {namespace}/{name} is Pending: {why} (classes: {available})",
            )
        )
    return rows
