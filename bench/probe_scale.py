"""Benchmark: the probe's rate per core with one and with N worker processes, beside wrk and hey.

Debian's nginx serves a 2-byte body from one worker process pinned to CPU 0 (scripts/setup.sh
installs it). Against it, for 1 and N workers (N: the usable cores), the probe is asked for a
rising rate; each line prints the achieved rate, schedule lag p99, latency p99, the CPU the
workers used (cores) and the sender's cost per request (us of CPU), hence the requests per
CPU-second: its rate per core. wrk (closed loop, 16 connections) and hey (16 workers, unpaced)
are run flat out for the same seconds and their requests per CPU-second printed below.

    .venv/bin/python bench/probe.py --scale                      # the whole table (about a minute)
    .venv/bin/python bench/probe_scale.py --rates 1000,3000 --duration 3

All traffic goes to 127.0.0.1; every run is bounded by its duration.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from diagnoser.config import ProbeSettings  # noqa: E402
from diagnoser.probe.entry import run_event_loop  # noqa: E402
from diagnoser.probe.result import ProbeResult  # noqa: E402
from diagnoser.probe.spec import spec_from_url  # noqa: E402
from diagnoser.probe.worker import WorkerLimits, usable_cores  # noqa: E402
from diagnoser.probe.workers import WorkerPool  # noqa: E402
from tests.fixtures.nginx_server import NginxServer  # noqa: E402


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe_line(url: str, workers: int, rate: float, duration: float, nginx_pid: int) -> str:
    spec = spec_from_url(url, rate=rate, duration_s=duration)

    async def main() -> tuple[ProbeResult, float]:
        pool = WorkerPool(workers, limits=WorkerLimits.allowing(spec.host))
        await pool.start()
        try:
            result = await pool.launch(spec, ProbeSettings(), explicit_target=True).result()
        finally:
            await pool.aclose()
        return result, sum(p.cpu_s for p in pool.last_parts)

    server_before = _cpu_of(nginx_pid)
    result, cpu_s = run_event_loop(main())
    server_cpu = _cpu_of(nginx_pid) - server_before
    sent, achieved = result.sent, result.achieved_rate
    lag, p99 = result.schedule_lag_ms.p99 or 0.0, result.latency_ms.p99 or 0.0
    elapsed = max(result.duration_s, 1e-9)
    per_request_us = cpu_s / sent * 1e6 if sent else float("nan")
    return (
        f"{workers:>7} {rate:>8.0f} {achieved:>9.0f} {achieved / rate:>6.1%} {lag:>8.2f} {p99:>8.2f} "
        f"{cpu_s / elapsed:>6.2f} {per_request_us:>8.0f} {sent / cpu_s if cpu_s else 0:>10.0f} "
        f"{server_cpu / elapsed:>6.2f}"
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tool_line(name: str, command: list[str], duration: float) -> str:
    if not shutil.which(command[0]):
        return f"{name:<16} not installed"
    if shutil.which("taskset"):
        command = ["taskset", "-c", "1", *command]
    before = _children_cpu()
    started = time.monotonic()
    out = subprocess.run(command, capture_output=True, text=True, timeout=duration + 30, check=False).stdout
    cpu = _children_cpu() - before
    elapsed = time.monotonic() - started
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if rps is None:
        return f"{name:<16} no figures: {out[-200:]!r}"
    rate = float(rps.group(1))
    per_cpu = rate * elapsed / cpu if cpu else 0.0
    return f"{name:<16} {rate:>9.0f} req/s  CPU {cpu / elapsed:.2f} cores  {per_cpu:>8.0f} req per CPU-second"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="1000,2000,3000,4000,6000")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--workers", default=None, help="worker counts to compare (default 1,N)")
    args = parser.parse_args(argv)
    cores = usable_cores()
    counts = [int(w) for w in args.workers.split(",")] if args.workers else sorted({1, cores})
    print(f"cpus usable: {cores}, load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    with NginxServer(rate_limit=1e6, cpu=0) as nginx:
        (nginx_pid,) = nginx.worker_pids()
        print("workers    asked  achieved   share  lag p99  lat p99  cores  us/req  req/CPU-s  nginx")
        for workers in counts:
            for rate in (float(r) for r in args.rates.split(",")):
                print(probe_line(nginx.url, workers, rate, args.duration, nginx_pid), flush=True)
        d, url = f"{args.duration:g}s", nginx.url
        for name, command in (
            ("wrk -t1 -c16", ["wrk", "-t1", "-c16", f"-d{d}", url]),
            ("hey -c16", ["hey", "-z", d, "-c", "16", url]),
            ("hey -c16 -q190", ["hey", "-z", d, "-c", "16", "-q", "190", url]),  # ~3,000 req/s paced
        ):
            print(tool_line(name, command, args.duration), flush=True)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
