"""Each step of ``diagnose capacity`` goes through the pipeline of ``diagnose now``: a silenced
cause is never named the bottleneck, and the deadline bounds a step's evaluation.

A real Prometheus holds a backfilled gauge at its peak; for the deadline, a proxy in front of it
holds back the rule's query (Prometheus' own answers, late), as a Prometheus under load does.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from diagnoser.capacity.bottleneck import EvaluatedStep, find_bottleneck
from diagnoser.capacity.evidence import evaluate_step
from diagnoser.config import PrometheusSettings, Settings, Silence
from diagnoser.engine import DiagnosisConfig
from diagnoser.ruleset import RuleSet, load_rules
from diagnoser.sources import Sources
from diagnoser.sources.prometheus import PrometheusSource
from diagnoser.testing.prometheus import LocalPrometheus
from tests.fixtures.background_http import BackgroundHTTPServer

pytestmark = pytest.mark.integration

END = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
RULE = """
cause: connection_pool_exhaustion
severity: critical
title: pool at its limit
summary: "level {value:g}"
when:
  - promql: {query: "max_over_time(step_level[${window}])", op: ">=", threshold: 2}
"""


def _openmetrics() -> str:
    end = int(END.timestamp())
    lines = ["# TYPE step_level gauge"]
    lines += [
        f'step_level{{job="checkout"}} {3 if t > end - 120 else 1} {t}' for t in range(end - 3600, end + 1, 15)
    ]
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def prometheus() -> Iterator[LocalPrometheus]:
    with LocalPrometheus(openmetrics=_openmetrics()) as prom:
        yield prom


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "at-limit.yaml").write_text(RULE, encoding="utf-8")
    return load_rules([tmp_path], include_builtin=False)


async def _step(rules: RuleSet, settings: Settings, url: str):  # type: ignore[no-untyped-def]
    source = PrometheusSource(PrometheusSettings(url=url, query_timeout_s=10))
    try:
        return await evaluate_step(
            rules, DiagnosisConfig.from_settings(settings), Sources(prometheus=source), started_at=END - timedelta(seconds=60), ended_at=END
        )
    finally:
        await source.aclose()


async def test_a_silenced_cause_is_never_the_bottleneck(rules: RuleSet, prometheus: LocalPrometheus) -> None:
    settings = Settings(prometheus=PrometheusSettings(url=prometheus.url))
    loud = await _step(rules, settings, prometheus.url)
    assert [f.rule_id for f in loud.findings] == ["pool/at-limit"]
    held = EvaluatedStep(100, True, None, [])
    bottleneck, _ = find_bottleneck([held, EvaluatedStep(200, False, "latency", loud.findings)])
    assert bottleneck is not None and bottleneck.cause == "connection_pool_exhaustion"

    # Silenced until after the step's end (the step's instant is the clock silences follow).
    silence = Silence(matchers={"cause": "connection_pool_exhaustion"}, until=END + timedelta(hours=1),
                      comment="pool resize scheduled")
    quiet = await _step(rules, settings.model_copy(update={"silences": [silence]}), prometheus.url)
    assert [f.rule_id for f in quiet.findings if f.rule_id == "pool/at-limit"] == []
    assert quiet.coverage is not None
    assert [s.rule_id for s in quiet.coverage.silenced] == ["pool/at-limit"]
    bottleneck, _ = find_bottleneck([held, EvaluatedStep(200, False, "latency", quiet.findings)])
    assert bottleneck is None


class _LateProxy:
    """Forwards to Prometheus; a query naming ``step_level`` is answered ``delay_s`` late."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                if "step_level" in self.path or (body and b"step_level" in body):
                    time.sleep(delay_s)
                request = urllib.request.Request(upstream + self.path, data=body, method=self.command)
                if body:
                    request.add_header("Content-Type", self.headers.get("Content-Type", ""))
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        data, status = answer.read(), answer.status
                        kind = answer.headers.get("Content-Type", "application/json")
                except OSError:
                    return
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up: the deadline
                    pass

            do_GET = _forward
            do_POST = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = BackgroundHTTPServer(Handler, name="late-prometheus")


async def test_a_step_evaluation_ends_at_the_deadline(rules: RuleSet, prometheus: LocalPrometheus) -> None:
    proxy = _LateProxy(prometheus.url, delay_s=4.0)
    proxy.http.start()
    try:
        url = proxy.http.url
        settings = Settings(prometheus=PrometheusSettings(url=url), deadline_s=1.0)
        started = time.monotonic()
        diagnosis = await _step(rules, settings, url)
        took = time.monotonic() - started
    finally:
        proxy.http.stop()
    assert took < 3.0, took  # the rule's query alone would take 4 s
    assert [e.message for e in diagnosis.errors] == ["no answer before the diagnosis deadline"]
    assert [f.rule_id for f in diagnosis.findings if f.rule_id == "pool/at-limit"] == []
    assert diagnosis.coverage is not None
