"""KubernetesSource over real HTTP against the fixture API server: data, paging, scoping, failures."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnoser.config import KubernetesSettings
from diagnoser.errors import ConfigError
from diagnoser.models import SourceError
from diagnoser.sources.kubernetes import KubernetesSource
from tests.fixtures.k8s import objects as o
from tests.fixtures.k8s import scenarios
from tests.fixtures.k8s_server import Cluster, Fault


def two_namespaces() -> Cluster:
    cluster = scenarios.healthy()
    cluster.add(
        "configmaps", o.configmap("web-config", "billing", {"x": "1"}), o.configmap("app", "ops", {"y": "2"})
    )
    return cluster


async def test_lists_plain_dicts_with_every_field(serve, source_for) -> None:
    source = source_for(serve(scenarios.healthy()))
    pods = await source.list_objects("pods")
    assert isinstance(pods, list)
    assert len(pods) == 6
    web = next(p for p in pods if p["metadata"]["name"].startswith("web-"))
    assert web["status"]["conditions"][-1]["type"] == "PodScheduled"
    assert web["spec"]["containers"][0]["resources"]["limits"]["memory"] == "512Mi"


async def test_pages_through_continue_tokens(serve, source_for) -> None:
    server = serve(scenarios.bulk(pods=1234, events=10))
    source = source_for(server, page_size=500)
    pods = await source.list_objects("pods")
    assert isinstance(pods, list)
    assert len(pods) == 1234 + 6
    assert len({(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}) == len(pods)
    pod_requests = [r for r in server.requests if r.path == "/api/v1/pods"]
    assert [r.query.get("limit") for r in pod_requests] == ["500", "500", "500"]
    assert "continue" not in pod_requests[0].query
    assert all("continue" in r.query for r in pod_requests[1:])


async def test_lists_five_thousand_pods(serve, source_for) -> None:
    server = serve(scenarios.bulk(pods=5000, events=0))
    source = source_for(server)
    pods = await source.list_objects("pods")
    assert isinstance(pods, list)
    assert len(pods) == 5006
    assert len([r for r in server.requests if r.path == "/api/v1/pods"]) == 11


@pytest.mark.parametrize(
    ("namespaces", "paths", "count"),
    [
        ([], ["/api/v1/configmaps"], 5),
        (["shop"], ["/api/v1/namespaces/shop/configmaps"], 2),
        (["shop", "ops"], ["/api/v1/namespaces/shop/configmaps", "/api/v1/namespaces/ops/configmaps"], 3),
    ],
)
async def test_namespace_scoping(serve, source_for, namespaces, paths, count) -> None:
    cluster = two_namespaces()
    cluster.add("configmaps", o.configmap("x", "team-9", {}))
    server = serve(cluster)
    source = source_for(server, namespaces=namespaces)
    items = await source.list_objects("configmaps")
    assert isinstance(items, list)
    assert len(items) == count
    assert sorted(server.requested_paths()) == sorted(paths)


async def test_cluster_scoped_resources_ignore_namespace_scope(serve, source_for) -> None:
    server = serve(scenarios.healthy())
    source = source_for(server, namespaces=["shop"])
    nodes = await source.list_objects("nodes")
    assert isinstance(nodes, list)
    assert len(nodes) == 4
    assert server.requested_paths() == ["/api/v1/nodes"]


async def test_metadata_only_list_carries_no_secret_data(serve, source_for) -> None:
    server = serve(scenarios.healthy())
    source = source_for(server)
    secrets = await source.list_objects("secrets", field_selector="metadata.name=web-db", metadata_only=True)
    assert isinstance(secrets, list)
    assert [s["metadata"]["name"] for s in secrets] == ["web-db"]
    assert "data" not in secrets[0]
    assert "as=PartialObjectMetadataList" in server.requests[-1].accept


async def test_get_returns_object_or_none_when_absent(serve, source_for) -> None:
    source = source_for(serve(scenarios.metrics_server_missing()))
    assert await source.get_object("apiservices", "v1beta1.metrics.k8s.io") is None
    source = source_for(serve(scenarios.healthy()))
    api = await source.get_object("apiservices", "v1beta1.metrics.k8s.io")
    assert isinstance(api, dict)
    assert api["kind"] == "APIService"


async def test_forbidden_names_verb_resource_group_and_namespace(serve, source_for) -> None:
    source = source_for(
        serve(scenarios.healthy(), forbidden={"pods", "horizontalpodautoscalers"}), namespaces=["shop"]
    )
    pods = await source.list_objects("pods")
    assert isinstance(pods, SourceError)
    assert pods.source == "kubernetes"
    assert pods.message.startswith("forbidden: list pods in namespace shop (grant get/list/watch on pods")
    assert 'cannot list resource "pods"' in pods.message
    hpas = await source.list_objects("horizontalpodautoscalers", namespaces=[])
    assert isinstance(hpas, SourceError)
    assert hpas.message.startswith(
        'forbidden: list horizontalpodautoscalers in API group "autoscaling" in all namespaces '
        "(grant get/list/watch on horizontalpodautoscalers.autoscaling"
    )
    # The other resources still answer.
    assert isinstance(await source.list_objects("events"), list)


async def test_unauthorized_names_the_credentials(serve, source_for, tmp_path: Path) -> None:
    server = serve(scenarios.healthy())
    kubeconfig = server.write_kubeconfig(tmp_path / "stale", token="expired-token")
    source = KubernetesSource.from_settings(KubernetesSettings(enabled=True, kubeconfig=kubeconfig))
    try:
        result = await source.list_objects("nodes")
    finally:
        source.close()
    assert isinstance(result, SourceError)
    assert result.message.startswith(f"unauthorized (401): the API server rejected {kubeconfig}")


async def test_missing_api_group_is_a_404_error_naming_the_group(serve, source_for) -> None:
    source = source_for(
        serve(scenarios.healthy(), unserved_groups={"discovery.k8s.io", "apiregistration.k8s.io"})
    )
    slices = await source.list_objects("endpointslices")
    assert isinstance(slices, SourceError)
    assert 'API group "discovery.k8s.io" missing' in slices.message
    assert "not found (404)" in slices.message
    # A get whose group is not served is an error too, not "the object is absent".
    api = await source.get_object("apiservices", "v1beta1.metrics.k8s.io")
    assert isinstance(api, SourceError)


async def test_timeout_is_an_error_and_not_retried(serve, source_for) -> None:
    # The answer comes far later than the timeout, so the bound below holds on a busy machine too.
    server = serve(scenarios.healthy(), faults={"events": Fault(delay_s=8.0)})
    source = source_for(server, timeout_s=0.3)
    started = time.monotonic()
    events = await source.list_objects("events")
    assert time.monotonic() - started < 4
    assert isinstance(events, SourceError)
    assert events.message.startswith("timed out after 0.3s: list events")
    assert server.requested_paths().count("/api/v1/events") == 1


async def test_connection_refused(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    source = KubernetesSource.from_settings(
        KubernetesSettings(enabled=True, kubeconfig=kubeconfig, timeout_s=2)
    )
    try:
        result = await source.list_objects("pods")
    finally:
        source.close()
    assert isinstance(result, SourceError)
    assert (
        result.message
        == f"cannot connect to http://127.0.0.1:{port}: connection refused (list pods in all namespaces)"
    )


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (Fault(body=b"<html><body>502 Bad Gateway</body></html>", content_type="text/html"), "not JSON"),
        (Fault(body=b'{"kind":"PodList","items":[{"metadata":'), "not JSON"),
        (Fault(body=b'["not", "an", "object"]'), "JSON list, expected an object"),
        (Fault(body=b'{"kind":"PodList","metadata":{}}'), "without an items array"),
        (Fault(status=503), "HTTP 503: list pods in all namespaces: fault injected on pods"),
        (Fault(status=429), "throttled (429)"),
        (
            Fault(status=502, body=b"upstream connect error", content_type="text/plain"),
            "'upstream connect error'",
        ),
    ],
)
async def test_garbage_and_server_errors(serve, source_for, fault, expected) -> None:
    source = source_for(serve(scenarios.healthy(), faults={"pods": fault}))
    result = await source.list_objects("pods")
    assert isinstance(result, SourceError)
    assert expected in result.message


async def test_concurrent_identical_reads_share_one_request(serve, source_for) -> None:
    server = serve(scenarios.healthy(), faults={"pods": Fault(delay_s=0.2)})
    source = source_for(server)
    first, second, third = await asyncio.gather(*(source.list_objects("pods") for _ in range(3)))
    assert first == second == third
    assert server.requested_paths().count("/api/v1/pods") == 1
    source.cache_ttl_s = 0
    await source.list_objects("pods")
    assert server.requested_paths().count("/api/v1/pods") == 2


async def test_context_selection(serve, tmp_path: Path) -> None:
    server = serve(scenarios.healthy())
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    elsewhere = KubernetesSource.from_settings(
        KubernetesSettings(enabled=True, kubeconfig=kubeconfig, context="elsewhere", timeout_s=1)
    )
    try:
        assert isinstance(await elsewhere.list_objects("nodes"), SourceError)
        assert elsewhere.host == "http://127.0.0.1:9"
    finally:
        elsewhere.close()


def test_bad_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load kubeconfig"):
        KubernetesSource.from_settings(KubernetesSettings(enabled=True, kubeconfig=tmp_path / "missing"))
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\ncontexts: []\nclusters: []\nusers: []\n")
    with pytest.raises(ConfigError):
        KubernetesSource.from_settings(
            KubernetesSettings(enabled=True, kubeconfig=tmp_path / "kc", context="nope")
        )


def test_in_cluster_outside_a_pod_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="in-cluster configuration"):
        KubernetesSource.from_settings(KubernetesSettings(enabled=True, in_cluster=True))


async def test_undeclared_reads_are_refused(serve, source_for) -> None:
    source = source_for(serve(scenarios.healthy()))
    with pytest.raises(ValueError, match="not declared"):
        await source.list_objects("deployments")
    with pytest.raises(ValueError, match="not declared"):
        await source.get_object("pods", "web")  # pods are listed, never fetched one by one


async def test_expired_answers_are_not_kept(serve, source_for) -> None:
    source = source_for(serve(scenarios.healthy()))
    source.cache_ttl_s = 0.05
    await source.list_objects("pods")
    await asyncio.sleep(0.1)
    await source.list_objects("nodes")
    assert [key[1] for key in source._flight._entries] == ["nodes"]


def test_leader_election_loads_the_same_credentials(tmp_path: Path) -> None:
    from diagnoser.config import LeaderElectionSettings
    from diagnoser.daemon.leader import LeaseElector

    with pytest.raises(ConfigError, match=r"^leader election: cannot load kubeconfig: "):
        LeaseElector.from_settings(
            KubernetesSettings(enabled=True, kubeconfig=tmp_path / "missing"), LeaderElectionSettings()
        )
    with pytest.raises(ConfigError, match=r"^leader election: cannot load in-cluster configuration: "):
        LeaseElector.from_settings(
            KubernetesSettings(enabled=True, in_cluster=True), LeaderElectionSettings()
        )


def test_importing_the_source_and_checks_does_not_load_the_client_library() -> None:
    # The client package is large: only configurations with Kubernetes should pay for it.
    code = (
        "import sys, diagnoser.models, diagnoser.sources.kubernetes, diagnoser.checks.registry as r\n"
        "r.load_check_kinds()\n"
        "print(sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
