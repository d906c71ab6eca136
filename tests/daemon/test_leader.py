"""Leader election on a Lease served by the fixture API server, and the Lease wire format itself."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnoser.config import KubernetesSettings, LeaderElectionSettings
from diagnoser.daemon.leader import LeaseElector, SoleLeader, elector_for
from tests.fixtures.k8s_server import Cluster, Fault, K8sFixtureServer

LEASES = "/apis/coordination.k8s.io/v1/namespaces/diagnoser/leases"


@pytest.fixture
def api_server() -> Iterator[K8sFixtureServer]:
    with K8sFixtureServer(Cluster()) as server:
        yield server


def elector(server: K8sFixtureServer, tmp_path: Path, identity: str, duration: float = 2) -> LeaseElector:
    kubeconfig = server.write_kubeconfig(tmp_path / f"kubeconfig-{identity}")
    return LeaseElector.from_settings(
        KubernetesSettings(enabled=True, kubeconfig=kubeconfig, timeout_s=2),
        LeaderElectionSettings(identity=identity, lease_duration_s=duration, renew_interval_s=0.2),
    )


def call(server: K8sFixtureServer, method: str, path: str, body: dict[str, Any] | None = None,
         token: str | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        server.url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token or server.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def lease_body(holder: str, resource_version: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "diagnoser"}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "renewTime": "2026-11-29T20:00:00.5+00:00"}}


def test_fixture_lease_create_get_update_and_conflicts(api_server: K8sFixtureServer) -> None:
    status, created = call(api_server, "POST", LEASES, lease_body("a"))
    assert status == 201
    assert created["metadata"]["namespace"] == "diagnoser"
    assert created["metadata"]["uid"]
    assert created["spec"]["renewTime"] == "2026-11-29T20:00:00.500000Z"
    version = created["metadata"]["resourceVersion"]

    status, again = call(api_server, "POST", LEASES, lease_body("b"))
    assert (status, again["kind"], again["reason"]) == (409, "Status", "AlreadyExists")
    assert again["details"] == {"name": "diagnoser", "group": "coordination.k8s.io", "kind": "leases"}

    status, got = call(api_server, "GET", f"{LEASES}/diagnoser")
    assert (status, got["spec"]["holderIdentity"]) == (200, "a")

    status, updated = call(api_server, "PUT", f"{LEASES}/diagnoser", lease_body("b", version))
    assert status == 200
    assert updated["metadata"]["resourceVersion"] != version
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]

    status, stale = call(api_server, "PUT", f"{LEASES}/diagnoser", lease_body("c", version))
    assert (status, stale["reason"]) == (409, "Conflict")
    assert "the object has been modified" in stale["message"]

    status, missing = call(api_server, "PUT", f"{LEASES}/other", {**lease_body("a"), "metadata": {"name": "other"}})
    assert (status, missing["reason"]) == (404, "NotFound")
    status, _ = call(api_server, "PUT", f"{LEASES}/diagnoser", lease_body("a"), token="wrong")
    assert status == 401
    status, _ = call(api_server, "POST", "/api/v1/namespaces/shop/pods", {"metadata": {"name": "p"}})
    assert status == 405  # everything but Leases stays read-only


async def test_one_leader_at_a_time_and_takeover_after_expiry(api_server: K8sFixtureServer, tmp_path: Path) -> None:
    a, b = elector(api_server, tmp_path, "a"), elector(api_server, tmp_path, "b")
    try:
        results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
        assert sorted(results) == [False, True]
        leader, follower = (a, b) if a.is_leader else (b, a)
        for _ in range(3):
            assert await leader.try_acquire_or_renew()
            assert not await follower.try_acquire_or_renew()
        # The leader stops renewing (a crash): the follower waits out the lease, then takes it.
        assert not await follower.try_acquire_or_renew()
        await asyncio.sleep(2.1)
        assert await follower.try_acquire_or_renew()
        lease = api_server.cluster.find("leases", "diagnoser", "diagnoser")
        assert lease["spec"]["holderIdentity"] == follower.identity
        assert lease["spec"]["leaseTransitions"] == 1
        # The old leader's own view lapsed before the follower could take over.
        assert not leader.is_leader
        assert not await leader.try_acquire_or_renew()
    finally:
        a.close()
        b.close()


async def test_release_hands_over_at_once(api_server: K8sFixtureServer, tmp_path: Path) -> None:
    a, b = elector(api_server, tmp_path, "a", duration=30), elector(api_server, tmp_path, "b", duration=30)
    try:
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        await a.release()
        assert not a.is_leader
        assert await b.try_acquire_or_renew()
    finally:
        a.close()
        b.close()


async def test_an_unreachable_or_forbidden_api_means_follower(api_server: K8sFixtureServer, tmp_path: Path) -> None:
    api_server.forbidden.add("leases")
    a = elector(api_server, tmp_path, "a")
    try:
        assert not await a.try_acquire_or_renew()
    finally:
        a.close()
    api_server.forbidden.clear()
    b = elector(api_server, tmp_path, "b")
    try:
        assert await b.try_acquire_or_renew()
        api_server.faults["leases"] = Fault(status=503)  # the API server is failing
        assert await b.try_acquire_or_renew() is True  # still within its lease: keeps leading a while
        await asyncio.sleep(1.7)
        assert not await b.try_acquire_or_renew()  # could not renew in time: steps down
    finally:
        b.close()


def test_without_kubernetes_the_single_instance_leads() -> None:
    sole = elector_for(KubernetesSettings(), LeaderElectionSettings())
    assert isinstance(sole, SoleLeader)
    assert sole.is_leader
    assert isinstance(elector_for(KubernetesSettings(enabled=True), LeaderElectionSettings(enabled=False)), SoleLeader)
