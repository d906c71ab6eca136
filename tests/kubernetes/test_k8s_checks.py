"""Each ``k8s.<check>`` kind against the fixture API server: fires on its scenario, silent on the healthy cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from diagnoser.checks.k8s.cross_zone_dependency import CrossZoneDependencyParams
from diagnoser.checks.k8s.oom_killed import OomKilledParams
from diagnoser.checks.registry import CheckContext, check_kinds
from diagnoser.models import Evidence, SourceError
from diagnoser.ruleset import load_rules
from diagnoser.sources import Sources
from diagnoser.sources.kubernetes import KubernetesSource
from tests.fixtures.k8s import scenarios
from tests.fixtures.k8s.objects import AT
from tests.fixtures.k8s_server import Cluster

QUEUE = {"queue_metric": scenarios.QUEUE_METRIC}
REDIS = {"service": "redis", "service_namespace": "shop", "clients": "app=web", "latency_seconds": 0.12}

# (check, params, firing scenario, labels the evidence must carry, value)
CASES: list[tuple[str, dict[str, Any], Callable[[], Cluster], dict[str, str], float | None]] = [
    (
        "metrics_server",
        {},
        scenarios.metrics_server_missing,
        {"state": "absent", "hpas": "shop/web", "apiservice": "v1beta1.metrics.k8s.io"},
        1.0,
    ),
    (
        "metrics_server",
        {},
        scenarios.metrics_server_unavailable,
        {"state": "not_available", "hpas": "shop/web"},
        1.0,
    ),
    (
        "hpa_at_max",
        {},
        scenarios.hpa_at_max,
        {"hpa": "web", "metric": "cpu", "current": "92%", "target": "60%", "needed_replicas": "16"},
        92 / 60,
    ),
    (
        "hpa_scale_up_slow",
        {},
        scenarios.hpa_scale_up_slow,
        {"hpa": "web", "workload": "Deployment/web", "new_size": "6", "new_pods": "3", "not_ready": "0"},
        98.0,
    ),
    (
        "hpa_cpu_on_queue_workload",
        QUEUE,
        scenarios.hpa_cpu_on_queue_workload,
        {"hpa": "worker", "workload": "Deployment/worker", "cpu_target": "70%"},
        None,
    ),
    (
        "config_mount_failure",
        {},
        scenarios.config_mount_failure,
        {
            "kind": "ConfigMap",
            "name": "web-flags",
            "namespace": "shop",
            "found_in": "shop-staging",
            "volume": "flags",
        },
        9.0,
    ),
    (
        "pod_startup",
        {},
        scenarios.slow_pod_startup,
        {"workload": "Deployment/web", "pods": "3", "p50": "4.0s", "image_pull_p50": "3.2s"},
        4.0,
    ),
    (
        "cross_zone_dependency",
        REDIS,
        scenarios.cross_zone,
        {
            "client_zone": "eu-west-1a",
            "endpoint_zones": "eu-west-1c",
            "share": "100%",
            "latency": "120ms",
            "clients": "3",
        },
        1.0,
    ),
    (
        "oom_killed",
        {},
        scenarios.oom_killed,
        {
            "workload": "Deployment/worker",
            "container": "worker",
            "memory_limit": "256Mi",
            "suggested_limit": "384Mi",
            "restarts": "4",
        },
        1.0,
    ),
    (
        "crash_loop",
        {},
        scenarios.crash_loop,
        {"workload": "Deployment/web", "restarts": "7", "last_termination": "Error (exit code 1)"},
        7.0,
    ),
    (
        "pvc_pending_storage_class",
        {},
        scenarios.pvc_pending,
        {"pvc": "data-postgres-0", "storage_class": "fast-ssd", "available": "gp3-encrypted, standard"},
        900.0,
    ),
]


async def run_check(source: KubernetesSource, check: str, **params: Any) -> list[Evidence] | SourceError:
    ctx = CheckContext(at=AT, sources=Sources(kubernetes=source))
    kind = check_kinds()[f"k8s.{check}"]
    return await kind.run(kind.params(**params), ctx)


@pytest.mark.parametrize(
    ("check", "params", "scenario", "labels", "value"), CASES, ids=[f"{c[0]}-{c[2].__name__}" for c in CASES]
)
async def test_check_fires_on_its_scenario(serve, source_for, check, params, scenario, labels, value) -> None:
    source = source_for(serve(scenario()))
    rows = await run_check(source, check, **params)
    assert isinstance(rows, list), rows
    assert len(rows) == 1, [r.labels for r in rows]
    assert labels.items() <= rows[0].labels.items()
    assert rows[0].value == (pytest.approx(value) if value is not None else None)
    assert rows[0].source == "kubernetes"
    assert rows[0].detail


@pytest.mark.parametrize(("check", "params"), sorted({(c[0], tuple(c[1].items())) for c in CASES}))
async def test_check_silent_on_healthy_cluster(serve, source_for, check, params) -> None:
    source = source_for(serve(scenarios.healthy()))
    assert await run_check(source, check, **dict(params)) == []


async def test_metrics_server_needs_confirmation_by_default(serve, source_for) -> None:
    cluster = scenarios.healthy().remove("apiservices", "v1beta1.metrics.k8s.io")
    source = source_for(serve(cluster))
    assert await run_check(source, "metrics_server") == []
    rows = await run_check(source, "metrics_server", require_confirmation=False)
    assert isinstance(rows, list)
    assert rows[0].labels["hpas"] == "none"


async def test_scale_up_within_budget_is_silent(serve, source_for) -> None:
    source = source_for(serve(scenarios.hpa_scale_up_slow(scheduled_after=5)))
    assert await run_check(source, "hpa_scale_up_slow") == []
    rows = await run_check(source, "hpa_scale_up_slow", budget_seconds=5)
    assert isinstance(rows, list)
    assert rows[0].value == pytest.approx(8.0)


async def test_pod_startup_budget_and_statistic(serve, source_for) -> None:
    source = source_for(serve(scenarios.slow_pod_startup()))
    assert await run_check(source, "pod_startup", budget_seconds=5) == []
    assert await run_check(source, "pod_startup", min_pods=4) == []
    rows = await run_check(source, "pod_startup", statistic="p50", budget_seconds=3.5)
    assert isinstance(rows, list)
    assert rows[0].threshold == 3.5


async def test_an_image_pull_of_a_minute_or_more_is_counted(serve, source_for) -> None:
    # The kubelet writes Go durations: a pull of over a minute is "1m2.345s", not seconds alone.
    source = source_for(serve(scenarios.healthy(web_ready_after=70.0, web_pull="1m2.345s")))
    rows = await run_check(source, "pod_startup", budget_seconds=5)
    assert isinstance(rows, list)
    assert rows[0].labels["image_pull_p50"] == "62.3s"


async def test_cross_zone_latency_gating(serve, source_for) -> None:
    source = source_for(serve(scenarios.cross_zone()))
    base = {k: v for k, v in REDIS.items() if k != "latency_seconds"}
    assert await run_check(source, "cross_zone_dependency", **base, latency_seconds=0.01) == []
    assert await run_check(source, "cross_zone_dependency", **base) == []  # unknown latency: not "high"
    unknown = await run_check(source, "cross_zone_dependency", **base, when_latency="unknown")
    assert isinstance(unknown, list)
    assert unknown[0].labels["latency"] == "unknown"
    assert (
        await run_check(source, "cross_zone_dependency", **base, latency_seconds=0.2, when_latency="unknown")
        == []
    )
    assert await run_check(source, "cross_zone_dependency", when_latency="any") == []  # nothing configured


async def test_queue_workload_named_explicitly(serve, source_for) -> None:
    source = source_for(serve(scenarios.hpa_cpu_on_queue_workload()))
    assert await run_check(source, "hpa_cpu_on_queue_workload", queue_metric="jobs_pending") == []
    rows = await run_check(
        source, "hpa_cpu_on_queue_workload", queue_metric="jobs_pending", workloads=["worker"]
    )
    assert isinstance(rows, list)
    assert rows[0].labels["queue_metric"] == "jobs_pending"
    # The web HPA scales on CPU too, but web does not consume the queue.
    assert [r.labels["hpa"] for r in rows] == ["worker"]


async def test_oom_outside_window_is_ignored(serve, source_for) -> None:
    source = source_for(serve(scenarios.oom_killed()))
    assert await run_check(source, "oom_killed", window_minutes=4) == []


async def test_crash_loop_restart_threshold(serve, source_for) -> None:
    source = source_for(serve(scenarios.crash_loop()))
    assert await run_check(source, "crash_loop", min_restarts=8) == []


async def test_config_mount_failure_not_found_anywhere(serve, source_for) -> None:
    cluster = scenarios.config_mount_failure().remove("configmaps", "web-flags", "shop-staging")
    source = source_for(serve(cluster))
    rows = await run_check(source, "config_mount_failure")
    assert isinstance(rows, list)
    assert rows[0].labels["found_in"] == "no other namespace"


async def test_config_mount_failure_resolved_when_object_now_exists(serve, source_for) -> None:
    from tests.fixtures.k8s import objects as o

    cluster = scenarios.config_mount_failure().add("configmaps", o.configmap("web-flags", "shop", {"a": "b"}))
    source = source_for(serve(cluster))
    assert await run_check(source, "config_mount_failure") == []


async def test_pvc_without_class_and_no_default(serve, source_for) -> None:
    from tests.fixtures.k8s import objects as o

    cluster = scenarios.healthy()
    cluster.objects["storageclasses"] = [o.storageclass("gp3-encrypted")]
    cluster.add("persistentvolumeclaims", o.pvc("data-kafka-0", "shop", None, "Pending"))
    source = source_for(serve(cluster))
    rows = await run_check(source, "pvc_pending_storage_class")
    assert isinstance(rows, list)
    assert rows[0].labels["storage_class"] == "(default)"


async def test_failed_read_is_returned_as_source_error(serve, source_for) -> None:
    source = source_for(serve(scenarios.oom_killed(), forbidden={"pods"}))
    result = await run_check(source, "oom_killed")
    assert isinstance(result, SourceError)
    assert "forbidden: list pods" in result.message


def test_params_reject_options_of_other_checks(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="does not use budget_seconds"):
        OomKilledParams(budget_seconds=3)
    with pytest.raises(ValidationError, match="unsupported label selector"):
        CrossZoneDependencyParams(service="redis", clients="app in (web)")
    (tmp_path / "kubernetes").mkdir()
    rule = "cause: x\nseverity: warning\ntitle: x\nsummary: x\nrecommendation: x\nwhen:\n  - k8s: {check: %s}\n"
    (tmp_path / "kubernetes" / "unknown.yaml").write_text(rule % "no_such_check")
    (tmp_path / "kubernetes" / "stray.yaml").write_text(rule % "oom_killed, budget_seconds: 3")
    problems = {p.rule_id: p.message for p in load_rules([tmp_path], include_builtin=False).problems}
    assert "unknown check 'no_such_check'; known: config_mount_failure, crash_loop" in problems["kubernetes/unknown"]
    assert "check oom_killed does not use budget_seconds" in problems["kubernetes/stray"]
