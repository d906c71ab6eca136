"""The ClusterRoles in deploy/ (the kustomize base's and the Helm chart's) grant exactly what the
code reads (RESOURCES), read-only, no wildcards."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnoser.checks.registry import CheckContext, check_kinds
from diagnoser.sources import Sources
from diagnoser.sources.kubernetes.resources import RBAC_VERBS, RESOURCES, ResourceKind
from tests.deploy.rendering import helm_template, one
from tests.fixtures.k8s import objects as o
from tests.fixtures.k8s import scenarios
from tests.fixtures.k8s.objects import AT
from tests.fixtures.k8s_server import RESOURCE_TYPES

CLUSTERROLE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "clusterrole.yaml"


def grants(role: Mapping[str, Any]) -> dict[tuple[str, str], set[str]]:
    """``(api group, resource) -> verbs`` granted by a ClusterRole document."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or ():
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                granted.setdefault((group, resource), set()).update(rule.get("verbs") or ())
    return granted


def rbac_problems(role: Mapping[str, Any], reads: Iterable[ResourceKind]) -> list[str]:
    """Every way ``role`` and the resources the code reads disagree; empty when in sync."""
    problems: list[str] = []
    for rule in role.get("rules") or ():
        for key in ("apiGroups", "resources", "verbs"):
            if "*" in (rule.get(key) or ()):
                problems.append(f"wildcard in {key}: {rule}")
        if rule.get("nonResourceURLs") or rule.get("resourceNames"):
            problems.append(f"unexpected nonResourceURLs/resourceNames: {rule}")
    granted = grants(role)
    for (group, resource), verbs in sorted(granted.items()):
        if verbs - RBAC_VERBS:
            problems.append(
                f"{resource} in API group {group!r}: verbs beyond get/list/watch: "
                f"{sorted(verbs - RBAC_VERBS)}"
            )
    wanted = {(kind.group, kind.resource): set(kind.verbs) for kind in reads}
    for (group, resource), verbs in sorted(wanted.items()):
        missing = verbs - granted.get((group, resource), set())
        if missing:
            problems.append(
                f"code reads {resource} in API group {group!r} with {sorted(missing)}, not granted"
            )
    for group, resource in sorted(set(granted) - set(wanted)):
        problems.append(f"role grants {resource} in API group {group!r}, which no check reads")
    return problems


def load_role() -> dict[str, Any]:
    role = yaml.safe_load(CLUSTERROLE.read_text(encoding="utf-8"))
    assert role["kind"] == "ClusterRole"
    return role


def chart_role() -> dict[str, Any]:
    """The ClusterRole ``helm install`` creates with the chart's default values."""
    rendered = helm_template(set_values=["prometheus.url=http://prometheus:9090"])
    return dict(one(rendered, "ClusterRole"))


@pytest.mark.parametrize("role", [load_role, chart_role], ids=["kustomize-base", "helm-chart"])
def test_clusterrole_matches_the_resources_the_code_reads(role: Callable[[], dict[str, Any]]) -> None:
    assert rbac_problems(role(), RESOURCES.values()) == []


def test_consistency_check_fails_when_a_read_is_not_granted() -> None:
    role = load_role()
    role["rules"] = [r for r in role["rules"] if "endpointslices" not in r["resources"]]
    assert rbac_problems(role, RESOURCES.values()) == [
        "code reads endpointslices in API group 'discovery.k8s.io' with ['list'], not granted"
    ]
    extra = ResourceKind("batch", "v1", "jobs", True, ("list",))
    assert rbac_problems(load_role(), [*RESOURCES.values(), extra]) == [
        "code reads jobs in API group 'batch' with ['list'], not granted"
    ]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "delete"]},
            "verbs beyond get/list/watch",
        ),
        ({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}, "wildcard in apiGroups"),
        ({"apiGroups": [""], "resources": ["*"], "verbs": ["list"]}, "wildcard in resources"),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}, "wildcard in verbs"),
        ({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get"]}, "which no check reads"),
    ],
)
def test_consistency_check_rejects_write_verbs_wildcards_and_extras(
    rule: dict[str, Any], expected: str
) -> None:
    role = load_role()
    role["rules"].append(rule)
    assert any(expected in p for p in rbac_problems(role, RESOURCES.values()))


def test_every_declared_resource_exists_in_the_api() -> None:
    # The fixture's catalogue mirrors the real API's group/version/plural names.
    for kind in RESOURCES.values():
        served = RESOURCE_TYPES[kind.resource]
        assert (served.group, served.version, served.namespaced) == (
            kind.group,
            kind.version,
            kind.namespaced,
        )


async def test_checks_read_only_declared_resources(serve, source_for) -> None:
    """Run every check, then map each request path back to a resource: all must be in the table."""
    cluster = scenarios.config_mount_failure()
    # Give every check something to look at, so each reads all it ever reads.
    cluster.add("persistentvolumeclaims", o.pvc("data-postgres-0", "shop", "fast-ssd", "Pending"))
    cluster.add(
        "events",
        o.event(
            "shop",
            "Pod",
            "web-7d4b9c8f6d-r6t2w",
            "Failed",
            'Error: secret "web-db-v2" not found',
            -30,
            type_="Warning",
        ),
    )
    server = serve(cluster)
    source = source_for(server)
    ctx = CheckContext(at=AT, sources=Sources(kubernetes=source))
    # Every registered Kubernetes check, with the parameters that make it read all it can.
    params: dict[str, dict[str, Any]] = {
        "k8s.metrics_server": {"require_confirmation": False},
        "k8s.hpa_cpu_on_queue_workload": {"queue_metric": "q"},
        "k8s.cross_zone_dependency": {"service": "redis", "clients": "app=web", "when_latency": "any"},
    }
    kinds = [kind for name, kind in check_kinds().items() if name.startswith("k8s.")]
    assert set(params) <= {kind.name for kind in kinds}
    await asyncio.gather(*(kind.run(kind.params(**params.get(kind.name, {})), ctx) for kind in kinds))
    declared = {(k.group, k.resource) for k in RESOURCES.values()}
    read: set[tuple[str, str]] = set()
    for path in server.requested_paths():
        parts = [p for p in path.split("/") if p]
        group = "" if parts[0] == "api" else parts[1]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if rest[0] == "namespaces":
            rest = rest[2:]
        read.add((group, rest[0]))
    assert read <= declared
    # And the table has no dead rows: every declared resource is read by some check.
    assert read == declared
