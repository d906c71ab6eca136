"""The manifests in deploy/kubernetes: valid documents, a hardened Deployment, wiring that fits together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from diagnoser.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def manifests() -> dict[str, dict[str, Any]]:
    documents: dict[str, dict[str, Any]] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert {"apiVersion", "kind", "metadata"} <= document.keys(), path
            documents[document["kind"]] = document
    return documents


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
