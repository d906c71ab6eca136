"""The daemon's manifests: serve with probes, its state on a PVC, scraped through a ServiceMonitor,
and a namespaced Role for the Lease (the ClusterRole stays read-only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from diagnoser.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def docs() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            found[document["kind"]] = document
    return found


def container() -> dict[str, Any]:
    (only,) = docs()["Deployment"]["spec"]["template"]["spec"]["containers"]
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
    grace = docs()["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > load_settings().daemon.shutdown_grace_s + 10


def test_state_is_a_persistent_volume_claim() -> None:
    d = docs()
    volumes = {v["name"]: v for v in d["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    claim = volumes["state"]["persistentVolumeClaim"]["claimName"]
    pvc = d["PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == claim
    assert pvc["metadata"]["namespace"] == d["Deployment"]["metadata"]["namespace"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert d["Deployment"]["spec"]["strategy"]["type"] == "Recreate"  # RWO: the old pod lets go first


def test_service_and_servicemonitor_reach_metrics() -> None:
    d = docs()
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
    d = docs()
    role, binding = d["Role"], d["RoleBinding"]
    namespace = d["Namespace"]["metadata"]["name"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    account = d["ServiceAccount"]["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": account["namespace"]}]
    # The ClusterRole still cannot write anything, leases included.
    for rule in d["ClusterRole"]["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert "leases" not in rule["resources"]


def test_the_lease_the_daemon_uses_is_in_the_role_namespace(tmp_path: Path, monkeypatch: Any) -> None:
    d = docs()
    env = {e["name"]: e for e in container()["env"]}
    assert env["DIAGNOSER_DAEMON__LEADER_ELECTION__NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    assert env["DIAGNOSER_DAEMON__LEADER_ELECTION__IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    (tmp_path / "config.yaml").write_text(d["ConfigMap"]["data"]["config.yaml"], encoding="utf-8")
    monkeypatch.setenv("DIAGNOSER_DAEMON__LEADER_ELECTION__NAMESPACE", d["Role"]["metadata"]["namespace"])
    monkeypatch.setenv("DIAGNOSER_DAEMON__LEADER_ELECTION__IDENTITY", "diagnoser-7d9f-abcde")
    settings = load_settings(tmp_path / "config.yaml")
    assert settings.kubernetes.enabled  # so leader election is on
    assert settings.daemon.leader_election.namespace == d["Role"]["metadata"]["namespace"]
    assert settings.daemon.leader_election.identity == "diagnoser-7d9f-abcde"
    assert "DIAGNOSER_DAEMON__ALERTMANAGER_TOKEN" in d["Secret"]["stringData"]
