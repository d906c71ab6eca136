"""Two replicas behind a Lease on the fixture API server; the daemon's HTTP side and its metrics
scraped by a real Prometheus; the Alertmanager receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from diagnoser.daemon import Daemon
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.fixtures.k8s_server import Cluster, K8sFixtureServer
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration


@pytest.fixture
def api_server() -> Iterator[K8sFixtureServer]:
    with K8sFixtureServer(Cluster()) as server:
        yield server


def _replica(tmp_path: Path, prometheus: str, slack: SlackFixtureServer, kubeconfig: Path, name: str) -> Daemon:
    settings = daemon_settings(
        tmp_path / name, prometheus, "inventory", slack=slack,
        leader_election={"identity": name, "lease_duration_s": 2, "renew_interval_s": 0.2},
    )
    settings = settings.model_copy(
        update={"kubernetes": settings.kubernetes.model_copy(update={"enabled": True, "kubeconfig": kubeconfig})}
    )
    return Daemon(settings)


async def test_two_replicas_only_the_leader_notifies(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer,
    api_server: K8sFixtureServer,
) -> None:
    kubeconfig = api_server.write_kubeconfig(tmp_path / "kubeconfig")
    pool_app.set("inventory", "stock-db", 0.98)
    one = _replica(tmp_path, live_prometheus.url, slack, kubeconfig, "replica-one")
    two = _replica(tmp_path, live_prometheus.url, slack, kubeconfig, "replica-two")
    await one.start()
    await two.start()
    try:
        assert one.elector is not None
        assert two.elector is not None
        assert [one.elector.is_leader, two.elector.is_leader].count(True) == 1
        leader, follower = (one, two) if one.elector.is_leader else (two, one)
        lease = api_server.cluster.find("leases", "diagnoser", "diagnoser")
        assert lease["spec"]["holderIdentity"] == leader.elector.identity  # type: ignore[union-attr]

        await wait_for(lambda: len(slack.messages) >= 1, what="the leader's message")
        runs = (leader.runs, follower.runs)
        await wait_for(lambda: leader.runs >= runs[0] + 4 and follower.runs >= runs[1] + 4, what="more runs")
        assert len(slack.messages) == 1  # both diagnosed it; only the leader said so
        assert leader.metrics.leader._value.get() == 1
        assert follower.metrics.leader._value.get() == 0

        # The leader goes away and releases the Lease: the follower takes over without
        # repeating what the old leader said, and reports the resolution.
        await leader.stop()
        await wait_for(lambda: follower.elector is not None and follower.elector.is_leader, what="takeover")
        assert api_server.cluster.find("leases", "diagnoser", "diagnoser")["spec"]["holderIdentity"] == (
            follower.elector.identity  # type: ignore[union-attr]
        )
        runs_after = follower.runs
        await wait_for(lambda: follower.runs >= runs_after + 3, what="runs as leader")
        assert len(slack.messages) == 1
        pool_app.set("inventory", "stock-db", 0.2)
        await wait_for(lambda: len(slack.messages) >= 2, what="the resolution from the new leader")
        assert slack.messages[1].text.startswith("Resolved:")
    finally:
        await one.stop()
        await two.stop()
        pool_app.set("inventory", "stock-db", 0.1)
    writes = [r for r in api_server.requests if r.method in ("POST", "PUT")]
    assert writes, "the Lease was never written"


async def test_metrics_are_scraped_and_http_endpoints_answer(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    pool_app.set("catalog", "products", 0.95)
    pool_app.set("catalog", "reviews", 0.93)
    settings = daemon_settings(
        tmp_path, live_prometheus.url, "catalog", slack=slack,
        listen=f"127.0.0.1:{live_prometheus.daemon_port}", alertmanager_token="am-secret-token",
    )
    daemon = Daemon(settings)
    await daemon.start()
    base = f"http://127.0.0.1:{live_prometheus.daemon_port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 200
            await wait_for(lambda: daemon.runs >= 1, what="a diagnosis")

            async def ready() -> bool:
                async with http.get(f"{base}/readyz") as response:
                    return response.status == 200

            await wait_for(ready, what="/readyz")

            # Prometheus scrapes the daemon: its own metrics are queryable there.
            await wait_for(
                lambda: (live_prometheus.value('sum(diagnoser_diagnoses_total{trigger="schedule"})') or 0) >= 2,
                within=20, what="diagnoser_diagnoses_total in Prometheus",
            )
            await wait_for(
                lambda: live_prometheus.value(
                    'diagnoser_findings{cause="connection_pool_exhaustion", severity="critical"}') == 2,
                what="findings by cause and severity in Prometheus",
            )
            await wait_for(
                lambda: live_prometheus.value('sum(diagnoser_notifications_sent_total{kind="new"})') == 2,
                what="notifications sent in Prometheus",
            )
            assert live_prometheus.value("diagnoser_diagnosis_duration_seconds_count") is not None
            assert live_prometheus.value("diagnoser_notifications_queued") == 0

            # Alertmanager: refused without the token, scoped to the alert's labels with it.
            payload = _alertmanager_payload({"alertname": "CatalogSlow", "namespace": "shop",
                                             "service": "catalog", "pool": "products"})
            async with http.post(f"{base}/alertmanager", json=payload) as response:
                assert response.status == 401
            async with http.post(f"{base}/alertmanager", json=payload,
                                 headers={"Authorization": "Bearer wrong"}) as response:
                assert response.status == 401
            async with http.post(f"{base}/alertmanager", data=b"not json",
                                 headers={"Authorization": "Bearer am-secret-token"}) as response:
                assert response.status == 400
            before = len(slack.messages)
            async with http.post(f"{base}/alertmanager", json=payload,
                                 headers={"Authorization": "Bearer am-secret-token"}) as response:
                assert response.status == 202  # at once; the diagnosis runs in the background
                answer = await response.json()
            assert answer["status"] == "accepted"
            await wait_for(lambda: len(slack.messages) > before, what="the alert report in Slack")
            report = slack.messages[-1]
            assert report.text.startswith("Diagnosis for CatalogSlow: CRITICAL: connection_pool_exhaustion")
            assert "products" in json.dumps(report.blocks)
            assert "reviews" not in json.dumps(report.blocks)  # outside the alert's scope
    finally:
        await daemon.stop()
        pool_app.set("catalog", "products", 0.1)
        pool_app.set("catalog", "reviews", 0.1)


def _alertmanager_payload(labels: dict[str, str]) -> dict[str, Any]:
    """Alertmanager's webhook body, version 4, as it POSTs it."""
    return {
        "version": "4",
        "groupKey": '{}:{alertname="' + labels["alertname"] + '"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "diagnoser",
        "groupLabels": {"alertname": labels["alertname"]},
        "commonLabels": labels,
        "commonAnnotations": {"summary": "p99 over SLO"},
        "externalURL": "http://alertmanager.example:9093",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": {"summary": "p99 over SLO"},
                "startsAt": "2026-11-29T20:00:00.000Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus.example:9090/graph?g0.expr=up",
                "fingerprint": "5f0a4c3b2d1e0f9a",
            }
        ],
    }
