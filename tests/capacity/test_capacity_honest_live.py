"""Honest steps against real servers on 127.0.0.1 (the delay server, in its own process).

- ``/serial?ms=10`` answers one request at a time (100 req/s at most): a step above that piles
  up a backlog, reported as unsustainable, while a step well below it holds;
- ``/limited?rps=100`` is a token bucket answering 503 above 100 req/s: the knee reads "the server
  sheds load at ~100 req/s";
- an event loop blocked longer and longer (the sender's CPU growing short) leaves the sender
  further and further behind its schedule.

Each runs a few seconds of bounded load; the assertions are on facts a busy host does not
change (a backlog of dozens, a rate within 30 %).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from diagnoser.capacity.report import Limit
from diagnoser.capacity.run import CapacityInputs, CapacityOptions, CapacityRun
from diagnoser.capacity.step import StepPlan, run_step
from diagnoser.config import CapacitySettings, ProbeSettings
from diagnoser.probe import build_spec
from diagnoser.probe.caps import capacity_caps
from diagnoser.probe.entry import run_event_loop
from diagnoser.probe.running import InProcess
from tests.conftest import load_heavy, run_cli_here
from tests.probe.conftest import DelayServer
from tests.probe.conftest import delay_server as delay_server  # the fixture, shared

pytestmark = [pytest.mark.integration, load_heavy]

LIMIT_RPS = 100


def test_a_step_above_a_serial_servers_rate_is_an_unsustainable_backlog(delay_server: DelayServer) -> None:
    spec, _ = build_spec(delay_server.url + "/serial?ms=10", rate=1, duration_s=3)
    # A generous SLO: the step below the limit must hold on a busy host too (the verdict above it
    # is its backlog, whatever its p99).
    plan = StepPlan(spec=spec, explicit_target=True, step_s=3, min_step_s=3, slo_p99_ms=1000, max_error_ratio=0.01)
    options = CapacityOptions(start_rate=40, max_rate=140, fixed_steps=[40, 140], pause_s=0.2, warmup_s=0)
    report = run_event_loop(CapacityRun(plan, CapacityInputs(), options).run())
    low, high = report.steps
    assert low.held and low.unsustainable is None, low  # 40 % busy: steady
    assert not high.held and high.failed_on == "latency"
    # 140 sent a second, at most 100 answered: about 40 more in flight every second.
    assert high.unsustainable is not None and high.unsustainable.cause == "backlog", high
    assert high.unsustainable.in_flight is not None and high.unsustainable.in_flight >= 40
    assert report.capacity_rps == 40 and report.limit is Limit.latency
    assert not any("fell behind its schedule" in note for note in report.notes)


def test_a_rate_limiter_reads_as_the_server_shedding_load_at_its_rate(delay_server: DelayServer, tmp_path: Path) -> None:
    # Half the requests at 200 req/s are refused: the probe's own abort rule (at 50 % by default)
    # would cut the step at a random instant; the step's own verdict stops it at 3 s instead.
    config = tmp_path / "diagnoser.yaml"
    config.write_text("probe:\n  abort_error_ratio: 1.0\n", encoding="utf-8")
    # A generous SLO and error ratio: the step at half the limit holds on a busy host too (a stall
    # of the sender sends a burst, of which the bucket may refuse a few).
    result = run_cli_here("capacity", f"{delay_server.url}/limited?rps={LIMIT_RPS}", "--slo-p99-ms", "1000",
                          "--slo-error-ratio", "0.05", "--steps", "50,200", "--step-s", "3", "--warmup-s", "0",
                          "--pause-s", "0.2", "--config", str(config), "--format", "json")  # fmt: skip
    report = json.loads(result.stdout)
    assert result.code == 1, result.stdout
    assert report["limit"] == "errors" and report["capacity_rps"] == 50
    bottleneck = report["bottleneck"]
    assert bottleneck is not None and bottleneck["kind"] == "load_shedding", report
    assert bottleneck["rule_id"] is None and bottleneck["first_seen_at_rate"] == 200
    ok_rate = bottleneck["evidence"][0]["value"]
    assert abs(ok_rate - LIMIT_RPS) <= 0.3 * LIMIT_RPS, bottleneck
    assert bottleneck["summary"].startswith(f"the server sheds load at ~{ok_rate:g} req/s")
    assert not any("fell behind its schedule" in note for note in report["notes"])


def test_a_sender_whose_loop_falls_behind_is_an_unsustainable_schedule(delay_server: DelayServer) -> None:
    spec, _ = build_spec(delay_server.url + "/delay?ms=1", rate=1, duration_s=3)
    plan = StepPlan(spec=spec, explicit_target=True, step_s=3, min_step_s=3, slo_p99_ms=5000, max_error_ratio=0.01)

    async def main() -> object:
        loop = asyncio.get_running_loop()
        started = loop.time()

        def hog() -> None:
            # The loop blocked longer and longer, as a sender short of CPU; sleeping, so it
            # takes no core from the server.
            time.sleep(min(0.3, 0.1 * (loop.time() - started)))
            loop.call_later(0.05, hog)

        loop.call_soon(hog)
        return await run_step(plan, ProbeSettings(), 100, launcher=InProcess(),
                              caps=capacity_caps(CapacitySettings()), on_start=lambda _run: None)  # fmt: skip

    step = run_event_loop(main())
    verdict = step.unsustainable  # type: ignore[attr-defined]
    assert verdict is not None and verdict.cause == "schedule", verdict
    assert verdict.behind_s is not None and verdict.behind_s >= 0.15
    assert step.failed_on == "latency"  # type: ignore[attr-defined]
