"""The Kubernetes resources diagnoser reads: one declarative table, checked against the ClusterRole.

Every read :class:`~diagnoser.sources.kubernetes.source.KubernetesSource` makes goes through an entry of
:data:`RESOURCES`; the source refuses anything else. ``deploy/kubernetes/clusterrole.yaml`` must
grant exactly these resources with read-only verbs, and ``tests/kubernetes/test_rbac.py`` fails
when the two drift apart. Adding a check that reads a new resource means one row here and one
rule in the role::

    pods = RESOURCES["pods"]
    pods.path(namespace="shop")      # /api/v1/namespaces/shop/pods
    pods.rbac_name                   # pods (API group "")
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RBAC_VERBS", "RESOURCES", "ResourceKind"]

#: The only verbs the ClusterRole may grant: diagnoser never writes to a cluster.
RBAC_VERBS: frozenset[str] = frozenset({"get", "list", "watch"})


@dataclass(frozen=True)
class ResourceKind:
    """One resource type diagnoser reads: where it lives in the API and which verbs the code uses."""

    group: str
    version: str
    resource: str
    namespaced: bool
    verbs: tuple[str, ...]

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def rbac_name(self) -> str:
        """``pods`` or ``horizontalpodautoscalers.autoscaling``: how ``kubectl auth can-i`` spells it."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path: cluster-wide (``namespace=None``), in one namespace, or of one object."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            prefix = f"{prefix}/namespaces/{namespace}"
        path = f"{prefix}/{self.resource}"
        return f"{path}/{name}" if name is not None else path


def _kind(
    group: str, version: str, resource: str, *, namespaced: bool, verb: str = "list"
) -> tuple[str, ResourceKind]:
    return resource, ResourceKind(group, version, resource, namespaced, (verb,))


#: Every resource the checks read, by plural name. The single source of truth for the ClusterRole;
#: which check reads what is shown by running them (tests/kubernetes/test_rbac.py), not kept here.
RESOURCES: dict[str, ResourceKind] = dict(
    [
        _kind("", "v1", "pods", namespaced=True),
        _kind("", "v1", "events", namespaced=True),
        _kind("", "v1", "nodes", namespaced=False),
        _kind("", "v1", "configmaps", namespaced=True),
        # Read as metadata only (PartialObjectMetadataList): secret values never reach diagnoser.
        _kind("", "v1", "secrets", namespaced=True),
        _kind("", "v1", "persistentvolumeclaims", namespaced=True),
        _kind("apps", "v1", "replicasets", namespaced=True),
        _kind("autoscaling", "v2", "horizontalpodautoscalers", namespaced=True),
        _kind("apiregistration.k8s.io", "v1", "apiservices", namespaced=False, verb="get"),
        _kind("discovery.k8s.io", "v1", "endpointslices", namespaced=True),
        _kind("storage.k8s.io", "v1", "storageclasses", namespaced=False),
    ]
)
