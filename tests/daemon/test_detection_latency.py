"""Detection latency: a pool that fills up gradually is posted to Slack soon after, not after the
whole averaging window.

Rules confirm a problem over ``confirm_window`` and keep ``window`` for the evidence. A live
SQLAlchemy service (real pool of 5, OpenTelemetry instrumentation) runs at about 20 % of its pool,
then is driven past it; a real Prometheus scrapes it at 1 s and the real daemon diagnoses every
2 s with the default 5 m window and a 10 s confirmation window. The first Slack post must arrive
within two diagnose intervals plus the confirmation window, plus the incident's ``pending_for``
(by default one more confirmation window), plus scrape and delivery slack, of the onset: with
conditions averaged over the 5 m window it would take minutes.

On a quiet machine the post came within that (about 19 s, measured before pending_for); the bound
allows a busy machine its slower service, scrapes and daemon (a live service at 20 concurrent
clients on two shared cores), and still tells the confirmation window from the 5 m one by a factor
of four.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from diagnoser.testing.processes import free_port
from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import live_bed
from tests.fixtures.pool_services.launch import clients, pool_service
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = [pytest.mark.integration, live_bed]

INTERVAL_S = 2.0
CONFIRM_S = 10.0
#: An incident's first message waits ``daemon.pending_for_s``: by default one confirmation window.
PENDING_S = CONFIRM_S
#: A scrape, one exporter refresh and delivery's first attempt.
SLACK_S = 5.0
#: What a busy machine may add; a fifth of the 5 m window that averaging would have to fill.
BUSY_S = 40.0



def test_a_pool_filling_up_is_posted_within_two_intervals_plus_the_confirmation_window(tmp_path: Path) -> None:
    with (
        pool_service("sqlalchemy_orders.py", "--pool-size", "5") as service,
        LocalPrometheus(scrape_targets=[service.removeprefix("http://")], scrape_interval="1s") as prometheus,
        SlackFixtureServer() as slack,
    ):
        config = tmp_path / "config.yaml"
        config.write_text(
            json.dumps(
                {
                    "prometheus": {"url": prometheus.url},
                    "slo": {"p99_ms": 500},
                    "confirm_window": f"{CONFIRM_S:g}s",
                    "slack": {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url,
                              "allowed_addresses": ["127.0.0.1"]},
                    "daemon": {
                        "diagnose_interval_s": INTERVAL_S,
                        "jitter_s": 0,
                        "listen": f"127.0.0.1:{free_port()}",
                        "state_path": str(tmp_path / "state.sqlite3"),
                    },
                }
            ),
            encoding="utf-8",
        )
        _wait_for_samples(prometheus.url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
        daemon = subprocess.Popen(
            [sys.executable, "-m", "diagnoser", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            # About 20 % of the pool for a while: one request at a time, 0.1 s each.
            with clients(f"{service}/orders?hold_s=0.1", 1, 0.3):
                time.sleep(20)
            assert _pool_posts(slack) == []
            onset = time.monotonic()
            with clients(f"{service}/orders?hold_s=0.6", 20, 0.0):
                deadline = onset + 2 * INTERVAL_S + CONFIRM_S + PENDING_S + SLACK_S + BUSY_S + 10
                while not _pool_posts(slack) and time.monotonic() < deadline:
                    time.sleep(0.2)
                posted_after = time.monotonic() - onset
        finally:
            daemon.terminate()
            daemon.wait(timeout=20)
    assert _pool_posts(slack), [m.text for m in slack.messages]
    assert posted_after <= 2 * INTERVAL_S + CONFIRM_S + PENDING_S + SLACK_S + BUSY_S, posted_after


def _wait_for_samples(url: str, timeout_s: float = 30.0) -> None:
    query = "up == 1"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(query)}", timeout=5) as r:
            if json.load(r)["data"]["result"]:
                return
        time.sleep(0.5)
    raise TimeoutError("Prometheus has no samples of the service")


def _pool_posts(slack: SlackFixtureServer) -> list[str]:
    return [m.text for m in slack.messages if "connection_pool_exhaustion" in m.text]
