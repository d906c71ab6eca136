"""``diagnose capacity --on-cluster N``: the worker pods, as one Kubernetes Indexed Job.

Kubernetes runs the workers; the coordinator (this process) runs the search, merges their
results and evaluates the rules, as for local workers. The objects of one run, named after the
run (``diagnoser-capacity-<run id>``, so two runs never collide)::

    Job     <name>           completionMode: Indexed, completions = parallelism = N,
                             backoffLimit 0 (a worker that dies fails the step, it is not retried),
                             each pod `diagnose worker --coordinator ADDR --allow-target HOST`
                             (index from JOB_COMPLETION_INDEX) with the coordinator's caps as its
                             own (DIAGNOSER_CAPACITY__*, DIAGNOSER_PROBE__*), least privilege: no API
                             token mounted, non-root, read-only root file system, every capability dropped
    Secret  <name>-token     the run's token, owned by the Job (ownerReferences): it is deleted
                             with the Job, by the coordinator or by the Job's TTL
    Role    diagnoser-capacity   what the coordinator's own credentials need in the namespace
                             (create/get/patch/delete the Job, create/delete its Secret): for an
                             administrator to bind

:func:`create_objects` creates the Job suspended, then the Secret with the Job's uid as its owner,
then lets the Job start, so no pod starts before its token exists and no Secret exists without
an owner. The barrier: every pod connects to the coordinator and waits; the first step is sent
only when all N are there, to start at one wall-clock instant (as k6-operator starts its runners
paused). :func:`render_worker_job` is pure (tests validate its output for two Kubernetes
versions); :func:`create_objects` and :func:`delete_objects` talk to the API with the
``kubernetes`` client. A rendered file (``--render-job``) holds the token: it is written readable
by its owner only, and its Secret has no owner until someone gives it one (delete it with the Job:
``kubectl delete -f FILE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from diagnoser import __version__
from diagnoser.config import KubernetesSettings
from diagnoser.errors import ConfigError
from diagnoser.probe.worker import TOKEN_ENV, WorkerLimits, parse_address

__all__ = [
    "DEFAULT_IMAGE",
    "RUN_LABEL",
    "ClusterPlan",
    "check_cluster_plan",
    "coordinator_role",
    "create_objects",
    "delete_objects",
    "new_run_id",
    "owned_by",
    "render_worker_job",
]

DEFAULT_IMAGE = f"ghcr.io/diagnoser/diagnoser:{__version__}"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_LABELS = {"app.kubernetes.io/name": "diagnoser", "app.kubernetes.io/component": "capacity-worker"}
#: The label every object of one run carries: ``kubectl delete job,secret -l diagnoser.io/run=ID``.
RUN_LABEL = "diagnoser.io/run"


def new_run_id() -> str:
    """Eight hex digits: the name of one run's objects, unlikely to repeat in a namespace."""
    return secrets.token_hex(4)


@dataclass(frozen=True)
class ClusterPlan:
    """What the worker Job needs: how many pods, where they reach the coordinator, as what."""

    workers: int
    advertise: str
    token: str
    image: str = DEFAULT_IMAGE
    namespace: str = "diagnoser"
    #: What each pod may send, whatever it is told (the coordinator's own caps and target).
    limits: WorkerLimits = field(default_factory=WorkerLimits)
    run_id: str = field(default_factory=new_run_id)
    #: CPU each worker pod asks for (and is limited to): one core per worker, one event loop.
    cpu: str = "1"
    memory: str = "512Mi"
    #: The Job is deleted by Kubernetes this long after it ends, should the coordinator not.
    ttl_s: int = 600
    #: No worker outlives the capacity ceiling's hour (plus start-up).
    deadline_s: int = 3600 + 600

    @property
    def name(self) -> str:
        """The Job's name (its Secret's is this and ``-token``)."""
        return f"diagnoser-capacity-{self.run_id}"

    @property
    def labels(self) -> dict[str, str]:
        return {**_LABELS, RUN_LABEL: self.run_id}


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
    for what, value in (("--job-namespace", plan.namespace), ("the Job name", plan.name)):
        if not _NAME.match(value):
            raise ConfigError(f"{what} {value!r} is not a Kubernetes name (lowercase, digits, '-')")


def _worker_pod(plan: ClusterPlan) -> dict[str, Any]:
    limits = [{"name": key, "value": value} for key, value in sorted(plan.limits.environment().items())]
    return {
        "metadata": {"labels": plan.labels},
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
                    "args": ["worker", f"--coordinator={plan.advertise}", *plan.limits.arguments()],
                    "env": [
                        {
                            "name": TOKEN_ENV,
                            "valueFrom": {"secretKeyRef": {"name": f"{plan.name}-token", "key": "token"}},
                        },
                        *limits,
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


def render_worker_job(plan: ClusterPlan, *, suspended: bool = False) -> list[dict[str, Any]]:
    """The Job and the Secret of one capacity run's workers (JSON-ready dicts), in creation order.

    ``suspended``: the Job is created with ``suspend: true`` (:func:`create_objects` lets it start
    once its Secret exists)."""
    meta = {"namespace": plan.namespace, "labels": plan.labels}
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
            "suspend": suspended,
            "template": _worker_pod(plan),
        },
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{plan.name}-token", **meta},
        "type": "Opaque",
        "stringData": {"token": plan.token},
    }
    return [job, secret]


def owned_by(obj: dict[str, Any], owner: dict[str, Any], uid: str) -> dict[str, Any]:
    """``obj`` owned by ``owner`` (created, with ``uid``): the garbage collector deletes it with its owner."""
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": uid,
    }
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [reference]}}


def coordinator_role(namespace: str) -> dict[str, Any]:
    """The Role the coordinator's credentials need for ``--on-cluster`` in ``namespace``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "diagnoser-capacity", "namespace": namespace, "labels": dict(_LABELS)},
        "rules": [
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "patch", "delete"]},
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
    """The Job (suspended), its Secret owned by it, then the Job let start."""
    client = _api_client(settings)
    job, secret = objects
    namespace = job["metadata"]["namespace"]
    batch = client.BatchV1Api()
    created = batch.create_namespaced_job(namespace, job)
    try:
        client.CoreV1Api().create_namespaced_secret(namespace, owned_by(secret, job, created.metadata.uid))
        start = [{"op": "replace", "path": "/spec/suspend", "value": False}]
        batch.patch_namespaced_job(job["metadata"]["name"], namespace, start)
    except Exception:
        # A Job that cannot start is not left behind (nor its Secret); the first error is the one told.
        with contextlib.suppress(Exception):
            _delete(objects, settings)
        raise


def _delete(objects: list[dict[str, Any]], settings: KubernetesSettings) -> None:
    client = _api_client(settings)
    for obj in objects:  # the Job first: its pods and its Secret go with it
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
    """Create the Job and its Secret (the ``kubernetes`` client, in a thread; see :func:`_create`).

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
            f"--on-cluster: could not delete the worker Job {objects[0]['metadata']['name']} "
            f"(delete it yourself; its ttlSecondsAfterFinished removes it anyway): {_describe(exc)}"
        ) from exc


def _describe(exc: BaseException) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"[:300]
