"""A step's evidence is read once Prometheus holds the step's last scrape, not before.

Prometheus stamps a sample with the instant its scrape started and stores it when the answer is
in. A service at its knee answers its scrape slowly (up to 350 ms measured on a busy host with the
feature service overloaded), so when a step ends its last sample, often the most loaded one, can
still be in flight. Here a real Prometheus scrapes, every 2 s, an exposition that answers 1.5 s late;
the step "ends" just after a scrape started, with the level it reads at its peak, and is evaluated
at once, as ``diagnose capacity`` does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from diagnoser.capacity.evidence import evaluate_step, step_window_s
from diagnoser.config import PrometheusSettings, Settings
from diagnoser.engine import DiagnosisConfig
from diagnoser.ruleset import load_rules
from diagnoser.sources import Sources
from diagnoser.sources.prometheus import PrometheusSource
from diagnoser.testing.prometheus import LocalPrometheus
from tests.fixtures.background_http import BackgroundHTTPServer

pytestmark = pytest.mark.integration

#: Far longer than evaluating the rule takes on a busy host, and within the scrape timeout.
ANSWER_DELAY_S = 1.5

RULE = """
cause: connection_pool_exhaustion
severity: critical
title: level at its peak
summary: "level {value:g}"
when:
  - promql: {query: "max_over_time(step_level[${window}])", op: ">=", threshold: 2}
"""


class SlowExposition:
    """``step_level <n>``, read when a scrape arrives and answered ``ANSWER_DELAY_S`` later."""

    def __init__(self) -> None:
        self.level = 0
        self.scraped = threading.Condition()
        self.arrivals: list[datetime] = []
        exposition = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                level = exposition.level
                with exposition.scraped:
                    exposition.arrivals.append(datetime.now(UTC))
                    exposition.scraped.notify_all()
                time.sleep(ANSWER_DELAY_S)
                body = f"# TYPE step_level gauge\nstep_level {level}\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = BackgroundHTTPServer(Handler, name="slow-exposition")

    def next_scrape(self, timeout: float = 10.0) -> datetime:
        """Block until the next scrape arrives; its arrival time."""
        with self.scraped:
            seen = len(self.arrivals)
            assert self.scraped.wait_for(lambda: len(self.arrivals) > seen, timeout), "no scrape"
            return self.arrivals[-1]


@pytest.fixture
def exposition() -> Iterator[SlowExposition]:
    server = SlowExposition()
    server.http.start()
    try:
        yield server
    finally:
        server.http.stop()


async def test_a_step_is_evaluated_with_its_last_scrape_in(exposition: SlowExposition, tmp_path: Path) -> None:
    (tmp_path / "step").mkdir()
    (tmp_path / "step" / "level-at-peak.yaml").write_text(RULE, encoding="utf-8")
    rules = load_rules([tmp_path], include_builtin=False)
    target = exposition.http.url.removeprefix("http://")
    with LocalPrometheus(scrape_targets=[target], scrape_interval="2s") as prometheus:
        source = PrometheusSource(PrometheusSettings(url=prometheus.url))
        try:
            exposition.next_scrape(timeout=20)  # Prometheus found the target
            exposition.level = 1
            started_at = exposition.next_scrape()
            exposition.next_scrape()
            # The load peaks in the step's last second: the scrape that reads it is its last.
            exposition.level = 2
            ended_at = exposition.next_scrape() + timedelta(seconds=0.05)
            exposition.level = 0  # the step is over: the next scrapes read no load
            settings = Settings(prometheus=PrometheusSettings(url=prometheus.url))
            diagnosis = await evaluate_step(
                rules, DiagnosisConfig.from_settings(settings), Sources(prometheus=source), started_at=started_at, ended_at=ended_at
            )
            # A 1 s window holds at most one scrape every 2 s: widened until it holds two.
            widened = await step_window_s(source, ended_at, 1)
        finally:
            await source.aclose()
    assert not diagnosis.errors, diagnosis.errors
    assert [f.rule_id for f in diagnosis.findings] == ["step/level-at-peak"], diagnosis.findings
    assert widened in (2, 4)
