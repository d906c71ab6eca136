"""The probe's entry for the rest of diagnoser: the prepared probe and the one event-loop policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from diagnoser.config import ProbeSettings
from diagnoser.errors import ConfigError
from diagnoser.probe import ProbeResult, prepare_probe, run_event_loop
from diagnoser.probe.open_loop import INTERRUPTED
from tests.probe.conftest import DelayServer


def test_run_event_loop_runs_on_uvloop_and_returns_the_result() -> None:
    pytest.importorskip("uvloop")

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run_event_loop(loop_module()).startswith("uvloop")


def test_a_prepared_probe_runs_its_schedule_once(server: DelayServer) -> None:
    probe = prepare_probe(f"{server.url}/delay?ms=1", rate=20, duration_s=0.5, settings=ProbeSettings())
    assert probe.spec.peak_rate == 20
    result = run_event_loop(probe())
    assert result.sent == 10
    assert result.failures.total == 0
    with pytest.raises(RuntimeError, match="runs once"):
        run_event_loop(probe())


def test_a_prepared_probe_stops_early_with_a_partial_result(server: DelayServer) -> None:
    probe = prepare_probe(f"{server.url}/delay?ms=1", rate=100, duration_s=30, settings=ProbeSettings())

    async def stopped_after_a_moment() -> tuple[float, ProbeResult]:
        task = asyncio.get_running_loop().create_task(probe())
        # Stop a moment after the first request left (start-up takes longer on a busy machine).
        for _ in range(500):  # 10 s at most
            if probe.live().sent or task.done():
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        planned = probe.live().planned_s
        probe.stop()
        return planned, await asyncio.wait_for(task, 3)

    planned, result = run_event_loop(stopped_after_a_moment())
    assert planned == 30
    assert result.aborted
    assert result.abort_reason == INTERRUPTED
    assert 0 < result.sent < 100


def test_an_unreadable_request_body_is_refused_when_the_probe_is_prepared(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "target: http://127.0.0.1:9/\nschedule: {rate: 1, duration_s: 1}\n"
        "method: POST\nbody_file: missing.json\n"
    )
    with pytest.raises(ConfigError, match="body_file"):
        prepare_probe(str(path), rate=1, duration_s=1, settings=ProbeSettings(allowed_hosts=["127.0.0.1"]))
