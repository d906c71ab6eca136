"""The Kubernetes API as a source of evidence: read-only, answering plain dicts or SourceError values.

- :mod:`~diagnoser.sources.kubernetes.source`: :class:`KubernetesSource`, paged lists and gets,
  shared between concurrent checks, every failure described as what to do about it.
- :mod:`~diagnoser.sources.kubernetes.credentials`: in-cluster or kubeconfig credentials, also
  used by leader election.
- :mod:`~diagnoser.sources.kubernetes.resources`: the resources it may read (the ClusterRole's
  single source of truth).
- :mod:`~diagnoser.sources.kubernetes.objects`: pure functions over the objects it returns
  (quantities, timestamps, conditions, the workload owning a pod).

Importing this package does not import the ``kubernetes`` client library: that happens when
credentials are loaded, so configurations without Kubernetes never pay for it.
"""

from __future__ import annotations

from diagnoser.sources.kubernetes.source import KubernetesSource, ListResult, ObjectResult

__all__ = ["KubernetesSource", "ListResult", "ObjectResult"]
