"""``python -m diagnoser.testing.demo``: the main job on a laptop, no cluster needed.

Loads a bundled incident (``examples/checkout-incident.yaml``) into a real, local Prometheus
and runs ``diagnose now`` against it as of the incident, exactly as an on-call engineer would
run it against production: same command, same rules, same output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from diagnoser.testing.prometheus import LocalPrometheus
from diagnoser.testing.rules import backfill_text, parse_duration

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "checkout-incident.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    parser.add_argument("--at", default="35m", help="When, from the scenario's start, to diagnose.")
    parser.add_argument("--format", default="table", choices=["table", "json", "markdown"])
    parser.add_argument("--slo-p99-ms", default="250")
    args = parser.parse_args(argv)

    text, starts = backfill_text(args.scenario)
    instant = datetime.fromtimestamp(starts[0] + parse_duration(args.at), UTC)
    with LocalPrometheus(openmetrics=text) as prometheus:
        print(
            f"Prometheus {prometheus.url} loaded with {args.scenario.name}; "
            f"diagnosing as of {instant:%Y-%m-%dT%H:%M:%SZ}\n",
            file=sys.stderr,
            flush=True,
        )
        command = [
            sys.executable, "-m", "diagnoser", "now",
            "--prometheus-url", prometheus.url,
            "--at", instant.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "--slo-p99-ms", args.slo_p99_ms,
            "--format", args.format,
        ]  # fmt: skip
        print("$ diagnose " + " ".join(command[3:]) + "\n", file=sys.stderr, flush=True)
        return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    code = main()
    # Exit 1 means "findings at warning or above": for the demo that is the expected outcome.
    sys.exit(0 if code in (0, 1) else code)
