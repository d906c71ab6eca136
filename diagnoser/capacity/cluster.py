"""``diagnose capacity --on-cluster N``: the worker pods, as one Kubernetes Indexed Job.

Kubernetes runs the workers; the coordinator (this process) runs the search, merges their
results and evaluates the rules, as for local workers. The objects::

    Secret  <name>-token     the shared token a worker proves it belongs to this run with
    Job     <name>           completionMode: Indexed, completions = parallelism = N,
                             backoffLimit 0 (a worker that dies fails the step, it is not retried),
                             each pod `diagnose worker --coordinator ADDR` (index from
                             JOB_COMPLETION_INDEX), least privilege: no API token mounted,
                             non-root, read-only root file system, every capability dropped
    Role    diagnoser-capacity   what the coordinator's own credentials need in the namespace
                             (create/get/delete the Job and its Secret): for an administrator to bind

The barrier: every pod connects to the coordinator and waits; the first step is sent only when
all N are there, to start at one wall-clock instant (as k6-operator starts its runners paused).
:func:`render_worker_job` is pure (tests validate its output for two Kubernetes versions);
:func:`create_objects` and :func:`delete_objects` talk to the API with the ``kubernetes`` client.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from diagnoser import __version__
from diagnoser.config import KubernetesSettings
from diagnoser.errors import ConfigError
from diagnoser.probe.worker import TOKEN_ENV, parse_address

__all__ = [
    "DEFAULT_IMAGE",
    "ClusterPlan",
    "check_cluster_plan",
    "coordinator_role",
    "create_objects",
    "delete_objects",
    "render_worker_job",
]

DEFAULT_IMAGE = f"ghcr.io/diagnoser/diagnoser:{__version__}"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_LABELS = {"app.kubernetes.io/name": "diagnoser", "app.kubernetes.io/component": "capacity-worker"}


@dataclass(frozen=True)
class ClusterPlan:
    """What the worker Job needs: how many pods, where they reach the coordinator, as what."""

    workers: int
    advertise: str
    token: str
    image: str = DEFAULT_IMAGE
    namespace: str = "diagnoser"
    name: str = "diagnoser-capacity"
    #: CPU each worker pod asks for (and is limited to): one core per worker, one event loop.
    cpu: str = "1"
    memory: str = "512Mi"
    #: The Job is deleted by Kubernetes this long after it ends, should the coordinator not.
    ttl_s: int = 600
    #: No worker outlives the capacity ceiling's hour (plus start-up).
    deadline_s: int = 3600 + 600


def check_cluster_plan(plan: ClusterPlan) -> None:
    """Refuse (``ConfigError``) a plan that would render an invalid or unreachable Job."""
    try:
        parse_address(plan.advertise)
    except ValueError as exc:
        raise ConfigError(f"--advertise: {exc}") from exc
    if plan.advertise.rpartition(":")[0] in ("0.0.0.0", "::", "[::]"):
        raise ConfigError(
            f"--advertise {plan.advertise}: a wildcard is where this process listens, not where the "
            "pods reach it; give its address on the cluster's network (or a Service's)"
        )
    for what, value in (("--namespace", plan.namespace), ("the Job name", plan.name)):
        if not _NAME.match(value):
            raise ConfigError(f"{what} {value!r} is not a Kubernetes name (lowercase, digits, '-')")


def _worker_pod(plan: ClusterPlan) -> dict[str, Any]:
    return {
        "metadata": {"labels": dict(_LABELS)},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "worker",
                    "image": plan.image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["worker", f"--coordinator={plan.advertise}"],
                    "env": [
                        {
                            "name": TOKEN_ENV,
                            "valueFrom": {"secretKeyRef": {"name": f"{plan.name}-token", "key": "token"}},
                        }
                    ],
                    "resources": {
                        "requests": {"cpu": plan.cpu, "memory": plan.memory},
                        "limits": {"cpu": plan.cpu, "memory": plan.memory},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def render_worker_job(plan: ClusterPlan) -> list[dict[str, Any]]:
    """The Secret and the Indexed Job of one capacity run's workers (JSON-ready dicts)."""
    meta = {"namespace": plan.namespace, "labels": dict(_LABELS)}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{plan.name}-token", **meta},
        "type": "Opaque",
        "stringData": {"token": plan.token},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": plan.name, **meta},
        "spec": {
            "completionMode": "Indexed",
            "completions": plan.workers,
            "parallelism": plan.workers,
            "backoffLimit": 0,
            "activeDeadlineSeconds": plan.deadline_s,
            "ttlSecondsAfterFinished": plan.ttl_s,
            "template": _worker_pod(plan),
        },
    }
    return [secret, job]


def coordinator_role(namespace: str) -> dict[str, Any]:
    """The Role the coordinator's credentials need for ``--on-cluster`` in ``namespace``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "diagnoser-capacity", "namespace": namespace, "labels": dict(_LABELS)},
        "rules": [
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "delete"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]},
        ],
    }


def _api_client(settings: KubernetesSettings) -> Any:
    from kubernetes import client, config

    if settings.in_cluster:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(settings.kubeconfig) if settings.kubeconfig else None, context=settings.context
        )
    return client


def _create(objects: list[dict[str, Any]], settings: KubernetesSettings) -> None:
    client = _api_client(settings)
    for obj in objects:
        namespace = obj["metadata"]["namespace"]
        if obj["kind"] == "Secret":
            client.CoreV1Api().create_namespaced_secret(namespace, obj)
        else:
            client.BatchV1Api().create_namespaced_job(namespace, obj)


def _delete(objects: list[dict[str, Any]], settings: KubernetesSettings) -> None:
    client = _api_client(settings)
    for obj in reversed(objects):
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        try:
            if obj["kind"] == "Secret":
                client.CoreV1Api().delete_namespaced_secret(name, namespace)
            else:
                client.BatchV1Api().delete_namespaced_job(name, namespace, propagation_policy="Background")
        except client.ApiException as exc:
            if exc.status != 404:
                raise


async def create_objects(objects: list[dict[str, Any]], settings: KubernetesSettings) -> None:
    """Create the Secret and the Job (the ``kubernetes`` client, in a thread).

    Raises :class:`ConfigError` naming what failed (no credentials, refused, unreachable)."""
    try:
        await asyncio.to_thread(_create, objects, settings)
    except Exception as exc:  # the client's many exception types: one clear line instead
        raise ConfigError(f"--on-cluster: could not create the worker Job: {_describe(exc)}") from exc


async def delete_objects(objects: list[dict[str, Any]], settings: KubernetesSettings) -> None:
    """Delete them again (the pods with the Job); an object already gone is not an error."""
    try:
        await asyncio.to_thread(_delete, objects, settings)
    except Exception as exc:
        raise ConfigError(
            f"--on-cluster: could not delete the worker Job {objects[-1]['metadata']['name']} "
            f"(delete it yourself; its ttlSecondsAfterFinished removes it anyway): {_describe(exc)}"
        ) from exc


def _describe(exc: BaseException) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"[:300]
