"""Memory and CPU of ``diagnose serve`` over a long run: does it leak, does it idle quietly?

Starts a prometheus-client app exposing a connection-pool incident (OpenTelemetry pool metrics,
every connection in use, requests waiting), a real Prometheus scraping it every second, the
Slack fixture server, and the daemon as a separate process with the whole shipped rule pack and
a 5 s diagnose interval. Every second it samples the daemon's RSS (``/proc/PID/status``) and
CPU time (``/proc/PID/stat``, and per thread ``/proc/PID/task/*/schedstat`` in nanoseconds for
the quiet seconds, where clock ticks are too coarse); the daemon's JSON log says when each
diagnosis ran. It prints:

* RSS after the warm-up, at the end, and the growth (goal: under 5 MB over 10 minutes);
* CPU % of one core over the whole run, per diagnosis, and *between runs* (the seconds in which
  no diagnosis was running; goal: under 2 %).

Usage: ``python bench/daemon.py [--minutes 10] [--interval 5] [--warmup 60]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnoser.testing.processes import free_port  # noqa: E402
from diagnoser.testing.prometheus import LocalPrometheus  # noqa: E402
from tests.fixtures.slack_server import SlackFixtureServer  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def incident_app() -> tuple[int, object]:
    """An app whose pool is exhausted: 10 of 10 connections used, 30 requests waiting."""
    registry = CollectorRegistry()
    labels = ["namespace", "pod", "db_client_connection_pool_name"]
    count = Gauge(
        "db_client_connection_count",
        "Connections.",
        [*labels, "db_client_connection_state"],
        registry=registry,
    )
    maximum = Gauge("db_client_connection_max", "Pool size.", labels, registry=registry)
    pending = Gauge("db_client_connection_pending_requests", "Waiting.", labels, registry=registry)
    base = {"namespace": "shop", "pod": "checkout-5d8c7-a", "db_client_connection_pool_name": "orders-db"}
    count.labels(**base, db_client_connection_state="used").set(10)
    count.labels(**base, db_client_connection_state="idle").set(0)
    maximum.labels(**base).set(10)
    pending.labels(**base).set(30)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    return port, server


def sample(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds user+system) of ``pid``."""
    rss_kb = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return rss_kb / 1024, cpu


def on_cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of the process' live threads (``schedstat``: finer than clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between listing and reading
    return total


def run_windows(log_path: Path) -> list[tuple[float, float]]:
    """(start, end) unix times of each diagnosis, from the daemon's JSON log."""
    windows = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("message") == "diagnosis done":
            end = datetime.fromisoformat(entry["time"]).timestamp()
            windows.append((end - float(entry["seconds"]), end))
    return windows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0, help="diagnose interval in seconds")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the RSS baseline")
    args = parser.parse_args()
    duration = args.minutes * 60
    warmup = min(args.warmup, duration / 3)

    # SIGTERM (a CI timeout) must still stop the servers and the daemon this script started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="diagnoser-bench-daemon-"))
    app_port, app_server = incident_app()
    slack = SlackFixtureServer().start()
    daemon_port = free_port()
    prometheus = LocalPrometheus(scrape_targets=[f"127.0.0.1:{app_port}"], scrape_interval="1s")
    prometheus.start()
    config = {
        "prometheus": {"url": prometheus.url},
        "slack": {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url,
                  "allowed_addresses": ["127.0.0.1"]},
        "daemon": {
            "diagnose_interval_s": args.interval,
            "jitter_s": 0,
            "listen": f"127.0.0.1:{daemon_port}",
            "state_path": str(work / "state.sqlite3"),
        },
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    log_path = work / "daemon.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "diagnoser",
                "serve",
                "--config",
                str(work / "config.yaml"),
                "--log-format",
                "json",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    samples: list[tuple[float, float, float, float]] = []  # (unix time, rss MB, cpu s, on-cpu s)
    started = time.time()
    print(
        f"daemon pid {process.pid}: {args.minutes:g} min, diagnose every {args.interval:g}s, "
        f"warm-up {warmup:g}s; log {log_path}",
        flush=True,
    )
    try:
        while time.time() - started < duration and process.poll() is None:
            rss, cpu = sample(process.pid)
            samples.append((time.time(), rss, cpu, on_cpu_ns(process.pid) / 1e9))
            if len(samples) % 60 == 0:
                print(f"  {time.time() - started:6.0f}s  rss {rss:7.2f} MB  cpu {cpu:7.2f} s", flush=True)
            time.sleep(1.0)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        prometheus.stop()
        slack.stop()
        app_server.shutdown()  # type: ignore[attr-defined]
    if process.returncode not in (0, None) and time.time() - started < duration:
        print(f"daemon exited early with {process.returncode}; see {log_path}")
        return 1

    windows = run_windows(log_path)
    after = [s for s in samples if s[0] - started >= warmup]
    if len(after) < 2:
        print("run too short for figures")
        return 1
    rss_warm, rss_end = after[0][1], after[-1][1]
    rss_peak = max(s[1] for s in after)
    wall = after[-1][0] - after[0][0]
    cpu_total = after[-1][2] - after[0][2]
    idle_wall = idle_cpu = 0.0
    for (t0, _, _, c0), (t1, _, _, c1) in itertools.pairwise(after):
        # A one-second slice counts as "between runs" when no diagnosis overlapped it.
        if not any(start < t1 + 0.05 and end > t0 - 0.05 for start, end in windows):
            idle_wall += t1 - t0
            idle_cpu += max(0.0, c1 - c0)
    runs_after = [w for w in windows if w[1] - started >= warmup]
    durations = sorted(end - start for start, end in runs_after)
    print()
    print(
        f"diagnoses: {len(windows)} in total, {len(runs_after)} after warm-up; "
        f"duration median {durations[len(durations) // 2] * 1000 if durations else 0:.0f} ms"
    )
    print(f"Slack messages: {len(slack.messages)}")
    print(f"RSS after warm-up: {rss_warm:.2f} MB; at the end: {rss_end:.2f} MB; peak {rss_peak:.2f} MB")
    print(f"RSS growth after warm-up: {rss_end - rss_warm:+.2f} MB (goal < 5 MB)")
    print(
        f"CPU over {wall:.0f}s after warm-up: {100 * cpu_total / wall:.2f} % of one core "
        f"({cpu_total / max(1, len(runs_after)):.3f} s per diagnosis)"
    )
    on_cpu_total = after[-1][3] - after[0][3]
    print(f"  (per-thread schedstat over the same window: {100 * on_cpu_total / wall:.2f} % of one core)")
    if idle_wall:
        print(
            f"CPU between runs: {100 * idle_cpu / idle_wall:.3f} % of one core over {idle_wall:.0f}s "
            f"(goal < 2 %)"
        )
    else:
        print("CPU between runs: no idle second (diagnoses take the whole interval)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
