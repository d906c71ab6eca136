"""Benchmark: ``diagnose capacity`` finds a known rate limit of thousands of req/s.

Debian's nginx (one worker process pinned to CPU 0) serves ``/limited`` under ``limit_req``
at ``--limit`` req/s with a burst of ``--burst-s`` seconds of it (nodelay, 503 above): a fast
server whose knee is known exactly. ``diagnose capacity`` runs on it as a user would (its
default workers: one per usable core, no more than the rate needs), and the capacity it finds
is printed beside the limit, with every step and the machine's load average.

    .venv/bin/python bench/capacity.py --nginx                    # limit 3,000 req/s, ~2 minutes
    .venv/bin/python bench/capacity_nginx.py --limit 5000 --max-rate 10000 --step-s 5

The burst lets the limiter absorb the sender's own jitter (a host stall delays a few ms of
requests, which then leave together): without it, nginx counts a burst after a 10 ms stall as
over the rate, and the knee found is the host's scheduling, not the limit.
All traffic goes to 127.0.0.1; every run is bounded by its step count and step time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.nginx_server import NginxServer  # noqa: E402


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=3000.0, help="nginx limit_req rate (req/s)")
    parser.add_argument("--burst-s", type=float, default=0.1, help="limit_req burst, in seconds of the rate")
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--max-rate", type=float, default=8000.0)
    parser.add_argument("--step-s", type=float, default=6.0)
    parser.add_argument("--workers", type=int, default=None, help="default: the command's own default")
    args = parser.parse_args(argv)
    burst = max(1, round(args.limit * args.burst_s))
    print(f"cpus: {os.cpu_count()}, load average before: {_load()}")
    with NginxServer(rate_limit=args.limit, burst=burst, cpu=0) as nginx:
        command = [sys.executable, "-m", "diagnoser", "capacity", nginx.limited_url, "--slo-p99-ms",
                   str(args.slo_ms), "--max-rate", str(args.max_rate), "--step-s", str(args.step_s),
                   "--format", "json"]  # fmt: skip
        if args.workers:
            command += ["--workers", str(args.workers)]
        started = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
        wall = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"diagnose capacity failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    print(f"nginx limit_req {args.limit:g} req/s, burst {burst}; SLO p99 {args.slo_ms:g} ms, "
          f"errors <= 0.1 %; steps of {args.step_s:g} s up to {args.max_rate:g} req/s\n")  # fmt: skip
    print(f"{'rate':>8} {'achieved':>9} {'p99 ms':>8} {'errors':>8}  verdict")
    for step in report["steps"]:
        verdict = "held" if step["held"] else f"failed ({step['failed_on']})"
        verdict += "" if step["counted"] else ", run again"
        print(f"{step['rate']:>8g} {step['achieved_rate']:>9.0f} {step['latency_ms']['p99'] or 0:>8.2f} "
              f"{step['error_ratio']:>8.2%}  {verdict}")  # fmt: skip
    found = report["capacity_rps"]
    error = "-" if found is None else f"{(found - args.limit) / args.limit:+.1%}"
    print(f"\ncapacity found: {found} req/s (limit: {report['limit']}), {error} from the configured "
          f"{args.limit:g}; {len(report['steps'])} steps in {wall:.0f} s")  # fmt: skip
    print(f"load average after: {_load()}")


if __name__ == "__main__":
    main()
