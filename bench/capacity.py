"""Benchmark: ``diagnose capacity``'s search against a fixed-step sweep of the same range.

Starts the feature-service test bed (a real Redis, the service with a client pool of
``--pool`` connections each held ``--hold-ms`` per request, a real Prometheus scraping it at
1 s), runs ``diagnose capacity`` on it as a user would, then a fixed-step sweep of the same range
(``--steps start,start+inc,...`` up to the maximum, stopping at the first failing step as a
write-up's table does), and prints for each: the capacity found, its distance from the pool's
Little's-law limit (connections / mean hold measured by the service's own histogram), the
number of steps, the load time (seconds of load sent, the warm-up included) and the wall time.
The full sweep's load time (every step of the range) is printed too, computed from its step
count. Goal: the search finds the knee within 10 % of the limit in at most half the load time
of the fixed sweep.

    .venv/bin/python bench/capacity.py                        # about 4 minutes
    .venv/bin/python bench/capacity.py --step-s 5 --pool 4 --hold-ms 20 --max-rate 400
    .venv/bin/python bench/capacity.py --nginx                # a known limit of 3,000 req/s (nginx)

All traffic goes to 127.0.0.1; every run is bounded by its step count and step time. The
processes run at a raised priority when allowed (the pool's limit is what is measured, not the
host's other work).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from examples.feature_service.testbed import FeatureTestBed  # noqa: E402


def capacity(bed: FeatureTestBed, args: argparse.Namespace, *extra: str) -> tuple[dict[str, Any], float]:
    command = [
        sys.executable, "-m", "diagnoser", "capacity", bed.url, "--slo-p99-ms", str(args.slo_ms),
        "--step-s", str(args.step_s), "--max-rate", str(args.max_rate), "--warmup-s", str(args.warmup_s),
        "--prometheus-url", bed.prometheus_url, "--format", "json", *extra,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"diagnose capacity failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout), time.monotonic() - started


def summary(
    name: str, report: dict[str, Any], wall_s: float, limit: float, warmup_s: float
) -> dict[str, Any]:
    load_s = sum(step["duration_s"] for step in report["steps"]) + warmup_s
    found = report["capacity_rps"]
    error = None if found is None else (found - limit) / limit
    return {"run": name, "capacity": found, "error": error, "steps": len(report["steps"]), "load_s": load_s,
            "wall_s": wall_s, "bottleneck": (report["bottleneck"] or {}).get("cause")}  # fmt: skip


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'run':<28}{'capacity':>10}{'vs limit':>10}{'steps':>7}{'load s':>9}{'wall s':>9}  bottleneck")
    for row in rows:
        capacity_text = "-" if row["capacity"] is None else f"{row['capacity']:g}"
        error = "-" if row["error"] is None else f"{row['error']:+.1%}"
        wall = "-" if row["wall_s"] is None else f"{row['wall_s']:.0f}"
        figures = f"{capacity_text:>10}{error:>10}{row['steps']:>7}{row['load_s']:>9.0f}{wall:>9}"
        print(f"{row['run']:<28}{figures}  {row['bottleneck'] or '-'}")


def main() -> None:
    if "--nginx" in sys.argv:  # the knee of a fast server with a known rate limit
        sys.path.insert(0, str(REPO / "bench"))
        import capacity_nginx

        capacity_nginx.main([a for a in sys.argv[1:] if a != "--nginx"])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--hold-ms", type=float, default=20.0)
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--step-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--start-rate", type=float, default=50.0)
    parser.add_argument("--max-rate", type=float, default=400.0)
    parser.add_argument("--increment", type=float, default=20.0, help="fixed sweep step (req/s)")
    args = parser.parse_args()
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) - 10)
    increment = args.increment
    fixed = [
        round(args.start_rate + i * increment)
        for i in range(int((args.max_rate - args.start_rate) // increment) + 1)
    ]
    with FeatureTestBed(pool_size=args.pool, hold_ms=args.hold_ms) as bed:
        search, search_wall = capacity(bed, args, "--start-rate", str(args.start_rate))
        sweep, sweep_wall = capacity(bed, args, "--steps", ",".join(str(r) for r in fixed))
        limit = bed.littles_law_limit()
        hold_ms = bed.mean_hold_s() * 1000
    print(f"test bed: pool {args.pool}, hold {args.hold_ms:g} ms configured, {hold_ms:.1f} ms measured "
          f"(Redis round trips and event-loop wake-ups included)")  # fmt: skip
    print(f"Little's-law limit: {args.pool} / {hold_ms / 1000:.4f} s = {limit:.0f} req/s "
          f"(configured hold: {args.pool / args.hold_ms * 1000:.0f} req/s); SLO p99 {args.slo_ms:g} ms; "
          f"steps of {args.step_s:g} s, {args.start_rate:g}..{args.max_rate:g} req/s\n")  # fmt: skip
    rows = [
        summary("search", search, search_wall, limit, args.warmup_s),
        summary("fixed sweep, to 1st failure", sweep, sweep_wall, limit, args.warmup_s),
    ]
    full = {**rows[1], "run": f"fixed sweep, all {len(fixed)} steps", "steps": len(fixed),
            "load_s": len(fixed) * args.step_s + args.warmup_s, "wall_s": None}  # fmt: skip
    print_table([*rows, full])
    marks = [("" if s["held"] else " x") + ("" if s["counted"] else " (run again)") for s in search["steps"]]
    steps = search["steps"]
    cells = [f"{s['rate']:g}: {s['latency_ms']['p99']}{m}" for s, m in zip(steps, marks, strict=True)]
    print("\nsearch steps (rate: p99 ms; x did not hold):", ", ".join(cells))
    ratio = rows[0]["load_s"] / rows[1]["load_s"]
    print(
        f"\nsearch load time / fixed sweep to first failure: {ratio:.2f}; "
        f"/ full sweep: {rows[0]['load_s'] / full['load_s']:.2f}"
    )


if __name__ == "__main__":
    main()
