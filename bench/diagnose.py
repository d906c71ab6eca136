"""How long ``diagnose now`` takes over the whole rule pack on a Prometheus with many series.

Backfills a synthetic cluster (>= 50,000 series: HTTP and gRPC histograms, pools, containers,
nodes, kube-state-metrics), then prints:

* the wall time of a full diagnosis (all rules concurrently, median of several runs), its own CPU
  and the HTTP requests it sends (rule queries, and the names, labels and recognition they need);
* every distinct query timed alone, sequentially: their sum (what a one-at-a-time tool pays)
  and the slowest one (the floor for any concurrent run);
* wall / slowest: the goal is at most 1.5.

Usage: ``python bench/diagnose.py [--services 100] [--runs 5]`` (needs the prometheus package);
``--recognition`` instead times diagnoses with and without recognition by shape, interleaved, and
the recognition step alone (the goal: it adds at most 10 %).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import diagnoser.sources.prometheus as prometheus_source
from diagnoser.checks.promql import AbsentParams, PromqlParams, TrendParams, trend_query
from diagnoser.config import load_settings
from diagnoser.engine import DiagnosisConfig, diagnose
from diagnoser.ruleset import load_rules, resolve_condition
from diagnoser.ruleset.templating import MissingVariable, RuleVariables
from diagnoser.sources import Sources
from diagnoser.sources.prometheus import PrometheusSource
from diagnoser.testing.prometheus import LocalPrometheus

START = 1_795_802_400
INTERVAL = 30
POINTS = 41  # 20 minutes
HTTP_BUCKETS = ["0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.25", "0.5", "0.75", "1", "2.5", "+Inf"]
GRPC_BUCKETS = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf"]


def write_series(out: list[str], name: str, labels: str, start: float, step: float) -> None:
    for i in range(POINTS):
        out.append(f"{name}{{{labels}}} {start + step * i:g} {START + INTERVAL * i}\n")


def generate(path: Path, services: int) -> int:
    """Write the OpenMetrics file; returns the number of series."""
    series = 0
    with path.open("w") as handle:
        for family in _families(services):
            name, rows = family
            out: list[str] = []
            for labels, start, step in rows:
                write_series(out, name, labels, start, step)
                series += 1
            handle.writelines(out)
        handle.write("# EOF\n")
    return series


def _bad(service: int, unhealthy: float, healthy: float) -> float:
    """An incident touches a few services: one in twenty fails, the rest are healthy."""
    return unhealthy if service % 20 == 0 else healthy


def _families(services: int):  # type: ignore[no-untyped-def]
    pods = [(s, p) for s in range(services) for p in range(5)]
    base = lambda s, p: f'namespace="ns{s % 10}",job="svc{s}",pod="svc{s}-{p}"'  # noqa: E731
    yield (
        "http_server_request_duration_seconds_bucket",
        [
            (f'{base(s, p)},http_route="/r{r}",le="{le}"', 0, 10 * (i + 1))
            for s, p in pods
            for r in range(2)
            for i, le in enumerate(HTTP_BUCKETS)
        ],
    )
    yield (
        "http_server_request_duration_seconds_count",
        [
            (f'{base(s, p)},http_route="/r{r}",http_response_status_code="{code}"', 0, step)
            for s, p in pods
            for r in range(2)
            for code, step in (("200", 100), ("500", _bad(s, 3, 0.05)), ("503", _bad(s, 3, 0.02)))
        ],
    )
    grpc = [(s, p) for s, p in pods if s < services // 2]
    yield (
        "grpc_server_handled_total",
        [
            (
                f'{base(s, p)},grpc_type="unary",grpc_service="svc{s}.Api",'
                f'grpc_method="M{m}",grpc_code="{code}"',
                0,
                step,
            )
            for s, p in grpc
            for m in range(3)
            for code, step in (
                ("OK", 100),
                ("Unavailable", _bad(s, 3, 0.05)),
                ("DeadlineExceeded", _bad(s, 2, 0.02)),
                ("NotFound", 2),
            )
        ],
    )
    yield (
        "grpc_server_handling_seconds_bucket",
        [
            (
                f'{base(s, p)},grpc_type="unary",grpc_service="svc{s}.Api",grpc_method="M{m}",le="{le}"',
                0,
                10 * (i + 1),
            )
            for s, p in grpc
            for m in range(3)
            for i, le in enumerate(GRPC_BUCKETS)
        ],
    )
    pools = [(s, p, pool) for s, p in pods for pool in ("main", "replica")]
    pl = lambda s, p, pool: f'{base(s, p)},db_client_connection_pool_name="{pool}"'  # noqa: E731
    yield "db_client_connection_max", [(pl(*x), 10, 0) for x in pools]
    yield (
        "db_client_connection_count",
        [
            (f'{pl(*x)},db_client_connection_state="{state}"', 5, 0)
            for x in pools
            for state in ("used", "idle")
        ],
    )
    yield "db_client_connection_pending_requests", [(pl(*x), 0, 0) for x in pools]
    yield "db_client_connection_use_time_seconds_count", [(pl(*x), 0, 3000) for x in pools]
    yield "db_client_connection_use_time_seconds_sum", [(pl(*x), 0, 30) for x in pools]
    containers = [(s, p, c) for s, p in pods for c in ("app", "sidecar", "init")]
    ct = lambda s, p, c: f'namespace="ns{s % 10}",pod="svc{s}-{p}",container="{c}",id="/kubepods/{s}/{p}/{c}"'  # noqa: E731
    yield "container_memory_working_set_bytes", [(ct(*x), 2e8, 1e5) for x in containers]
    yield "container_spec_memory_limit_bytes", [(ct(*x), 1e9, 0) for x in containers]
    yield "container_cpu_cfs_periods_total", [(ct(*x), 0, 300) for x in containers]
    yield "container_cpu_cfs_throttled_periods_total", [(ct(*x), 0, 3) for x in containers]
    yield "container_cpu_usage_seconds_total", [(ct(*x), 0, 3) for x in containers]
    ks = lambda s, p, c: f'namespace="ns{s % 10}",pod="svc{s}-{p}",container="{c}"'  # noqa: E731
    yield "kube_pod_container_status_restarts_total", [(ks(*x), 0, 0) for x in containers]
    yield (
        "kube_pod_container_resource_limits",
        [(f'{ks(*x)},resource="{r}"', v, 0) for x in containers for r, v in (("memory", 1e9), ("cpu", 1))],
    )
    nodes = max(10, services // 5)
    yield (
        "node_cpu_seconds_total",
        [
            (f'instance="10.0.{n // 250}.{n % 250}:9100",job="node",cpu="{c}",mode="{m}"', 0, 3)
            for n in range(nodes)
            for c in range(8)
            for m in ("idle", "user", "system", "iowait", "irq", "softirq", "steal", "nice")
        ],
    )
    yield (
        "node_sockstat_TCP_tw",
        [(f'instance="10.0.{n // 250}.{n % 250}:9100",job="node"', 500, 0) for n in range(nodes)],
    )
    yield "up", [(f'{base(s, p)},instance="10.1.{s}.{p}:8080"', 1, 0) for s, p in pods]


def distinct_queries(rules, settings) -> list[str]:  # type: ignore[no-untyped-def]
    queries: dict[str, None] = {}
    for rule in rules:
        variables = rule.variables(RuleVariables.from_settings(settings))
        for condition in (*rule.when, *rule.evidence):
            try:
                resolved = resolve_condition(condition.kind, condition.raw_params, variables)
            except MissingVariable:
                continue
            if isinstance(resolved, PromqlParams | AbsentParams):
                queries[resolved.query] = None
            elif isinstance(resolved, TrendParams):
                queries[trend_query(resolved)] = None
                if resolved.limit:
                    queries[resolved.limit] = None
    return list(queries)


class _RequestCount:
    """Counts the HTTP requests the Prometheus source sends while entered (what a diagnosis costs
    besides its distinct rule queries: recognition, claims, label and name lookups)."""

    def __init__(self) -> None:
        self.sent = 0
        self._original = prometheus_source._send

    def __enter__(self) -> None:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.sent += 1
            return await self._original(*args, **kwargs)

        prometheus_source._send = counted  # type: ignore[assignment]

    def __exit__(self, *_: object) -> None:
        prometheus_source._send = self._original  # type: ignore[assignment]


async def measure(url: str, runs: int, verbose: bool, concurrency: int) -> None:
    settings = load_settings(
        overrides={
            "prometheus": {"url": url, "query_timeout_s": 60, "max_concurrency": concurrency},
            "deadline_s": 120,
            "signals": {"queue_length": "db_client_connection_pending_requests"},
        }
    )
    rules = [r for r in load_rules([]) if set(r.sources) == {"prometheus"}]
    at = datetime.fromtimestamp(START + INTERVAL * (POINTS - 1), UTC)
    source = PrometheusSource(settings.prometheus)
    queries = distinct_queries(rules, settings)
    config = DiagnosisConfig.from_settings(settings)
    await diagnose(rules, config, Sources(prometheus=source), at=at)  # warm-up
    singles: list[float] = []
    for query in queries:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            await source.query(query, at, share=False)
            best = min(best, time.perf_counter() - started)
        singles.append(best)
    await source.aclose()
    if verbose:
        for seconds, query in sorted(zip(singles, queries, strict=True), reverse=True)[:12]:
            print(f"  {seconds * 1000:7.1f} ms  {' '.join(query.split())[:110]}")
    walls: list[float] = []
    cpu: list[float] = []
    findings = errors = 0
    requests = _RequestCount()
    for _ in range(runs):
        source = PrometheusSource(settings.prometheus)  # no answers shared with the previous run
        started, started_cpu = time.perf_counter(), time.process_time()
        with requests:
            diagnosis = await diagnose(rules, config, Sources(prometheus=source), at=at)
        walls.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        await source.aclose()
        findings, errors = len(diagnosis.findings), len(diagnosis.errors)
    slowest = max(singles)
    slowest_query = " ".join(queries[singles.index(slowest)].split())
    wall = statistics.median(walls)
    print(f"rules evaluated          {len(rules)}")
    print(f"distinct queries         {len(queries)}")
    print(f"findings / errors        {findings} / {errors}")
    print(f"HTTP requests            {requests.sent / runs:8.1f} per diagnosis (queries, names, labels)")
    print(f"sum of single queries    {sum(singles) * 1000:8.1f} ms")
    print(f"slowest single query     {slowest * 1000:8.1f} ms   {slowest_query[:90]}")
    print(
        f"full diagnosis (median)  {wall * 1000:8.1f} ms   "
        f"(min {min(walls) * 1000:.1f}, max {max(walls) * 1000:.1f}, {runs} runs)"
    )
    print(
        f"diagnoser's own CPU      {statistics.median(cpu) * 1000:8.1f} ms per diagnosis "
        "(the rest is Prometheus)"
    )
    print(f"concurrency gain         {sum(singles) / wall:8.2f}x  (sum / wall)")
    print(f"wall / slowest           {wall / slowest:8.2f}   (goal <= 1.5)")


async def recognition_overhead(url: str, runs: int, concurrency: int) -> None:
    """What recognition by shape adds to a diagnosis: runs interleaved with and without it (the
    ``resources/`` rules and the inferred conventions), and the recognition step alone."""
    import diagnoser.checks.signal as signal_check
    from diagnoser.signals import load_catalogue
    from diagnoser.signals.infer import Recognition
    from diagnoser.signals.recognition import recognition

    settings = load_settings(
        overrides={
            "prometheus": {"url": url, "query_timeout_s": 60, "max_concurrency": concurrency},
            "deadline_s": 120,
            "signals": {"queue_length": "db_client_connection_pending_requests"},
        }
    )
    config = DiagnosisConfig.from_settings(settings)
    with_it = [r for r in load_rules([]) if set(r.sources) == {"prometheus"}]
    without = [r for r in with_it if not r.id.startswith("resources/")]
    at = datetime.fromtimestamp(START + INTERVAL * (POINTS - 1), UTC)

    async def nothing(*_: object) -> Recognition:
        return Recognition()

    async def once(rules: list, recognise: bool) -> tuple[float, float]:  # type: ignore[type-arg]
        signal_check.recognition = recognition if recognise else nothing  # type: ignore[assignment]
        source = PrometheusSource(settings.prometheus)
        started, started_cpu = time.perf_counter(), time.process_time()
        await diagnose(rules, config, Sources(prometheus=source), at=at)
        elapsed = (time.perf_counter() - started, time.process_time() - started_cpu)
        await source.aclose()
        return elapsed

    await once(with_it, True)  # warm-up
    before, after, alone = [], [], []
    for _ in range(runs):
        before.append(await once(without, False))
        after.append(await once(with_it, True))
        source = PrometheusSource(settings.prometheus)
        started = time.perf_counter()
        found = await recognition(source, load_catalogue(), at, 300.0)
        alone.append(time.perf_counter() - started)
        await source.aclose()
    signal_check.recognition = recognition  # type: ignore[assignment]
    wall_before = statistics.median(w for w, _ in before)
    wall_after = statistics.median(w for w, _ in after)
    print(
        f"recognised               {len(getattr(found, 'conventions', ()))} inferred conventions, "
        f"{len(getattr(found, 'resources', ()))} resources"
    )
    print(f"recognition alone        {statistics.median(alone) * 1000:8.1f} ms (median of {runs})")
    for label, runs_of in (("without", before), ("with   ", after)):
        wall, cpu = statistics.median(w for w, _ in runs_of), statistics.median(c for _, c in runs_of)
        print(f"diagnosis {label}        {wall * 1000:8.1f} ms   CPU {cpu * 1000:.1f} ms")
    print(f"recognition adds         {(wall_after / wall_before - 1) * 100:8.1f} %   (goal <= 10 %)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--services", type=int, default=125)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--verbose", action="store_true", help="Also print the slowest queries.")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[16], help="prometheus.max_concurrency values to try."
    )
    parser.add_argument(
        "--recognition",
        action="store_true",
        help="Measure what recognition by shape adds (interleaved runs).",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="diagnoser-bench-") as tmp:
        data = Path(tmp) / "bench.om"
        started = time.perf_counter()
        count = generate(data, args.services)
        print(
            f"series                   {count}  ({data.stat().st_size / 1e6:.0f} MB OpenMetrics, "
            f"generated in {time.perf_counter() - started:.1f}s)"
        )
        started = time.perf_counter()
        with LocalPrometheus(openmetrics=data.read_text(), workdir=Path(tmp) / "prom") as prometheus:
            print(f"backfill + start         {time.perf_counter() - started:.1f}s")
            for concurrency in args.concurrency:
                print(f"-- max_concurrency {concurrency}")
                if args.recognition:
                    asyncio.run(recognition_overhead(prometheus.url, args.runs, concurrency))
                else:
                    asyncio.run(measure(prometheus.url, args.runs, args.verbose, concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
