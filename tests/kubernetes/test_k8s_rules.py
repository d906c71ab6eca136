"""The kubernetes/*-api rules through the engine and the CLI, against the fixture API server."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from diagnoser.cli import app
from diagnoser.config import Settings
from diagnoser.engine import DiagnosisConfig, diagnose
from diagnoser.ruleset import builtin_rules_dir, load_rules
from diagnoser.sources import Sources
from tests.fixtures.k8s import scenarios
from tests.fixtures.k8s.objects import AT
from tests.fixtures.k8s_server import Cluster

RULES_DIR = builtin_rules_dir() / "kubernetes"
MY_RULES = sorted(p.stem for p in RULES_DIR.glob("*-api.yaml"))
CROSS_ZONE = {"service": "redis", "service_namespace": "shop", "clients": "app=web", "latency_seconds": 0.12}

EXPECTED: list[tuple[Callable[[], Cluster], set[str]]] = [
    (scenarios.healthy, set()),
    (scenarios.metrics_server_missing, {"metrics-server-missing-api"}),
    (scenarios.metrics_server_unavailable, {"metrics-server-missing-api"}),
    (scenarios.hpa_at_max, {"hpa-at-max-api"}),
    (scenarios.hpa_scale_up_slow, {"hpa-scale-up-slow-api"}),
    (scenarios.hpa_cpu_on_queue_workload, {"hpa-cpu-on-queue-workload-api"}),
    (scenarios.config_mount_failure, {"config-mount-failure-api"}),
    (scenarios.slow_pod_startup, {"slow-pod-startup-api"}),
    (scenarios.cross_zone, {"dependency-cross-zone-api"}),
    (scenarios.oom_killed, {"oom-killed-api"}),
    (scenarios.crash_loop, {"crash-loop-api"}),
    (scenarios.pvc_pending, {"pvc-pending-storage-class-api"}),
]


@functools.cache
def my_rules() -> list[Any]:
    ruleset = load_rules([], include_builtin=True)
    mine = [p for p in ruleset.problems if "-api" in p.rule_id]
    assert mine == []
    rules = [ruleset.rules[f"kubernetes/{name}"] for name in MY_RULES]
    assert all(rule.runbook_path is not None for rule in rules)
    return rules


def settings(**rule_params: dict[str, Any]) -> Settings:
    return Settings(
        signals={"queue_length": scenarios.QUEUE_METRIC},
        rule_params={
            "kubernetes/dependency-cross-zone-api": CROSS_ZONE,
            "kubernetes/dependency-cross-zone-unmeasured-api": CROSS_ZONE,
            **rule_params,
        },
    )


@pytest.mark.parametrize(("scenario", "expected"), EXPECTED, ids=[e[0].__name__ for e in EXPECTED])
async def test_each_rule_fires_on_its_scenario_only(serve, source_for, scenario, expected) -> None:
    source = source_for(serve(scenario()))
    diagnosis = await diagnose(my_rules(), DiagnosisConfig.from_settings(settings()), Sources(kubernetes=source), at=AT)
    assert diagnosis.errors == []
    fired = {f.rule_id.removeprefix("kubernetes/") for f in diagnosis.findings}
    assert fired == expected
    for finding in diagnosis.findings:
        assert "?" not in finding.summary, finding.summary  # every placeholder filled from evidence
        assert "?" not in finding.title, finding.title
        assert finding.evidence
        assert finding.runbook_url.endswith(f"{finding.rule_id}.md")


async def test_cross_zone_without_latency_is_info(serve, source_for) -> None:
    no_latency = {k: v for k, v in CROSS_ZONE.items() if k != "latency_seconds"}
    config = settings(
        **{
            "kubernetes/dependency-cross-zone-api": no_latency,
            "kubernetes/dependency-cross-zone-unmeasured-api": no_latency,
        }
    )
    source = source_for(serve(scenarios.cross_zone()))
    diagnosis = await diagnose(my_rules(), DiagnosisConfig.from_settings(config), Sources(kubernetes=source), at=AT)
    assert [(f.rule_id, f.severity.value) for f in diagnosis.findings] == [
        ("kubernetes/dependency-cross-zone-unmeasured-api", "info")
    ]
    assert diagnosis.exit_code == 0


async def test_forbidden_resource_is_an_error_entry_and_other_rules_still_run(serve, source_for) -> None:
    cluster = scenarios.metrics_server_missing()
    cluster.add("persistentvolumeclaims", *scenarios.pvc_pending().objects["persistentvolumeclaims"][1:])
    source = source_for(serve(cluster, forbidden={"pods"}))
    diagnosis = await diagnose(my_rules(), DiagnosisConfig.from_settings(settings()), Sources(kubernetes=source), at=AT)
    fired = {f.rule_id for f in diagnosis.findings}
    assert {"kubernetes/metrics-server-missing-api", "kubernetes/pvc-pending-storage-class-api"} <= fired
    assert "sources/kubernetes-unavailable" in fired
    assert len(diagnosis.errors) == 1
    message = diagnosis.errors[0].message
    assert message.startswith("forbidden: list pods in all namespaces (grant get/list/watch on pods")
    assert "rules affected" in message


async def test_missing_api_group_is_reported(serve, source_for) -> None:
    source = source_for(serve(scenarios.cross_zone(), unserved_groups={"discovery.k8s.io"}))
    diagnosis = await diagnose(my_rules(), DiagnosisConfig.from_settings(settings()), Sources(kubernetes=source), at=AT)
    assert any('API group "discovery.k8s.io" missing' in e.message for e in diagnosis.errors)
    assert "kubernetes/dependency-cross-zone-api" not in {f.rule_id for f in diagnosis.findings}


def test_cli_diagnose_now_with_kubeconfig(serve, tmp_path: Path) -> None:
    server = serve(scenarios.oom_killed())
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    result = CliRunner().invoke(
        app,
        [
            "now",
            "--kubeconfig",
            str(kubeconfig),
            "--context",
            "fixture",
            "--namespace",
            "shop",
            "--at",
            "2026-11-29T20:00:00Z",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["errors"] == []
    causes = {(f["rule_id"], f["cause"]) for f in report["findings"]}
    assert ("kubernetes/oom-killed-api", "oom_killed") in causes
    # --namespace shop scopes every namespaced read.
    assert all("/namespaces/" not in path or "/namespaces/shop/" in path for path in server.requested_paths())


def test_cli_healthy_cluster_exits_zero(serve, tmp_path: Path) -> None:
    server = serve(scenarios.healthy())
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    result = CliRunner().invoke(
        app, ["now", "--kubeconfig", str(kubeconfig), "--at", "2026-11-29T20:00:00Z", "--format", "json"]
    )
    report = json.loads(result.stdout)
    assert report["findings"] == [], report["findings"]
    assert report["errors"] == []
    assert result.exit_code == 0
