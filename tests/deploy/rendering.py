"""Render deploy/ the way users do (``helm template``, ``kubectl kustomize``) and check the objects.

The binaries come from ``scripts/setup.sh`` (into the virtualenv's ``bin``, next to the Python
running the tests) or from ``PATH``: ``helm`` is Helm 4, ``helm3`` Helm 3; a test that needs a missing one is skipped with the reason.
Validation uses kubernetes-validate's bundled schemas, so it runs offline, for each version in
:data:`KUBERNETES_VERSIONS`: the chart's ``kubeVersion`` floor and a recent release.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import unavailable

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "diagnoser"
CHART_VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
KUSTOMIZE_BASE = DEPLOY / "kubernetes"
KUSTOMIZE_OVERLAYS = sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))

#: The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and a recent one.
KUBERNETES_VERSIONS = ("1.29", "1.35")
#: Kinds that come from CRDs, which kubernetes-validate has no schema for: checked by the tests.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
WORKLOAD_KINDS = ("Deployment", "StatefulSet")


def tool(name: str) -> str:
    """The path of ``name`` (the virtualenv's copy first), or skip the test saying how to get it."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        unavailable(f"{name} is not installed (scripts/setup.sh installs it into the virtualenv)")
    return found


def _documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIRECTORY``: the objects ``kubectl apply -k`` would send."""
    done = subprocess.run(
        [tool("kubectl"), "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return _documents(done.stdout)


def helm_template(
    values_files: Sequence[Path] = (),
    *,
    set_values: Sequence[str] = (),
    release: str = "diagnoser",
    namespace: str = "diagnoser",
    helm: str = "helm",
) -> list[dict[str, Any]]:
    """``helm template``: the objects ``helm install`` would create."""
    done = _helm_template(helm, values_files, set_values, release, namespace)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return _documents(done.stdout)


def helm_template_error(
    values_files: Sequence[Path] = (), *, set_values: Sequence[str] = (), helm: str = "helm"
) -> str:
    """What ``helm template`` prints when it refuses the values (fails the test if it does not)."""
    done = _helm_template(helm, values_files, set_values, "diagnoser", "diagnoser")
    assert done.returncode != 0, f"helm accepted values it should reject: {values_files} {set_values}"
    return done.stderr


def _helm_template(
    helm: str, values_files: Sequence[Path], set_values: Sequence[str], release: str, namespace: str
) -> subprocess.CompletedProcess[str]:
    argv = [tool(helm), "template", release, str(CHART), "--namespace", namespace]
    for path in values_files:
        argv += ["--values", str(path)]
    for assignment in set_values:
        argv += ["--set", assignment]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def validation_problems(objects: Iterable[Mapping[str, Any]], versions: Sequence[str]) -> list[str]:
    """Objects that fail the strict Kubernetes schema of a version (unknown fields too).

    One problem per object and version: the validator stops at an object's first error.
    """
    import kubernetes_validate

    problems: list[str] = []
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(dict(obj), version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                problems.append(
                    f"{obj['kind']}/{obj['metadata']['name']} on {version}: {where}: {exc.message}"
                )
            except kubernetes_validate.SchemaNotFoundError as exc:
                problems.append(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {exc.message}")
    return problems


def by_kind(objects: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    (found,) = by_kind(objects, kind)
    return found


def workloads(objects: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    return (o for o in objects if o["kind"] in WORKLOAD_KINDS)


def pod_security_problems(workload: Mapping[str, Any]) -> list[str]:
    """How a workload's pods fall short of Pod Security "restricted" plus a read-only root."""
    name = f"{workload['kind']}/{workload['metadata']['name']}"
    pod = workload["spec"]["template"]["spec"]
    problems: list[str] = []
    pod_context = pod.get("securityContext") or {}
    if pod_context.get("runAsNonRoot") is not True:
        problems.append(f"{name}: pod runAsNonRoot is not true")
    if pod_context.get("runAsUser") != 10001:
        problems.append(f"{name}: pod runAsUser is {pod_context.get('runAsUser')}, not the image's 10001")
    if (pod_context.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problems.append(f"{name}: no RuntimeDefault seccomp profile")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"{name}: {key}")
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        where = f"{name} container {container['name']}"
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: root filesystem is writable")
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        capabilities = context.get("capabilities") or {}
        if capabilities.get("drop") != ["ALL"] or capabilities.get("add"):
            problems.append(f"{where}: capabilities {capabilities} (want drop [ALL], add none)")
        if context.get("runAsUser") == 0:
            problems.append(f"{where}: runs as root")
    return problems


def scraped_services(monitor: Mapping[str, Any], objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """The Services whose endpoints a ServiceMonitor scrapes: selected by label, with its port name."""
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    return [
        s["metadata"]["name"]
        for s in by_kind(objects, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        and endpoint["port"] in {p["name"] for p in s["spec"].get("ports", [])}
    ]
