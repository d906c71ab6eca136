"""The kustomize base's manifests as files (no tool needed): every piece, a hardened Deployment that
runs serve with probes and its state on a claim, wiring that fits together, and the namespaced Lease
Role (the ClusterRole stays read-only). The ServiceMonitor component and the credentials Secret
example are read beside it, as a user combines them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from diagnoser.config import load_settings
from tests.deploy.rendering import DEPLOY, KUSTOMIZE_BASE

EXTRAS = [
    DEPLOY / "components" / "servicemonitor" / "servicemonitor.yaml",
    DEPLOY / "examples" / "credentials-secret.example.yaml",
]


def base_files() -> list[Path]:
    """The files the base's kustomization.yaml lists: what `kubectl apply -k` sends."""
    kustomization = yaml.safe_load((KUSTOMIZE_BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    return [KUSTOMIZE_BASE / name for name in kustomization["resources"]]


def manifests() -> dict[str, dict[str, Any]]:
    documents: dict[str, dict[str, Any]] = {}
    for path in [*base_files(), *EXTRAS]:
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert {"apiVersion", "kind", "metadata"} <= document.keys(), path
            documents[document["kind"]] = document
    return documents


def test_the_base_lists_every_manifest_beside_it() -> None:
    assert sorted(base_files()) == sorted(
        p for p in KUSTOMIZE_BASE.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_every_piece_is_there() -> None:
    assert set(manifests()) == {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Secret",
        "Deployment",
        "PersistentVolumeClaim",
        "Service",
        "ServiceMonitor",
        "Role",
        "RoleBinding",
    }


def test_binding_ties_the_role_to_the_deployment_service_account() -> None:
    docs = manifests()
    binding, account, deployment = docs["ClusterRoleBinding"], docs["ServiceAccount"], docs["Deployment"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": docs["ClusterRole"]["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert (
        deployment["metadata"]["namespace"]
        == account["metadata"]["namespace"]
        == docs["Namespace"]["metadata"]["name"]
    )


def test_deployment_is_hardened_and_bounded() -> None:
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert "memory" in container["resources"]["limits"]
    # Writable paths are volumes, since the root filesystem is read-only.
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/tmp", "/etc/diagnoser"} <= mounts


def test_deployment_reads_config_and_credentials_that_exist() -> None:
    docs = manifests()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert [e["secretRef"]["name"] for e in container["envFrom"]] == [docs["Secret"]["metadata"]["name"]]
    config_volume = next(v for v in pod["volumes"] if "configMap" in v)
    assert config_volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert all(key.startswith("DIAGNOSER_") for key in docs["Secret"]["stringData"])


def test_configmap_config_is_valid(tmp_path: Path) -> None:
    config = manifests()["ConfigMap"]["data"]["config.yaml"]
    (tmp_path / "config.yaml").write_text(config, encoding="utf-8")
    settings = load_settings(tmp_path / "config.yaml")
    assert settings.kubernetes.enabled
    assert settings.kubernetes.in_cluster
    assert settings.rule_params["kubernetes/dependency-cross-zone-api"]["service"] == "redis"


def container() -> dict[str, Any]:
    (only,) = manifests()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def test_the_deployment_runs_serve_with_state_listen_and_json_logs() -> None:
    args = container()["args"]
    assert args[0] == "serve"
    options = dict(a.removeprefix("--").split("=", 1) for a in args[1:])
    assert options["config"] == "/etc/diagnoser/config.yaml"
    assert options["log-format"] == "json"
    state = Path(options["state"])
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    assert state.parent == Path(mounts["state"])  # the state file lives on the mounted volume
    port = int(options["listen"].rsplit(":", 1)[1])
    assert {p["name"]: p["containerPort"] for p in container()["ports"]} == {"http": port}


def test_probes_hit_healthz_and_readyz_on_the_http_port() -> None:
    c = container()
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    grace = manifests()["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > load_settings().daemon.shutdown_grace_s + 10


def test_state_is_a_persistent_volume_claim() -> None:
    d = manifests()
    volumes = {v["name"]: v for v in d["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    claim = volumes["state"]["persistentVolumeClaim"]["claimName"]
    pvc = d["PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == claim
    assert pvc["metadata"]["namespace"] == d["Deployment"]["metadata"]["namespace"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert d["Deployment"]["spec"]["strategy"]["type"] == "Recreate"  # RWO: the old pod lets go first


def test_service_and_servicemonitor_reach_metrics() -> None:
    d = manifests()
    pod_labels = d["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service, monitor = d["Service"], d["ServiceMonitor"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http"
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == (port["name"], "/metrics")


def test_lease_role_is_namespaced_and_minimal() -> None:
    d = manifests()
    role, binding = d["Role"], d["RoleBinding"]
    namespace = d["Namespace"]["metadata"]["name"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = d["ServiceAccount"]["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    # The ClusterRole still cannot write anything, leases included.
    for rule in d["ClusterRole"]["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert "leases" not in rule["resources"]


def test_the_lease_the_daemon_uses_is_in_the_role_namespace(tmp_path: Path, monkeypatch: Any) -> None:
    d = manifests()
    env = {e["name"]: e for e in container()["env"]}
    assert env["DIAGNOSER_DAEMON__LEADER_ELECTION__NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    assert (
        env["DIAGNOSER_DAEMON__LEADER_ELECTION__IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.name"
    )
    (tmp_path / "config.yaml").write_text(d["ConfigMap"]["data"]["config.yaml"], encoding="utf-8")
    monkeypatch.setenv("DIAGNOSER_DAEMON__LEADER_ELECTION__NAMESPACE", d["Role"]["metadata"]["namespace"])
    monkeypatch.setenv("DIAGNOSER_DAEMON__LEADER_ELECTION__IDENTITY", "diagnoser-7d9f-abcde")
    settings = load_settings(tmp_path / "config.yaml")
    assert settings.kubernetes.enabled  # so leader election is on
    assert settings.daemon.leader_election.namespace == d["Role"]["metadata"]["namespace"]
    assert settings.daemon.leader_election.identity == "diagnoser-7d9f-abcde"
    assert "DIAGNOSER_DAEMON__ALERTMANAGER_TOKEN" in d["Secret"]["stringData"]
