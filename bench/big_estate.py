"""A big estate: many families no catalogue entry names, beside one exhausted connection pool.

Backfills a Prometheus with ``--families`` uncatalogued families (gauges and counters under names
of their own, a tenth of them paired as ``x`` and ``x_limit`` so recognition by shape has pairs to
weigh) and the recorded SQLAlchemy pool at its limit (``tests/fixtures/expositions/sqlalchemy-otel``),
then runs the real ``diagnose now`` at the incident and prints, per run: the wall time, the exit
code, whether the pool was reported, the findings at warning or above, and how many queries were
sent (from the server's own ``prometheus_engine_query_duration_seconds_count``).

Usage: ``python bench/big_estate.py [--families 20000] [--deadline 30]``. Everything on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diagnoser.testing.prometheus import LocalPrometheus  # noqa: E402
from tests.fixtures.expositions.timeline import incident_openmetrics  # noqa: E402

START = 1_795_802_400
INTERVAL = 15
LEAD_IN = 600
INCIDENT = 600


def estate(families: int) -> str:
    """OpenMetrics for ``families`` uncatalogued families over the lead-in and the incident."""
    out: list[str] = []
    steps = (LEAD_IN + INCIDENT) // INTERVAL + 1
    for i in range(families):
        name = f"estate_component_{i:05d}_value"
        labels = f'job="estate",instance="10.1.{i // 250}.{i % 250}:9100"'
        for step in range(steps):
            out.append(f"{name}{{{labels}}} {i % 7 + step % 3} {START + step * INTERVAL}\n")
        if i % 10 == 0:
            for step in range(steps):
                out.append(f"{name}_limit{{{labels}}} 100 {START + step * INTERVAL}\n")
    return "".join(out)


def queries_sent(url: str) -> float:
    """Queries the server has evaluated so far (its own ``/metrics``, not its TSDB)."""
    with urllib.request.urlopen(f"{url}/metrics") as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith('prometheus_engine_query_duration_seconds_count{slice="inner_eval"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=20_000)
    parser.add_argument("--deadline", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    pool = incident_openmetrics(
        "sqlalchemy-otel", start_s=START, lead_in_s=LEAD_IN, incident_s=INCIDENT, interval_s=INTERVAL,
        scrape_labels={"job": "checkout", "instance": "127.0.0.1:8000"},
    ).removesuffix("# EOF\n")
    text = pool + estate(args.families) + "# EOF\n"
    at = START + LEAD_IN + INCIDENT - 60
    began = time.monotonic()
    with LocalPrometheus(openmetrics=text) as prometheus:
        print(f"{args.families} uncatalogued families backfilled in {time.monotonic() - began:.0f} s")
        diagnose = str(Path(sys.executable).with_name("diagnose"))
        for run in range(args.runs):
            before = queries_sent(prometheus.url)
            began = time.monotonic()
            done = subprocess.run(
                [diagnose, "now", "--prometheus-url", prometheus.url, "--at", str(at),
                 "--deadline", f"{args.deadline:g}", "--format", "json"],
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
                f"run {run + 1}: {wall:.1f} s (deadline {args.deadline:g} s), exit {done.returncode}, "
                f"pool reported: {pool_found}, traceback: {traceback}, ~{sent:.0f} queries evaluated, "
                f"findings: {sorted({f['cause'] for f in found})}"
            )
            for error in report.get("errors", [])[:3]:
                print(f"  error: {str(error)[:300]}")


if __name__ == "__main__":
    main()
