"""Benchmark: list and evaluate 5,000 pods and 1,000 events through KubernetesSource and the k8s checks.

Starts the fixture API server (tests/fixtures/k8s_server.py, bulk scenario) in a separate process on
127.0.0.1, so its JSON encoding does not share this process's CPU, then (after a first
pass that also warms the fixture's page cache, printed too) times one evaluation of
every k8s.<check> kind (lists paged 500 at a time, parsed with json.loads into dicts) and, for comparison,
the same pod list deserialised into the client's model objects. Goal: under 2 s. Run::

    .venv/bin/python bench/kubernetes.py [--pods 5000] [--events 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This file is named kubernetes.py: keep its folder off sys.path so `import kubernetes` is the client.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
_ROOT = _HERE.parent
sys.path.insert(0, str(_ROOT))

from diagnoser.checks.registry import CheckContext, check_kinds  # noqa: E402
from diagnoser.config import KubernetesSettings  # noqa: E402
from diagnoser.models import SourceError  # noqa: E402
from diagnoser.sources import Sources  # noqa: E402
from diagnoser.sources.kubernetes import KubernetesSource  # noqa: E402

#: Parameters for the checks that need some to read everything; the others run with their defaults.
PARAMS: dict[str, dict[str, Any]] = {
    "metrics_server": {"require_confirmation": False},
    "hpa_cpu_on_queue_workload": {"queue_metric": "shop_worker_queue_length"},
    "pod_startup": {"window_minutes": 1440},
    "cross_zone_dependency": {"service": "redis", "clients": "app=web", "when_latency": "any"},
}


async def evaluate(kubeconfig: Path) -> tuple[float, dict[str, int], int]:
    from tests.fixtures.k8s.objects import AT

    source = KubernetesSource.from_settings(KubernetesSettings(enabled=True, kubeconfig=kubeconfig))
    ctx = CheckContext(at=AT, sources=Sources(kubernetes=source))
    kinds = {name[4:]: kind for name, kind in check_kinds().items() if name.startswith("k8s.")}
    try:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(kind.run(kind.params(**PARAMS.get(check, {})), ctx) for check, kind in kinds.items())
        )
        elapsed = time.perf_counter() - started
        pods = await source.list_objects("pods")
        events = await source.list_objects("events")
    finally:
        source.close()
    errors = [r for r in results if isinstance(r, SourceError)]
    if errors or isinstance(pods, SourceError) or isinstance(events, SourceError):
        raise SystemExit(f"source errors: {errors or pods or events}")
    rows = {check: len(r) for check, r in zip(kinds, results, strict=True) if isinstance(r, list)}
    return elapsed, rows, len(pods)


def model_objects_list(kubeconfig: Path) -> tuple[float, int]:
    """The same pods through the typed API (deserialised into V1Pod models), for comparison."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration, persist_config=False
    )
    api = client.CoreV1Api(client.ApiClient(configuration))
    started = time.perf_counter()
    count, token = 0, None
    while True:
        page = api.list_pod_for_all_namespaces(limit=500, _continue=token, _request_timeout=30)
        count += len(page.items)
        token = page.metadata._continue
        if not token:
            break
    return time.perf_counter() - started, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--events", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fixtures.k8s_server",
                "--scenario",
                "bulk",
                "--pods",
                str(args.pods),
                "--events",
                str(args.events),
                "--kubeconfig",
                str(kubeconfig),
                "--max-seconds",
                "120",
            ],
            cwd=_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            print(server.stdout.readline().strip())
            first, _, _ = asyncio.run(evaluate(kubeconfig))  # also fills the fixture server's page cache
            print(f"first pass, fixture server encoding every page on the same 2 cores: {first:.3f} s")
            elapsed, rows, pods = asyncio.run(evaluate(kubeconfig))
            print(f"pods listed: {pods} (+ {args.events} events and the other resources)")
            print(f"evidence rows per check: {rows}")
            print(
                f"list + evaluate all k8s checks (fresh source, dicts via json.loads): {elapsed:.3f} s "
                "(goal < 2 s)"
            )
            model_s, model_count = model_objects_list(kubeconfig)
            print(f"for comparison, listing the {model_count} pods into V1Pod model objects: {model_s:.3f} s")
        finally:
            server.terminate()
            server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
