"""A big estate: many families no catalogue entry names, beside one exhausted connection pool.

Backfills a Prometheus with ``--families`` uncatalogued families (gauges and counters under names
of their own, a tenth of them paired as ``x`` and ``x_limit`` so recognition by shape has pairs to
weigh) and the recorded SQLAlchemy pool at its limit (``tests/fixtures/expositions/sqlalchemy-otel``),
then runs the real ``diagnose now`` at the incident and prints, per run: the wall time, the exit
code, whether the pool was reported, the findings at warning or above, and how many queries were
sent (from the server's own ``prometheus_engine_query_duration_seconds_count``), and, from a
recording proxy on 127.0.0.1 between ``diagnose`` and the server, the HTTP requests by method and
the longest URL (request target) sent. ``--deadline`` takes several values (``30,10``).

Usage: ``python bench/big_estate.py [--families 20000] [--pair-every 10] [--deadline 30,10]``.
Everything on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diagnoser.testing.prometheus import LocalPrometheus  # noqa: E402
from tests.fixtures.background_http import BackgroundHTTPServer  # noqa: E402
from tests.fixtures.big_estate import AT, estate_openmetrics  # noqa: E402


def queries_sent(url: str) -> float:
    """Queries the server has evaluated so far (its own ``/metrics``, not its TSDB)."""
    with urllib.request.urlopen(f"{url}/metrics") as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith('prometheus_engine_query_duration_seconds_count{slice="inner_eval"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Recorder:
    """A forwarding proxy to ``upstream`` that notes each request's method and target length."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.methods: Counter[str] = Counter()
        self.longest = 0
        self._lock = threading.Lock()
        recorder = self

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with recorder._lock:
                    recorder.methods[self.command] += 1
                    recorder.longest = max(recorder.longest, len(self.path))
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                request = urllib.request.Request(
                    recorder.upstream + self.path, data=body, method=self.command, headers=headers
                )
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, data, kind = answer.status, answer.read(), answer.headers.get("Content-Type")
                except urllib.error.HTTPError as exc:
                    status, data, kind = exc.code, exc.read(), exc.headers.get("Content-Type")
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = _forward
            do_POST = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = BackgroundHTTPServer(Forward, name="recording-proxy")

    def reset(self) -> None:
        with self._lock:
            self.methods.clear()
            self.longest = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=20_000)
    parser.add_argument("--deadline", default="30", help="seconds, or several: 30,10")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--pair-every", type=int, default=10, help="every Nth family gets an x_limit")
    args = parser.parse_args()
    if not (0 < args.families <= 50_000 and args.pair_every > 0 and args.runs > 0):
        parser.error("--families must be in (0, 50000], --pair-every and --runs positive")
    text = estate_openmetrics(args.families, pair_every=args.pair_every)
    at = AT
    began = time.monotonic()
    deadlines = [float(d) for d in args.deadline.split(",")]
    with LocalPrometheus(openmetrics=text) as prometheus:
        print(f"{args.families} uncatalogued families backfilled in {time.monotonic() - began:.0f} s")
        diagnose = str(Path(sys.executable).with_name("diagnose"))
        proxy = Recorder(prometheus.url)
        proxy.http.start()
        for run, deadline in enumerate(d for d in deadlines for _ in range(args.runs)):
            proxy.reset()
            before = queries_sent(prometheus.url)
            began = time.monotonic()
            done = subprocess.run(
                [diagnose, "now", "--prometheus-url", proxy.http.url, "--at", str(at),
                 "--deadline", f"{deadline:g}", "--format", "json"],
                capture_output=True, text=True, check=False,
            )
            wall = time.monotonic() - began
            sent = queries_sent(prometheus.url) - before
            traceback = "Traceback" in done.stderr
            try:
                report = json.loads(done.stdout)
            except ValueError:
                print(f"run {run + 1}: exit {done.returncode}, no report; stderr: {done.stderr[-500:]}")
                continue
            found = [f for f in report["findings"] if f["severity"] in ("warning", "critical")]
            pool_found = any(f["cause"] == "connection_pool_exhaustion" for f in found)
            print(
                f"run {run + 1}: {wall:.1f} s (deadline {deadline:g} s), exit {done.returncode}, "
                f"pool reported: {pool_found}, traceback: {traceback}, ~{sent:.0f} queries evaluated, "
                f"requests {dict(proxy.methods)}, longest URL {proxy.longest} characters, "
                f"findings: {sorted({f['cause'] for f in found})}"
            )
            for error in report.get("errors", [])[:3]:
                print(f"  error: {str(error)[:300]}")
        proxy.http.stop()


if __name__ == "__main__":
    main()
