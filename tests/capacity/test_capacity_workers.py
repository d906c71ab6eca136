"""``diagnose capacity`` over worker processes: a worker that dies fails its step, clearly.

A couple of seconds of light load against the delay server through two real worker processes;
one is killed mid-step. The step must not count (no capacity from a silently lower rate), no
step may follow, and the report must say which worker died and how.
"""

from __future__ import annotations

import asyncio
import os
import signal

from diagnoser.capacity.report import CapacityReport, Limit
from diagnoser.capacity.run import CapacityInputs, CapacityOptions, CapacityRun
from diagnoser.capacity.step import StepPlan
from diagnoser.probe import build_spec
from diagnoser.probe.entry import run_event_loop
from diagnoser.probe.worker import WorkerLimits
from diagnoser.probe.workers import WorkerPool
from tests.probe.conftest import DelayServer
from tests.probe.conftest import delay_server as delay_server  # the fixture, shared


def test_a_worker_killed_during_a_step_fails_that_step_clearly(delay_server: DelayServer) -> None:
    spec, _ = build_spec(delay_server.url + "/delay?ms=1", rate=1, duration_s=4)
    plan = StepPlan(spec=spec, explicit_target=True, step_s=4, min_step_s=3, slo_p99_ms=500, max_error_ratio=0.01)
    options = CapacityOptions(start_rate=100, max_rate=200, fixed_steps=[100, 200], pause_s=0, warmup_s=0)

    async def main() -> tuple[CapacityReport, str | None]:
        pool = WorkerPool(2, limits=WorkerLimits.allowing("127.0.0.1"))
        await pool.start()
        try:
            run = CapacityRun(plan, CapacityInputs(), options, launcher=pool)
            task = asyncio.get_running_loop().create_task(run.run())
            await asyncio.sleep(1.5)
            victim = pool.members()[0].pid
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            return await task, pool.broken
        finally:
            await pool.aclose()

    report, broken = run_event_loop(main())
    assert broken is not None and "worker 0" in broken
    assert report.limit is Limit.aborted and report.capacity_rps is None
    assert report.steps == []  # the step it died in does not count, and none followed
    assert any("worker 0" in e.message and "killed by signal 9" in e.message for e in report.errors)
    assert any("a probe worker failed" in note for note in report.notes)
    assert report.exit_code == 1
