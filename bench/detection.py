"""Onset to first post, and fix to resolution, with the daemon's default timing.

A live SQLAlchemy service (a real pool of 5, OpenTelemetry metrics) runs at about 20 % of its
pool, then its pool goes to 100 % over 30 s (clients added one by one) and stays there; a real
Prometheus scrapes it every 15 s; ``diagnose serve`` runs with the shipped rule pack and its
default ``confirm_window`` (2m), ``pending_for`` and ``resolve_after``, diagnosing every
``--interval`` seconds; the Slack fixture records what is posted. Then the fix: back to 20 %.
It prints, in seconds:

* onset (the ramp's start, and the moment the pool is full) to the first post about the pool,
  against one confirmation window plus two intervals;
* fix to the incident's resolution, against 150 s.

``--checkout DIR`` runs the daemon of another checkout (``/work/main``: the figures before a
change). Every run is bounded (``--max-s`` per phase). ::

    python bench/detection.py [--interval 10] [--checkout DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnoser.testing.processes import free_port, stop_process  # noqa: E402
from diagnoser.testing.prometheus import LocalPrometheus  # noqa: E402
from tests.fixtures.pool_services.launch import pool_service  # noqa: E402
from tests.fixtures.slack_server import SlackFixtureServer  # noqa: E402

CONFIRM_S = 120.0
SCRAPE = "15s"
RESOLVE_GOAL_S = 150.0


class Clients:
    """Client threads requesting ``url`` back to back, added and removed while it runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._stops: list[threading.Event] = []

    def add(self, pause_s: float) -> None:
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                with contextlib.suppress(urllib.error.URLError, OSError):
                    urllib.request.urlopen(self.url, timeout=10).close()
                stop.wait(pause_s)

        threading.Thread(target=client, daemon=True).start()
        self._stops.append(stop)

    def remove_all(self) -> None:
        for stop in self._stops:
            stop.set()
        self._stops.clear()


@contextlib.contextmanager
def daemon(config: Path, checkout: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    env["PYTHONPATH"] = str(checkout)
    process = subprocess.Popen(
        [sys.executable, "-m", "diagnoser", "serve", "--config", str(config)],
        cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        yield process
    finally:
        stop_process(process)


def wait(condition: object, bound_s: float) -> float | None:
    """Seconds until ``condition()`` holds (polled every 0.5 s), ``None`` after ``bound_s``."""
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        if condition():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(0.5)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=10.0, help="daemon.diagnose_interval_s")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="whose daemon runs")
    parser.add_argument("--max-s", type=float, default=420.0, help="bound of each wait")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-detection-"))
    with (
        pool_service("sqlalchemy_orders.py", "--pool-size", "5") as service,
        LocalPrometheus(
            scrape_targets=[service.removeprefix("http://")], scrape_interval=SCRAPE
        ) as prometheus,
        SlackFixtureServer() as slack,
    ):
        config = workdir / "config.yaml"
        config.write_text(json.dumps({
            "prometheus": {"url": prometheus.url},
            "slo": {"p99_ms": 500},
            "slack": {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url,
                      "allowed_addresses": ["127.0.0.1"]},
            "daemon": {"diagnose_interval_s": args.interval, "listen": f"127.0.0.1:{free_port()}",
                       "state_path": str(workdir / "state.sqlite3")},
        }), encoding="utf-8")  # fmt: skip
        clients = Clients(f"{service}/orders?hold_s=0.1")
        heavy = Clients(f"{service}/orders?hold_s=0.6")
        with daemon(config, args.checkout):
            clients.add(0.3)  # about 20 % of the pool
            time.sleep(90)  # a lead-in of six scrapes at 20 %
            assert not pool_posts(slack), "posted before the onset"
            onset = time.monotonic()
            for _ in range(20):  # 20 % to 100 % (and requests waiting) over 30 s
                heavy.add(0.0)
                time.sleep(1.5)
            full = time.monotonic()
            posted = wait(lambda: bool(pool_posts(slack)), args.max_s)
            time.sleep(30)
            heavy.remove_all()
            resolved = wait(lambda: any(m.text.startswith("Resolved") and "connection_pool" in m.text
                                        for m in slack.messages), args.max_s)  # fmt: skip
            clients.remove_all()
    bound = CONFIRM_S + 2 * args.interval
    print(f"checkout: {args.checkout}  interval: {args.interval:g} s  scrape: {SCRAPE}  confirm_window: 2m")
    if posted is None:
        print(f"onset to first post: none within {args.max_s:g} s")
    else:
        ramp = full - onset + posted
        print(f"onset to first post: {ramp:.0f} s from the ramp's start, {posted:.0f} s from the pool full"
              f" (goal <= {bound:.0f} s: {'met' if ramp <= bound else 'missed'})")
    if resolved is None:
        print(f"fix to resolution: none within {args.max_s:g} s")
    else:
        print(f"fix to resolution: {resolved:.0f} s (goal <= {RESOLVE_GOAL_S:.0f} s:"
              f" {'met' if resolved <= RESOLVE_GOAL_S else 'missed'})")  # fmt: skip
    top = [m for m in slack.messages if m.thread_ts is None and m.via == "api"]
    replies = len(slack.messages) - len(top)
    print(f"slack: {len(top)} top-level, {replies} replies, {len(slack.updates)} edits")
    for message in top:
        print(f"  top-level: {message.text[:110]}")
    return 0


def pool_posts(slack: SlackFixtureServer) -> list[str]:
    return [m.text for m in slack.messages if "connection_pool_exhaustion" in m.text]


if __name__ == "__main__":
    sys.exit(main())
