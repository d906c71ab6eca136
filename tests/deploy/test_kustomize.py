"""The kustomize base and overlays, rendered by kubectl's kustomize: valid objects on two Kubernetes
versions, no placeholder Secret in the base, hardened pods, and an HA overlay that is the base's
pod as leader-elected StatefulSet replicas with a state claim each."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.rendering import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    KUSTOMIZE_BASE,
    KUSTOMIZE_OVERLAYS,
    by_kind,
    kustomize,
    one,
    pod_security_problems,
    scraped_services,
    validation_problems,
    workloads,
)

RENDERED = [KUSTOMIZE_BASE, *KUSTOMIZE_OVERLAYS]


def test_the_overlays_are_the_ones_documented() -> None:
    assert [p.name for p in KUSTOMIZE_OVERLAYS] == ["ha", "servicemonitor"]


@pytest.mark.parametrize("directory", RENDERED, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_renders_to_objects_valid_on_two_kubernetes_versions(directory: Path) -> None:
    objects = kustomize(directory)
    assert objects
    assert validation_problems(objects, KUBERNETES_VERSIONS) == []
    for workload in workloads(objects):
        assert pod_security_problems(workload) == []


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("readOnlyRootFilesytem", True, "readOnlyRootFilesytem"),  # misspelt: unknown fields fail
        ("runAsUser", "10001", "'10001' is not of type 'integer'"),
    ],
)
def test_the_validator_rejects_what_the_api_server_would(field: str, value: Any, expected: str) -> None:
    deployment = copy.deepcopy(one(kustomize(KUSTOMIZE_BASE), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"][field] = value
    problems = validation_problems([deployment], KUBERNETES_VERSIONS)
    assert len(problems) == len(KUBERNETES_VERSIONS), problems
    assert all(expected in p for p in problems), problems


def test_the_base_applies_on_a_plain_cluster_without_placeholders() -> None:
    objects = kustomize(KUSTOMIZE_BASE)
    kinds = {o["kind"] for o in objects}
    assert "Secret" not in kinds  # the example with placeholders lives in deploy/examples
    assert "ServiceMonitor" not in kinds  # needs the Prometheus Operator's CRD
    assert {"Namespace", "Deployment", "PersistentVolumeClaim", "ClusterRole", "Role"} <= kinds
    assert "replace-me" not in repr(objects)
    # Everything namespaced lands in the namespace the base creates.
    namespace = one(objects, "Namespace")["metadata"]["name"]
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] not in cluster_scoped} == {namespace}


def test_the_servicemonitor_overlay_scrapes_the_service() -> None:
    objects = kustomize(DEPLOY / "overlays" / "servicemonitor")
    monitor, service = one(objects, "ServiceMonitor"), one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"


def _without_state(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "state"]
    pod.pop("topologySpreadConstraints", None)
    return pod


def test_the_ha_overlay_runs_the_base_pod_as_replicas_with_a_claim_each() -> None:
    base, ha = kustomize(KUSTOMIZE_BASE), kustomize(DEPLOY / "overlays" / "ha")
    assert not by_kind(ha, "Deployment") and not by_kind(ha, "PersistentVolumeClaim")
    statefulset = one(ha, "StatefulSet")
    spec = statefulset["spec"]
    assert spec["replicas"] >= 2
    # The same pod as the single-replica Deployment, apart from where the state lives.
    base_pod = one(base, "Deployment")["spec"]["template"]["spec"]
    assert _without_state(spec["template"]["spec"]) == _without_state(base_pod)
    # Each replica's own claim, mounted where --state points.
    (claim,) = spec["volumeClaimTemplates"]
    (container,) = spec["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert claim["metadata"]["name"] in mounts
    assert "state" not in {v["name"] for v in spec["template"]["spec"]["volumes"]}
    state_arg = next(a for a in container["args"] if a.startswith("--state="))
    assert Path(state_arg.split("=", 1)[1]).parent == Path(mounts[claim["metadata"]["name"]])
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # The governing Service is headless; the PDB keeps a replica up.
    governing = next(s for s in by_kind(ha, "Service") if s["metadata"]["name"] == spec["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"
    pdb = one(ha, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] < spec["replicas"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    # Leader election: the Lease holder is the pod's (stable) name, the Lease in the Role's namespace.
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env["DIAGNOSER_DAEMON__LEADER_ELECTION__IDENTITY"] == "metadata.name"
    assert env["DIAGNOSER_DAEMON__LEADER_ELECTION__NAMESPACE"] == "metadata.namespace"
    assert one(ha, "Role")["metadata"]["namespace"] == statefulset["metadata"]["namespace"]


def test_ha_and_servicemonitor_compose(tmp_path: Path) -> None:
    def relative(path: Path) -> str:  # kustomize refuses absolute paths
        return os.path.relpath(path, tmp_path)

    components = [relative(DEPLOY / "components" / name) for name in ("ha", "servicemonitor")]
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{relative(KUSTOMIZE_BASE)}]\ncomponents: [{', '.join(components)}]\n",
        encoding="utf-8",
    )
    objects = kustomize(tmp_path)
    assert {"StatefulSet", "ServiceMonitor", "PodDisruptionBudget"} <= {o["kind"] for o in objects}
    assert validation_problems(objects, KUBERNETES_VERSIONS) == []
    # Each pod is scraped once: through the Service "diagnoser", not the headless one too.
    assert scraped_services(one(objects, "ServiceMonitor"), objects) == ["diagnoser"]


def test_the_security_check_names_what_a_pod_gives_away() -> None:
    deployment = copy.deepcopy(one(kustomize(KUSTOMIZE_BASE), "Deployment"))
    pod = deployment["spec"]["template"]["spec"]
    pod["securityContext"]["runAsNonRoot"] = False
    container = pod["containers"][0]
    container["securityContext"]["readOnlyRootFilesystem"] = False
    container["securityContext"]["allowPrivilegeEscalation"] = True
    container["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert pod_security_problems(deployment) == [
        "Deployment/diagnoser: pod runAsNonRoot is not true",
        "Deployment/diagnoser container diagnoser: allowPrivilegeEscalation is not false",
        "Deployment/diagnoser container diagnoser: root filesystem is writable",
        "Deployment/diagnoser container diagnoser: capabilities {'drop': ['ALL'], 'add': ['NET_ADMIN']} "
        "(want drop [ALL], add none)",
    ]
