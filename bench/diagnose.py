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

``--series 1000000`` builds a bed of about that many series instead: the catalogued cluster scaled
to a bit under half of them, beside what no convention names (histogram families and limits that
only recognition by shape finds, and thousands of families it must pass over), ten minutes of
history. It prints the same figures plus the server's own CPU and the requests by kind, with any
sent twice. The goal there: under 5 s and under 300 requests per diagnosis.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import re
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


def write_series(out: list[str], name: str, labels: str, start: float, step: float, points: int) -> None:
    for i in range(points):
        out.append(f"{name}{{{labels}}} {start + step * i:g} {START + INTERVAL * i}\n")


def generate(path: Path, services: int, points: int = POINTS, uncatalogued: float = 0.0) -> int:
    """Write the OpenMetrics file; returns the number of series. ``uncatalogued`` scales the
    families no convention names (1.0: about 550,000 series of them)."""
    series = 0
    with path.open("w") as handle:
        families = _families(services)
        if uncatalogued:
            families = itertools.chain(families, _uncatalogued(uncatalogued))
        for name, rows in families:
            out: list[str] = []
            for labels, start, step in rows:
                write_series(out, name, labels, start, step, points)
                series += 1
            handle.writelines(out)
        handle.write("# EOF\n")
    return series


#: Bounds of the uncatalogued histograms (seconds), and a healthy and a slow family's share of
#: observations at or under each: a healthy one answers within 100 ms, a slow one's p99 is seconds.
ACME_BUCKETS = ["0.01", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"]
ACME_HEALTHY = [0.5, 0.9, 0.999, 1, 1, 1, 1, 1, 1, 1]
ACME_SLOW = [0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1]
#: Catalogued series per service in :func:`_families` (measured: 56,520 for 125 services).
SERIES_PER_SERVICE = 452


def _uncatalogued(scale: float):  # type: ignore[no-untyped-def]
    """Families of in-house and vendor software that no convention names, each service's under its
    own prefix: request histograms (servers split by handler, clients by upstream), thread pools
    with their limits (one service in ``SLOW_EVERY`` slow and at its limit), and many counters and
    gauges recognition must pass over."""
    # Each family is one in-house service's (its own prefix), over twenty pods.
    pods = range(20)
    target = lambda k, i: f'job="acme{k}",instance="10.3.{k % 250}.{i}:8080"'  # noqa: E731
    histograms = max(2, round(120 * scale))
    for k in range(histograms):
        client = k % 3 == 2
        name = f"acme{k}_upstream_request_duration_seconds" if client else f"acme{k}_request_duration_seconds"
        split = "upstream" if client else "handler"
        shares = _shares(k, ACME_SLOW, ACME_HEALTHY)
        keys = [
            f'{target(k, i)},{split}="/p{u}",code="{code}"'
            for i in pods
            for u in range(4)
            for code in ("200", "500")
        ]
        yield (
            f"{name}_bucket",
            [
                (f'{key},le="{le}"', 0, 100 * share)
                for key in keys
                for le, share in zip(ACME_BUCKETS, shares, strict=True)
            ],
        )
        yield f"{name}_count", [(key, 0, 100) for key in keys]
        yield f"{name}_sum", [(key, 0, 100 * (2.0 if shares is ACME_SLOW else 0.02)) for key in keys]
    for k in range(max(2, round(60 * scale))):
        keys = [f'{target(k, i)},pool="p{p}"' for i in pods for p in range(3)]
        busy = 50 if k % SLOW_EVERY == 0 else 12
        yield f"acme{k}_worker_max_threads", [(key, 50, 0) for key in keys]
        yield f"acme{k}_worker_threads", [(key, busy, 0) for key in keys]
    for k in range(max(10, round(2700 * scale))):
        keys = [f'instance="10.4.{k % 250}.{n}:9000",job="vendor{k % 40}",unit="u{n}"' for n in range(100)]
        if k % 2:
            yield f"vendor{k}_frames_total", [(key, 0, 7) for key in keys]
        else:
            yield f"vendor{k}_temperature_celsius", [(key, 40, 0) for key in keys]


#: One service in this many is in trouble (errors, latency); the rest are healthy.
SLOW_EVERY = 20
#: Share of a healthy and a slow service's requests answered within each bound of
#: ``HTTP_BUCKETS`` (p99 under 250 ms, and over 2 s), and of ``GRPC_BUCKETS``.
HTTP_HEALTHY = [0.3, 0.6, 0.9, 0.96, 0.98, 0.99, 0.999, 1, 1, 1, 1, 1]
HTTP_SLOW = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97, 1]
GRPC_HEALTHY = [0.3, 0.6, 0.9, 0.96, 0.99, 0.999, 1, 1, 1, 1]
GRPC_SLOW = [0.05, 0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.97, 1]


def slow_every(count: int) -> None:
    """One service in ``count`` is slow and failing in the beds generated from now on."""
    global SLOW_EVERY
    SLOW_EVERY = max(1, count)


def _bad(service: int, unhealthy: float, healthy: float) -> float:
    """An incident touches a few services: one in ``SLOW_EVERY`` fails, the rest are healthy."""
    return unhealthy if service % SLOW_EVERY == 0 else healthy


def _shares(service: int, slow: list[float], healthy: list[float]) -> list[float]:
    return slow if service % SLOW_EVERY == 0 else healthy


def _families(services: int):  # type: ignore[no-untyped-def]
    pods = [(s, p) for s in range(services) for p in range(5)]
    base = lambda s, p: f'namespace="ns{s % 10}",job="svc{s}",pod="svc{s}-{p}"'  # noqa: E731
    yield (
        "http_server_request_duration_seconds_bucket",
        [
            (f'{base(s, p)},http_route="/r{r}",le="{le}"', 0, 100 * share)
            for s, p in pods
            for r in range(2)
            for le, share in zip(HTTP_BUCKETS, _shares(s, HTTP_SLOW, HTTP_HEALTHY), strict=True)
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
                100 * share,
            )
            for s, p in grpc
            for m in range(3)
            for le, share in zip(GRPC_BUCKETS, _shares(s, GRPC_SLOW, GRPC_HEALTHY), strict=True)
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
    besides its distinct rule queries: recognition, claims, label and name lookups), by what they ask."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self._original = prometheus_source._send

    def __enter__(self) -> None:
        async def counted(client: Any, path: str, params: dict[str, str], wait_s: float) -> Any:
            self.sent.append((path, params.get("query") or params.get("match[]") or ""))
            return await self._original(client, path, params, wait_s)

        prometheus_source._send = counted  # type: ignore[assignment]

    def __exit__(self, *_: object) -> None:
        prometheus_source._send = self._original  # type: ignore[assignment]


def _cpu_seconds(pid: int | None) -> float:
    """A process' user and system CPU so far (``/proc/<pid>/stat``); 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kind(path: str, query: str) -> str:
    """What a request is for, in a few words (for the breakdown of a diagnosis' requests)."""
    if path != "/api/v1/query":
        return path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1]
    words = re.findall(r"[a-z_]+\(", query)
    return "query " + (words[0][:-1] if words else "selector")


async def measure(
    url: str, runs: int, verbose: bool, concurrency: int, points: int = POINTS, server_pid: int | None = None
) -> None:
    settings = load_settings(
        overrides={
            "prometheus": {"url": url, "query_timeout_s": 60, "max_concurrency": concurrency},
            "deadline_s": 120,
            "signals": {"queue_length": "db_client_connection_pending_requests"},
        }
    )
    rules = [r for r in load_rules([]) if set(r.sources) == {"prometheus"}]
    at = datetime.fromtimestamp(START + INTERVAL * (points - 1), UTC)
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
    server_cpu: list[float] = []
    findings = errors = 0
    for _ in range(runs):
        requests = _RequestCount()
        source = PrometheusSource(settings.prometheus)  # no answers shared with the previous run
        started, started_cpu = time.perf_counter(), time.process_time()
        started_server = _cpu_seconds(server_pid)
        with requests:
            diagnosis = await diagnose(rules, config, Sources(prometheus=source), at=at)
        walls.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        server_cpu.append(_cpu_seconds(server_pid) - started_server)
        await source.aclose()
        findings, errors = len(diagnosis.findings), len(diagnosis.errors)
    slowest = max(singles)
    slowest_query = " ".join(queries[singles.index(slowest)].split())
    wall = statistics.median(walls)
    print(f"rules evaluated          {len(rules)}")
    print(f"distinct queries         {len(queries)}")
    print(f"findings / errors        {findings} / {errors}")
    print(f"HTTP requests            {len(requests.sent):8d} per diagnosis (queries, names, labels)")
    kinds = collections.Counter(_kind(path, query) for path, query in requests.sent)
    print("  by kind                " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common(8)))
    repeated = sum(n - 1 for n in collections.Counter(requests.sent).values() if n > 1)
    print(f"  sent more than once    {repeated}")
    if verbose:
        for (path, query), n in collections.Counter(requests.sent).most_common(12):
            if n > 1:
                print(f"    {n}x {path} {' '.join(query.split())[:100]}")
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
    if server_pid is not None:
        print(f"Prometheus CPU           {statistics.median(server_cpu) * 1000:8.1f} ms per diagnosis")
    print(f"concurrency gain         {sum(singles) / wall:8.2f}x  (sum / wall)")
    print(f"wall / slowest           {wall / slowest:8.2f}   (goal <= 1.5)")


async def recognition_overhead(url: str, runs: int, concurrency: int, points: int = POINTS) -> None:
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
    at = datetime.fromtimestamp(START + INTERVAL * (points - 1), UTC)

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
    parser.add_argument(
        "--series",
        type=int,
        default=0,
        help="Build a bed of about this many series, catalogued and not (overrides --services).",
    )
    parser.add_argument(
        "--slow-every",
        type=int,
        default=SLOW_EVERY,
        help="One service in this many is slow and failing (1: every one, the worst case).",
    )
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
    slow_every(args.slow_every)
    services, points, uncatalogued = args.services, POINTS, 0.0
    if args.series:
        uncatalogued = args.series / 1_000_000
        # About 507,000 uncatalogued series per 1.0 of scale; the catalogued cluster makes up the rest.
        services = max(5, round((args.series - 507_000 * uncatalogued) / SERIES_PER_SERVICE))
        points = 21  # ten minutes: each rate has its window and a lead-in
    with tempfile.TemporaryDirectory(prefix="diagnoser-bench-") as tmp:
        data = Path(tmp) / "bench.om"
        started = time.perf_counter()
        count = generate(data, services, points, uncatalogued)
        print(
            f"series                   {count}  ({data.stat().st_size / 1e6:.0f} MB OpenMetrics, "
            f"generated in {time.perf_counter() - started:.1f}s)"
        )
        started = time.perf_counter()
        with LocalPrometheus(openmetrics_file=data, workdir=Path(tmp) / "prom") as prometheus:
            data.unlink()
            print(f"backfill + start         {time.perf_counter() - started:.1f}s")
            for concurrency in args.concurrency:
                print(f"-- max_concurrency {concurrency}")
                if args.recognition:
                    asyncio.run(recognition_overhead(prometheus.url, args.runs, concurrency, points))
                else:
                    asyncio.run(
                        measure(prometheus.url, args.runs, args.verbose, concurrency, points, prometheus.pid)
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
