"""The Helm chart, rendered by helm with each values file in its ci/ folder: objects valid on two
Kubernetes versions, hardened pods, a config that diagnoser's own Settings load (with the
credentials the pod gets), user rules and probes that load, one replica as a Deployment and more
as leader-elected StatefulSet replicas, and a values schema that refuses bad values at install."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnoser.config import Settings, load_settings
from diagnoser.probe.spec import load_probe_file
from diagnoser.ruleset import load_rules
from tests.deploy.rendering import (
    CHART,
    CHART_VALUES_FILES,
    KUBERNETES_VERSIONS,
    by_kind,
    helm_template,
    helm_template_error,
    one,
    pod_security_problems,
    scraped_services,
    tool,
    validation_problems,
    workloads,
)

PROMETHEUS = "prometheus.url=http://prometheus-operated.monitoring.svc:9090"
VALUES = {path.name.removesuffix("-values.yaml"): path for path in CHART_VALUES_FILES}


def render(name: str) -> list[dict[str, Any]]:
    return helm_template([VALUES[name]])


def the_workload(objects: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    (workload,) = workloads(objects)
    return workload


def pod_of(objects: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = the_workload(objects)["spec"]["template"]["spec"]
    return spec


def test_the_values_files_cover_the_shapes() -> None:
    assert set(VALUES) == {"minimal", "ha", "full", "no-persistence"}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_renders_to_objects_valid_on_two_kubernetes_versions(name: str) -> None:
    objects = render(name)
    assert validation_problems(objects, KUBERNETES_VERSIONS) == []
    assert pod_security_problems(the_workload(objects)) == []


def test_the_oldest_validated_version_is_the_charts_floor() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    floor = re.fullmatch(r">=(\d+\.\d+)\.0-0", chart["kubeVersion"])
    assert floor is not None and floor.group(1) == KUBERNETES_VERSIONS[0]


def _materialize(objects: Sequence[Mapping[str, Any]], volume_name: str, into: Path) -> Path:
    """Write a ConfigMap volume's files the way the kubelet would (``items`` map keys to paths)."""
    pod = pod_of(objects)
    volume = next(v for v in pod["volumes"] if v["name"] == volume_name)["configMap"]
    data = next(c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"] == volume["name"])["data"]
    paths = {item["key"]: item["path"] for item in volume.get("items", [])} or {key: key for key in data}
    for key, path in paths.items():
        (into / path).parent.mkdir(parents=True, exist_ok=True)
        (into / path).write_text(data[key], encoding="utf-8")
    return into


def _mount_path(objects: Sequence[Mapping[str, Any]], volume_name: str) -> str:
    (container,) = pod_of(objects)["containers"]
    path: str = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume_name)
    return path


PodSettings = Callable[[Sequence[Mapping[str, Any]], Path], Settings]


@pytest.fixture
def pod_environment(monkeypatch: pytest.MonkeyPatch) -> PodSettings:
    """Load Settings as the pod would: its env (the credentials Secret, the downward API)."""

    def load(objects: Sequence[Mapping[str, Any]], tmp_path: Path) -> Settings:
        for name in [n for n in os.environ if n.startswith("DIAGNOSER_")]:
            monkeypatch.delenv(name)
        (container,) = pod_of(objects)["containers"]
        secrets = {s["metadata"]["name"]: s for s in by_kind(objects, "Secret")}
        for source in container.get("envFrom", []):
            secret = secrets.get(source["secretRef"]["name"])
            for key, value in (secret or {}).get("stringData", {}).items():
                monkeypatch.setenv(key, value)
        fields = {"metadata.name": "diagnoser-0", "metadata.namespace": "diagnoser"}
        for variable in container["env"]:
            if "valueFrom" in variable:
                monkeypatch.setenv(variable["name"], fields[variable["valueFrom"]["fieldRef"]["fieldPath"]])
            else:
                monkeypatch.setenv(variable["name"], variable["value"])
        config_dir = _materialize(objects, "config", tmp_path / "config")
        config_arg = next(a for a in container["args"] if a.startswith("--config="))
        config_file = Path(config_arg.split("=", 1)[1])
        assert config_file.parent == Path(_mount_path(objects, "config"))
        return load_settings(config_dir / config_file.name)

    return load


@pytest.mark.parametrize("name", sorted(VALUES))
def test_the_rendered_config_loads_in_diagnosers_settings(
    name: str, tmp_path: Path, pod_environment: PodSettings
) -> None:
    objects = render(name)
    settings = pod_environment(objects, tmp_path)
    values = yaml.safe_load(VALUES[name].read_text(encoding="utf-8"))
    assert settings.prometheus.url == values["prometheus"]["url"]
    assert settings.kubernetes.enabled and settings.kubernetes.in_cluster
    # The Lease is the release's, in the pod's namespace, held under the pod's name.
    assert settings.daemon.leader_election.lease_name == the_workload(objects)["metadata"]["name"]
    assert settings.daemon.leader_election.namespace == "diagnoser"
    assert settings.daemon.leader_election.identity == "diagnoser-0"
    (container,) = pod_of(objects)["containers"]
    assert "--listen=0.0.0.0:8080" in container["args"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080}


def test_every_value_reaches_the_config_and_secrets_stay_out_of_the_configmap(
    tmp_path: Path, pod_environment: PodSettings
) -> None:
    objects = render("full")
    settings = pod_environment(objects, tmp_path)
    assert settings.prometheus.url == "https://thanos-query.monitoring.svc:10902"
    assert settings.prometheus.verify_tls is False and settings.prometheus.query_timeout_s == 20
    assert settings.prometheus.basic_auth is not None
    assert settings.prometheus.basic_auth.username == "diagnoser"
    assert settings.prometheus.basic_auth.password.get_secret_value() == "not-a-real-password"
    assert (
        settings.slack.token is not None
        and settings.slack.token.get_secret_value() == "xoxb-not-a-real-token"
    )
    assert settings.slack.channel == "#oncall"
    assert settings.daemon.alertmanager_token is not None
    assert settings.kubernetes.namespaces == ["shop", "payments"]
    assert (settings.slo.p99_ms, settings.slo.error_ratio) == (250, 0.005)
    assert settings.rule_params["kubernetes/slow-pod-startup-api"] == {"budget_seconds": 1.5}
    assert settings.signals == {"queue_length": "shop_worker_queue_length"}
    assert settings.context_labels == {"cluster": "production-eu-west-1"}
    # `config` is merged last, over what the chart sets.
    assert (settings.window, settings.deadline_s, settings.daemon.diagnose_interval_s) == ("2m", 20, 30)
    assert settings.elasticsearch.urls == ["https://logs-es.elastic.svc:9200"]
    config_text = next(c for c in by_kind(objects, "ConfigMap") if "config.yaml" in c["data"])["data"][
        "config.yaml"
    ]
    for secret in ("not-a-real-password", "xoxb-not-a-real-token", "not-a-real-alertmanager-token"):
        assert secret not in config_text


def test_user_rules_mount_at_their_ids_and_load(tmp_path: Path, pod_environment: PodSettings) -> None:
    objects = render("full")
    settings = pod_environment(objects, tmp_path)
    rules_dir = _materialize(objects, "rules", tmp_path / "rules")
    assert [str(d) for d in settings.rule_dirs] == [_mount_path(objects, "rules")]
    ruleset = load_rules([rules_dir], include_builtin=False)
    assert ruleset.problems == []
    assert sorted(ruleset.rules) == ["pools/orders-pool"]


def test_probe_definitions_mount_where_the_daemon_reads_them(
    tmp_path: Path, pod_environment: PodSettings
) -> None:
    objects = render("full")
    settings = pod_environment(objects, tmp_path)
    probes_dir = _materialize(objects, "probes", tmp_path / "probes")
    mount = Path(_mount_path(objects, "probes"))
    assert [p.parent for p in settings.daemon.probe_files] == [mount]
    spec = load_probe_file(probes_dir / settings.daemon.probe_files[0].name)
    assert spec.target == "http://checkout.shop.svc:8080/healthz"


def test_one_replica_is_a_deployment_with_its_state_claim() -> None:
    objects = render("minimal")
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # RWO: the old pod lets go first
    claim = next(v for v in pod_of(objects)["volumes"] if v["name"] == "state")["persistentVolumeClaim"]
    assert one(objects, "PersistentVolumeClaim")["metadata"]["name"] == claim["claimName"]
    assert not by_kind(objects, "PodDisruptionBudget")  # it would only block node drains
    assert not by_kind(objects, "Secret") and "envFrom" not in pod_of(objects)["containers"][0]


def test_without_persistence_the_state_is_an_empty_dir() -> None:
    objects = render("no-persistence")
    assert not by_kind(objects, "PersistentVolumeClaim")
    assert next(v for v in pod_of(objects)["volumes"] if v["name"] == "state") == {
        "name": "state",
        "emptyDir": {},
    }
    assert pod_of(objects)["serviceAccountName"] == "diagnoser-managed-elsewhere"
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ServiceAccount")


@pytest.mark.parametrize("name", ["ha", "full"])
def test_replicas_are_leader_elected_with_a_claim_each(name: str) -> None:
    objects = render(name)
    values = yaml.safe_load(VALUES[name].read_text(encoding="utf-8"))
    statefulset = one(objects, "StatefulSet")
    spec = statefulset["spec"]
    assert spec["replicas"] == values["replicas"] >= 2
    assert not by_kind(objects, "Deployment") and not by_kind(objects, "PersistentVolumeClaim")
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state"
    assert "state" not in {v["name"] for v in spec["template"]["spec"]["volumes"]}
    assert _mount_path(objects, "state") == "/var/lib/diagnoser"
    governing = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"] == spec["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] < spec["replicas"]
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert spec["template"]["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"


@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_reference_resolves(name: str) -> None:
    objects = render(name)
    values = yaml.safe_load(VALUES[name].read_text(encoding="utf-8"))
    pod = pod_of(objects)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for volume in pod["volumes"]:
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in names
        if "persistentVolumeClaim" in volume:
            assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
    existing = values.get("credentials", {}).get("existingSecret")
    for source in pod["containers"][0].get("envFrom", []):
        assert source["secretRef"]["name"] == existing or ("Secret", source["secretRef"]["name"]) in names
    if values.get("rbac", {}).get("create", True):
        account = pod["serviceAccountName"]
        assert ("ServiceAccount", account) in names
        for binding in [*by_kind(objects, "RoleBinding"), *by_kind(objects, "ClusterRoleBinding")]:
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": account, "namespace": "diagnoser"}
            ]
            assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in names
    selector = the_workload(objects)["spec"]["selector"]["matchLabels"]
    for service in by_kind(objects, "Service"):
        assert service["spec"]["selector"] == selector
    for monitor in by_kind(objects, "ServiceMonitor"):
        assert scraped_services(monitor, objects) == [f"{the_workload(objects)['metadata']['name']}"]


def test_the_lease_role_is_namespaced_and_minimal() -> None:
    role = one(render("minimal"), "Role")
    assert role["metadata"]["namespace"] == "diagnoser"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]


def test_the_network_policy_opens_only_the_http_port() -> None:
    policy = one(render("full"), "NetworkPolicy")
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert ingress["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert {"port": 53, "protocol": "UDP"} in policy["spec"]["egress"][0]["ports"]  # DNS stays open


def test_an_image_digest_wins_over_the_tag() -> None:
    (container,) = pod_of(render("full"))["containers"]
    assert container["image"].startswith("registry.example.com/sre/diagnoser@sha256:")
    (container,) = pod_of(render("minimal"))["containers"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert container["image"] == f"ghcr.io/diagnoser/diagnoser:{chart['appVersion']}"


# What each Helm major prints for a refused value: both name the value and the reason.
SCHEMA_CASES = {
    "missing-url": (
        [],
        {"helm": r"at '/prometheus': missing property 'url'", "helm3": r"prometheus: url is required"},
    ),
    "replicas-not-a-number": (
        [PROMETHEUS, "replicas=two"],
        {
            "helm": r"at '/replicas': got string, want integer",
            "helm3": r"replicas: Invalid type. Expected: integer, given: string",
        },
    ),
    "no-replicas": (
        [PROMETHEUS, "replicas=0"],
        {
            "helm": r"at '/replicas': minimum: got 0, want 1",
            "helm3": r"replicas: Must be greater than or equal to 1",
        },
    ),
    "url-without-scheme": (
        ["prometheus.url=prometheus:9090"],
        {"helm": r"at '/prometheus/url'", "helm3": r"prometheus.url: Does not match pattern"},
    ),
    "misspelt-key": (
        [PROMETHEUS, "replica=2"],
        {
            "helm": r"additional properties 'replica' not allowed",
            "helm3": r"Additional property replica is not allowed",
        },
    ),
    "ratio-above-1": (
        [PROMETHEUS, "slo.errorRatio=5"],
        {"helm": r"at '/slo/errorRatio'", "helm3": r"slo.errorRatio: Must be less than or equal to 1"},
    ),
}


@pytest.mark.parametrize("helm", ["helm", "helm3"])
@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_the_values_schema_refuses_bad_values_with_a_clear_error(helm: str, case: str) -> None:
    set_values, expected = SCHEMA_CASES[case]
    error = helm_template_error(set_values=set_values, helm=helm)
    assert "values don't meet the specifications of the schema" in error
    assert re.search(expected[helm], error), error


@pytest.mark.parametrize("name", sorted(VALUES))
def test_helm_3_renders_what_helm_4_renders(name: str) -> None:
    assert helm_template([VALUES[name]], helm="helm3") == render(name)


def test_credentials_come_from_one_place() -> None:
    error = helm_template_error(
        set_values=[PROMETHEUS, "credentials.existingSecret=mine", "slack.token=xoxb-1"]
    )
    assert "credentials.existingSecret (mine) is set: put DIAGNOSER_SLACK__TOKEN in that Secret" in error


def test_install_notes_say_how_to_diagnose_inside_the_pod() -> None:
    for values, workload in (
        (VALUES["minimal"], "deployment/diagnoser"),
        (VALUES["ha"], "statefulset/diagnoser"),
    ):
        done = subprocess.run(
            [
                tool("helm"),
                "install",
                "diagnoser",
                str(CHART),
                "--dry-run=client",
                "-n",
                "diagnoser",
                "-f",
                str(values),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        notes = done.stdout.split("NOTES:", 1)[1]
        assert (
            f"kubectl -n diagnoser exec {workload} -- \\\n    diagnose now --config /etc/diagnoser/config/config.yaml"
            in notes
        )


@pytest.mark.parametrize("name", sorted(VALUES))
def test_helm_lint_is_clean(name: str) -> None:
    done = subprocess.run(
        [tool("helm"), "lint", "--strict", str(CHART), "-f", str(VALUES[name])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
