"""Safety: caps, the allowlist and abort-on-error-ratio act before (or instead of) load."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from diagnoser.config import ProbeSettings
from diagnoser.errors import ProbeSafetyError
from diagnoser.probe import build_spec, load_probe_file, run_probe, spec_from_url
from tests.probe.conftest import DelayServer


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    return path


async def test_a_probe_file_over_the_rate_cap_is_refused(tmp_path: Path, server: DelayServer) -> None:
    path = _write(
        tmp_path,
        f"target: {server.url}/delay\nschedule: {{kind: constant, rate: 5000, duration_s: 700}}\n",
    )
    spec, explicit = build_spec(str(path))
    with pytest.raises(ProbeSafetyError) as caught:
        await run_probe(spec, ProbeSettings(allowed_hosts=["127.0.0.1"]), explicit_target=explicit)
    message = str(caught.value)
    assert "rate 5000 req/s exceeds the cap of 1000 req/s" in message
    assert "duration 700 s exceeds the cap of 600 s" in message
    assert "probe.max_rate" in message
    assert server.stats()["count"] == 0


async def test_a_flag_over_the_cap_is_refused_too() -> None:
    spec = spec_from_url("http://127.0.0.1:9/", rate=1001, duration_s=1)
    with pytest.raises(ProbeSafetyError, match="exceeds the cap"):
        await run_probe(spec, ProbeSettings(), explicit_target=True)


async def test_the_config_lowers_the_cap_and_cannot_pass_the_ceiling(server: DelayServer) -> None:
    spec = spec_from_url(f"{server.url}/delay?ms=1", rate=200, duration_s=0.05)
    with pytest.raises(ProbeSafetyError, match="exceeds the cap of 100 req/s"):
        await run_probe(spec, ProbeSettings(max_rate=100), explicit_target=True)
    with pytest.raises(ValidationError, match="less than or equal to 1000"):
        ProbeSettings(max_rate=2000)
    result = await run_probe(spec, ProbeSettings(max_rate=1000), explicit_target=True)
    assert result.sent == 10


async def test_a_host_outside_the_allowlist_is_refused_before_any_request(
    tmp_path: Path, server: DelayServer
) -> None:
    path = _write(tmp_path, f"target: {server.url}/delay?ms=1\nschedule: {{rate: 10, duration_s: 1}}\n")
    spec = load_probe_file(path)
    with pytest.raises(ProbeSafetyError, match=r"host '127.0.0.1' is not in probe.allowed_hosts"):
        await run_probe(spec, ProbeSettings(allowed_hosts=["*.staging.example.com"]), explicit_target=False)
    assert server.stats()["count"] == 0
    # The same file runs once its host is allowed; a URL typed on the command line needs no entry.
    # A loopback address is allowed only by name: a pattern never covers it (below).
    result = await run_probe(
        spec.model_copy(update={"schedule": spec_from_url(spec.target, rate=10, duration_s=0.2).schedule}),
        ProbeSettings(allowed_hosts=["127.0.0.1"]),
        explicit_target=False,
    )
    assert result.sent == 2


@pytest.mark.parametrize("pattern", ["*", "1*", "127.0.0.*"])
async def test_a_pattern_never_allows_a_loopback_address(
    tmp_path: Path, server: DelayServer, pattern: str
) -> None:
    path = _write(tmp_path, f"target: {server.url}/delay?ms=1\nschedule: {{rate: 10, duration_s: 0.2}}\n")
    with pytest.raises(ProbeSafetyError, match=r"127\.0\.0\.1, a loopback address: add 127\.0\.0\.1 itself"):
        await run_probe(load_probe_file(path), ProbeSettings(allowed_hosts=[pattern]), explicit_target=False)
    assert server.stats()["count"] == 0


async def test_error_ratio_over_threshold_stops_the_run_within_one_window(server: DelayServer) -> None:
    spec = spec_from_url(f"{server.url}/unavailable", rate=50, duration_s=20)
    started = time.monotonic()
    result = await run_probe(
        spec, ProbeSettings(abort_error_ratio=0.5, abort_window_s=1.0), explicit_target=True
    )
    elapsed = time.monotonic() - started
    assert result.aborted
    assert result.abort_reason is not None
    assert "abort threshold of 50%" in result.abort_reason
    assert elapsed < 1.5, elapsed
    assert result.sent <= 60
    assert result.failures.status == result.finished


async def test_validation_failures_do_not_abort(server: DelayServer) -> None:
    spec = spec_from_url(f"{server.url}/empty-object", rate=50, duration_s=1.5)
    result = await run_probe(
        spec, ProbeSettings(abort_error_ratio=0.5, abort_window_s=0.5), explicit_target=True
    )
    assert not result.aborted
    assert result.failures.empty_json == result.sent == 75


async def test_stop_returns_a_partial_result(server: DelayServer) -> None:
    import asyncio

    from diagnoser.probe import ProbeRun

    run = ProbeRun(spec_from_url(f"{server.url}/delay?ms=5", rate=100, duration_s=30), ProbeSettings())
    task = asyncio.create_task(run.run())
    # Stop a moment after the first request left (start-up takes longer on a busy machine).
    for _ in range(500):  # 10 s at most
        if run.live().sent or task.done():
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    run.stop()
    result = await asyncio.wait_for(task, 3)
    assert result.aborted
    assert result.abort_reason == "interrupted by the user"
    # Stopped early (of 30 s planned), and what was sent before the stop kept to the schedule.
    assert result.duration_s < 5
    assert result.sent > 0
    assert abs(result.sent - result.duration_s * 100) <= 5
    assert result.finished == result.sent


async def test_stop_does_not_wait_for_a_far_off_send_time(server: DelayServer) -> None:
    import asyncio

    from diagnoser.probe import ProbeRun

    run = ProbeRun(spec_from_url(f"{server.url}/delay?ms=1", rate=0.2, duration_s=60), ProbeSettings())
    task = asyncio.create_task(run.run())
    # Stop once the first request (sent at once) has been answered; the next is 5 s away.
    for _ in range(100):
        if server.stats()["count"] >= 1:
            break
        await asyncio.sleep(0.05)
    started = time.monotonic()
    run.stop()
    result = await asyncio.wait_for(task, 3)
    assert time.monotonic() - started < 0.5
    assert result.sent == 1
    assert result.aborted


async def test_both_timers_can_be_interrupted_and_fire_on_time() -> None:
    import asyncio

    from diagnoser.probe.timer import CallAtTimer, TimerfdTimer, make_timer

    for precise, spin_s in ((True, 0.0), (True, 0.0005), (False, 0.0)):
        timer = make_timer(precise=precise, spin_s=spin_s)
        assert isinstance(timer, TimerfdTimer if precise else CallAtTimer)
        fired = asyncio.Event()
        timer.call_at(time.monotonic() + 30, fired.set)
        await asyncio.sleep(0.01)
        timer.interrupt()
        await asyncio.wait_for(fired.wait(), 1)
        fired.clear()
        deadline = time.monotonic() + 0.005
        fired_at: list[float] = []

        def note(fired_at: list[float] = fired_at, fired: asyncio.Event = fired) -> None:
            fired_at.append(time.monotonic())
            fired.set()

        timer.call_at(deadline, note)
        await asyncio.wait_for(fired.wait(), 1)
        assert fired_at[0] >= deadline
        timer.close()
