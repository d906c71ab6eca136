"""``k8s.image_pull_backoff``: containers cannot start because their image cannot be pulled.

A container waiting with reason ``ErrImagePull`` or ``ImagePullBackOff`` (``RegistryUnavailable``
on kubelets that tell it apart) never starts. The kubelet says why in its ``Failed`` events
(``Failed to pull image "registry.example.com/shop/web:1.2": rpc error: ...``), in the waiting
message of ``ErrImagePull``, and since Kubernetes 1.32 after ``Back-off pulling image "...":``.
The check reads that text and names the registry (parsed from the image reference as the
container runtime does: ``docker.io`` for ``nginx:1.25``), the kind of failure (not found,
unauthorized, cannot resolve, timeout, unreachable, rate limited, certificate) and the fix that
goes with it. Rows are per workload, container and image.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from diagnoser.checks.k8s.common import (
    SOURCE,
    WindowParams,
    container_statuses,
    involved,
    join,
    kubernetes_of,
    recent_events,
    ref,
    since,
    with_owners,
)
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes.objects import workload_of

__all__ = ["ImagePullBackoffParams", "ImageReference", "classify_pull_error", "image_pull_backoff"]

_WAITING_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "RegistryUnavailable"})
_FAILED_PULL = re.compile(r'^Failed to pull image "([^"]+)": (.+)$', re.DOTALL)
_BACK_OFF = re.compile(r'^Back-off pulling image "[^"]+"(?:: (.+))?$', re.DOTALL)
_MESSAGE_LIMIT = 400

#: What the container runtime's error text says went wrong, tried in this order (first match).
#: Transport failures come first: "failed to authorize: ... lookup auth.docker.io: i/o timeout"
#: never reached the registry, so it is a timeout, not a credentials problem.
_FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("certificate", re.compile(r"x509: |certificate signed by unknown authority", re.I)),
    ("cannot resolve", re.compile(r"no such host|server misbehaving|name resolution", re.I)),
    (
        "timeout",
        re.compile(r"i/o timeout|context deadline exceeded|TLS handshake timeout|Client\.Timeout", re.I),
    ),
    (
        "unreachable",
        re.compile(r"connection refused|no route to host|network is unreachable|connection reset"),
    ),
    ("rate limited", re.compile(r"429 Too Many Requests|toomanyrequests", re.I)),
    (
        "unauthorized",
        re.compile(
            r"401 Unauthorized|403 Forbidden|pull access denied|authorization failed"
            r"|no basic auth credentials|unauthorized:",
            re.I,
        ),
    ),
    (
        "not found",
        re.compile(r"code = NotFound|: not found|manifest unknown|name unknown|not found: manifest"),
    ),
)


class ImagePullBackoffParams(WindowParams):
    """``window_minutes``: how far back the kubelet's ``Failed`` events are read for the reason."""

    check_name: ClassVar[str] = "image_pull_backoff"


@dataclass(frozen=True)
class ImageReference:
    """An image reference split the way container runtimes resolve it."""

    registry: str
    repository: str
    #: ``:1.2`` or ``@sha256:...``; empty for an implicit ``latest``.
    version: str

    @classmethod
    def parse(cls, image: str) -> ImageReference:
        """``nginx:1.25`` -> docker.io, library/nginx, :1.25; ``registry.example.com/shop/web:1.2`` -> ..."""
        name, at, digest = image.partition("@")
        first, slash, rest = name.partition("/")
        # The first component is a registry when it looks like a host: a dot, a port or localhost.
        if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
            registry, path = first, rest
        else:
            registry, path = "docker.io", name if slash else f"library/{name}"
        last = path.rsplit("/", 1)[-1]
        repository, version = path, f"@{digest}" if at else ""
        if ":" in last and not at:
            repository, tag = path.rsplit(":", 1)
            version = f":{tag}"
        elif ":" in last:
            repository = path.rsplit(":", 1)[0]
        return cls(registry=registry, repository=repository, version=version)


def classify_pull_error(message: str) -> str:
    """``not found``, ``unauthorized``, ``cannot resolve``, ``timeout``...; ``unknown`` when none fits."""
    return next((name for name, pattern in _FAILURES if pattern.search(message)), "unknown")


@dataclass
class _Stuck:
    image: str
    pods: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)
    pull_secrets: set[str] = field(default_factory=set)
    #: The kubelet's most recent explanation and when it said it (``None``: from a pod status).
    message: str = ""
    said_at: datetime | None = None


@check_kind("k8s.image_pull_backoff", params=ImagePullBackoffParams, reads={"kubernetes"})
async def image_pull_backoff(params: ImagePullBackoffParams, ctx: CheckContext) -> CheckResult:
    """One row per (namespace, workload, container, image) whose pods cannot pull the image."""
    source = kubernetes_of(ctx)
    read = await with_owners(source, params.namespaces, "pods", "events")
    if isinstance(read, SourceError):
        return read
    (pods, events), owners = read
    stuck: dict[tuple[str, str, str, str], _Stuck] = {}
    pod_groups: dict[tuple[str, str], list[_Stuck]] = {}
    for pod in pods:
        for status in container_statuses(pod):
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") not in _WAITING_REASONS:
                continue
            namespace, pod_name = ref(pod)
            kind, workload = workload_of(pod, owners)
            container = str(status.get("name"))
            image = _spec_images(pod).get(container) or str(status.get("image", ""))
            group = stuck.setdefault((namespace, f"{kind}/{workload}", container, image), _Stuck(image))
            group.pods.add(pod_name)
            group.waiting.add(str(waiting["reason"]))
            group.pull_secrets.update(_pull_secrets(pod))
            group.message = group.message or _explanation(str(waiting.get("message", "")))
            pod_groups.setdefault((namespace, pod_name), []).append(group)
    _read_failed_events(events, pod_groups, since(params, ctx))
    return [
        _row(namespace, workload, container, group)
        for (namespace, workload, container, _), group in sorted(stuck.items())
    ]


def _spec_images(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> image as the pod spec writes it (the status may show it resolved)."""
    spec = pod.get("spec") or {}
    containers = (*(spec.get("initContainers") or ()), *(spec.get("containers") or ()))
    return {str(c.get("name")): str(c.get("image", "")) for c in containers}


def _pull_secrets(pod: Mapping[str, Any]) -> set[str]:
    # Admission copies the ServiceAccount's imagePullSecrets into the pod: this is the full list.
    return {
        str(s.get("name")) for s in (pod.get("spec") or {}).get("imagePullSecrets") or () if s.get("name")
    }


def _explanation(waiting_message: str) -> str:
    """The pull error in a waiting message: all of ErrImagePull's, what follows a 1.32+ back-off."""
    back_off = _BACK_OFF.match(waiting_message)
    if back_off:
        return back_off.group(1) or ""
    return waiting_message


def _read_failed_events(
    events: list[dict[str, Any]], pod_groups: Mapping[tuple[str, str], list[_Stuck]], start: datetime
) -> None:
    """Give each group the kubelet's latest ``Failed to pull image`` text for its image, if any."""
    for event, when in recent_events(events, frozenset({"Failed"}), start, "Pod"):
        failed = _FAILED_PULL.match(str(event.get("message", "")))
        if not failed:
            continue  # "Error: ErrImagePull" and the like say nothing more than the status
        for group in pod_groups.get(involved(event), ()):
            if group.image == failed.group(1) and (group.said_at is None or when > group.said_at):
                group.message, group.said_at = failed.group(2), when


def _row(namespace: str, workload: str, container: str, group: _Stuck) -> Evidence:
    reference = ImageReference.parse(group.image)
    reason = classify_pull_error(group.message)
    kubelet_said = " ".join(group.message.split())[:_MESSAGE_LIMIT] or "none (no Failed event in the window)"
    secrets = join(group.pull_secrets) if group.pull_secrets else "none"
    return Evidence(
        source=SOURCE,
        query="list pods (containerStatuses[].state.waiting.reason=ImagePullBackOff|ErrImagePull); "
        "list events reason=Failed",
        labels={
            "namespace": namespace,
            "workload": workload,
            "container": container,
            "image": group.image,
            "registry": reference.registry,
            "pods": join(group.pods, 3),
            "waiting": join(group.waiting),
            "reason": reason,
            "kubelet_message": kubelet_said,
            "pull_secrets": secrets,
            "fix": _fix(reason, reference, namespace, workload, secrets),
        },
        value=float(len(group.pods)),
        detail=f"container {container} of {namespace}/{workload} cannot pull {group.image} from "
        f"{reference.registry} in {len(group.pods)} pod(s) ({reason}); the kubelet said: {kubelet_said}",
    )


def _fix(reason: str, image: ImageReference, namespace: str, workload: str, secrets: str) -> str:
    """What to do about this kind of failure, naming this image, registry and namespace."""
    registry = image.registry
    if reason == "not found":
        return (
            f"check that {image.repository}{image.version or ':latest'} exists in {registry} (a typo in "
            f"the tag, or an image never pushed), or roll {workload} back to the last image that pulled"
        )
    if reason == "unauthorized":
        attached = (
            "the pods have none"
            if secrets == "none"
            else f"the pods use {secrets}: check it is for {registry} and not expired"
        )
        # Docker Hub answers "pull access denied" for a repository that does not exist, too.
        hub = (
            "; Docker Hub says the same of a repository that does not exist"
            if registry == "docker.io"
            else ""
        )
        return (
            f"give the pods credentials for {registry}: a docker-registry Secret in {namespace} listed "
            f"in imagePullSecrets of the pod template or its ServiceAccount ({attached}){hub}"
        )
    if reason == "cannot resolve":
        return (
            f"the nodes cannot resolve {registry}: check the host name in the image and the DNS "
            "resolver of the nodes (the container runtime resolves on the node, not through CoreDNS)"
        )
    if reason in ("timeout", "unreachable"):
        return (
            f"the nodes cannot reach {registry}: check egress from the nodes to it on port 443 "
            "(firewall rules, NAT gateway, the container runtime's proxy settings) and the registry's health"
        )
    if reason == "rate limited":
        return (
            f"{registry} is rate-limiting pulls: pull with credentials (imagePullSecrets) for a higher "
            "limit, or mirror the image into a registry of your own"
        )
    if reason == "certificate":
        return (
            f"the nodes do not trust the TLS certificate of {registry}: add its CA to the container "
            "runtime's registry configuration on the nodes (containerd: certs.d/<registry>/hosts.toml)"
        )
    return f"read the kubelet's message in kubectl describe pod -n {namespace} on one of the pods"
