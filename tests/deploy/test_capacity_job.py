"""``diagnose capacity --on-cluster N``: the worker Job renders, validates, and drives real workers.

What runs here: the objects are rendered by the CLI and validated against the Kubernetes
schemas of two versions (kubernetes-validate, offline), and the rendered pod's own command line
and the rendered Secret's token start local ``diagnose worker`` processes that go through the
barrier and send the steps, merged by the coordinator, through the real CLI. What does not run
here: a Kubernetes API server creating the Job and scheduling its pods (none installable).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from diagnoser.capacity.cluster import RUN_LABEL, ClusterPlan, coordinator_role, render_worker_job
from tests.deploy.rendering import KUBERNETES_VERSIONS, one, validation_problems
from tests.fixtures.k8s_server import Cluster, K8sFixtureServer
from tests.probe.conftest import DelayServer
from tests.probe.conftest import delay_server as delay_server  # the fixture, shared

PLAN = ClusterPlan(workers=4, advertise="10.0.0.5:7070", token="t0ken")


def test_the_worker_job_and_the_coordinator_role_validate_on_two_versions() -> None:
    objects = [*render_worker_job(PLAN), coordinator_role("diagnoser")]
    assert validation_problems(objects, KUBERNETES_VERSIONS) == []


def test_the_job_is_indexed_started_together_and_least_privileged() -> None:
    job = one(render_worker_job(PLAN), "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    assert spec["backoffLimit"] == 0  # a dead worker fails its step; it is not replaced mid-run
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["args"] == ["worker", "--coordinator=10.0.0.5:7070"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"]["cpu"] == container["resources"]["limits"]["cpu"] == "1"
    role = coordinator_role("diagnoser")
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs <= {"create", "get", "patch", "delete"}  # no list/watch/update of anything else


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for(path: Path, process: subprocess.Popen[str], seconds: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and path.stat().st_size:
            return [d for d in yaml.safe_load_all(path.read_text()) if d]
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"no manifest written: {process.communicate()[1]}")


def _pods(job: dict[str, Any], token: str, env: dict[str, str]) -> list[subprocess.Popen[str]]:
    """The Job's pods as local processes: the pod's command line, its own limits (the coordinator's
    caps and the typed target, as the Job's variables give them) and the token of its Secret."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    pod_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return [
        subprocess.Popen(
            [sys.executable, "-m", "diagnoser", *container["args"]],
            env={**env, **pod_env, "DIAGNOSER_WORKER_TOKEN": token, "JOB_COMPLETION_INDEX": str(index)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(job["spec"]["parallelism"])
    ]


def test_the_rendered_job_drives_local_workers_through_the_real_cli(
    delay_server: DelayServer, tmp_path: Path
) -> None:
    port = _free_port()
    manifest = tmp_path / "job.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "diagnoser", "capacity", delay_server.url + "/delay?ms=1", "--slo-p99-ms", "5000",
         "--on-cluster", "2", "--listen", f"127.0.0.1:{port}", "--advertise", f"127.0.0.1:{port}",
         "--render-job", str(manifest), "--steps", "100,200", "--step-s", "1", "--warmup-s", "0",
         "--pause-s", "0.2", "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    objects = _wait_for(manifest, coordinator, 30)
    assert manifest.stat().st_mode & 0o777 == 0o600  # it holds the token
    token = one(objects, "Secret")["stringData"]["token"]
    job = one(objects, "Job")
    assert "--allow-target=127.0.0.1" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    workers = _pods(job, token, env)
    out, err = coordinator.communicate(timeout=90)
    codes = [w.wait(timeout=30) for w in workers]
    assert coordinator.returncode == 0, err
    assert codes == [0, 0]
    report = json.loads(out)
    assert [s["rate"] for s in report["steps"]] == [100, 200]
    # Every request of each step was sent (between the two pods) and answered; the SLO is loose
    # so that a busy host cannot fail a step (what is tested is the protocol, not a latency).
    assert [s["sent"] for s in report["steps"]] == [100, 200]
    assert all(s["held"] and s["failures"] == 0 for s in report["steps"])


def test_two_runs_never_share_a_name_and_their_objects_carry_the_run() -> None:
    first, second = (ClusterPlan(workers=2, advertise="10.0.0.5:7070", token="t" * 32) for _ in range(2))
    assert first.name != second.name
    job, secret = render_worker_job(first)
    assert job["metadata"]["name"] == first.name and secret["metadata"]["name"] == f"{first.name}-token"
    assert {o["metadata"]["labels"][RUN_LABEL] for o in (job, secret)} == {first.run_id}


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_on_cluster_the_coordinator_listens_on_the_advertised_address_only(
    delay_server: DelayServer, tmp_path: Path
) -> None:
    """Without --listen, the address the pods are told (a pod IP), not every interface."""
    port = _free_port()
    manifest = tmp_path / "job.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "diagnoser", "capacity", delay_server.url + "/delay", "--slo-p99-ms", "50",
         "--on-cluster", "1", "--advertise", f"127.0.0.1:{port}", "--render-job", str(manifest), "--steps", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        _wait_for(manifest, coordinator, 30)
        assert not _refused("127.0.0.1", port)
        assert _refused("127.0.0.2", port)  # another address of this machine: nothing listens there
    finally:
        coordinator.kill()
        coordinator.wait()


def _job_started(cluster: Cluster, process: subprocess.Popen[str], seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        jobs = cluster.objects.get("jobs", [])
        if jobs and jobs[0]["spec"].get("suspend") is False:
            return jobs[0]
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"no Job let start: {process.communicate()[1]}")


def test_the_job_owns_its_secret_and_both_go_at_the_end(delay_server: DelayServer, tmp_path: Path) -> None:
    """Through the real CLI against the fixture API server; the fixture's kubelet is this test."""
    cluster = Cluster()
    with K8sFixtureServer(cluster) as api:
        config = tmp_path / "config.yaml"
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        config.write_text(yaml.safe_dump({"kubernetes": {"kubeconfig": str(kubeconfig)}}))
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "diagnoser", "capacity", delay_server.url + "/delay?ms=1", "--slo-p99-ms", "5000",
             "--on-cluster", "2", "--advertise", f"127.0.0.1:{port}", "--job-namespace", "shop", "--config",
             str(config), "--steps", "100,200", "--step-s", "1", "--warmup-s", "0", "--pause-s", "0.2",
             "--format", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        job = _job_started(cluster, coordinator, 60)
        (secret,) = cluster.objects["secrets"]
        assert secret["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job["metadata"]["name"],
                "uid": job["metadata"]["uid"],
            }
        ]
        writes = [(r.method, r.path.rsplit("/", 2)[-2:]) for r in api.requests if r.method != "GET"]
        name = job["metadata"]["name"]
        assert writes == [
            ("POST", ["shop", "jobs"]),
            ("POST", ["shop", "secrets"]),
            ("PATCH", ["jobs", name]),
        ]
        workers = _pods(job, base64.b64decode(secret["data"]["token"]).decode(), env)
        out, err = coordinator.communicate(timeout=90)
        assert [w.wait(timeout=30) for w in workers] == [0, 0]
        assert coordinator.returncode == 0, err
        assert [s["sent"] for s in json.loads(out)["steps"]] == [100, 200]
        # The Job deleted, and its Secret with it (the garbage collector, by its owner reference).
        assert cluster.objects.get("jobs") == [] and cluster.objects.get("secrets") == []
