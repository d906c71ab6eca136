"""The sender against real responses: each kind of bad answer is counted under its own kind."""

from __future__ import annotations

import asyncio
import socket

import pytest

from diagnoser.config import ProbeSettings
from diagnoser.probe import ProbeResult, ProbeRun, ProbeSpec, merge_histograms, spec_from_url
from tests.probe.conftest import DelayServer

CONTRACT_KEYS = {
    "target", "requested_rate", "achieved_rate", "duration_s", "sent", "completed", "aborted",
    "abort_reason", "latency_ms", "service_time_ms", "schedule_lag_ms", "phases_ms", "status_counts",
    "failures", "examples", "histogram",
}  # fmt: skip


async def _run(url: str, *, rate: float = 40, duration_s: float = 0.5, **changes: object) -> ProbeResult:
    spec = spec_from_url(url, rate=rate, duration_s=duration_s)
    if changes:
        spec = ProbeSpec.model_validate({**spec.model_dump(), **changes})
    return await ProbeRun(spec, ProbeSettings(request_timeout_s=5, abort_error_ratio=1.0)).run()


@pytest.mark.parametrize(
    ("path", "kind", "body"),
    [
        ("/empty-object", "empty_json", "{}"),
        ("/empty-features", "empty_json", '{"features": {}}'),
        ("/empty", "empty_body", ""),
    ],
)
async def test_successes_without_content_are_failures_with_a_sampled_body(
    server: DelayServer, path: str, kind: str, body: str
) -> None:
    result = await _run(server.url + path)
    assert result.sent == 20
    assert result.status_counts == {"200": 20}
    assert getattr(result.failures, kind) == 20
    assert result.failures.total == 20
    assert result.examples[0].kind == kind
    assert result.examples[0].status == 200
    assert result.examples[0].body == body
    assert len(result.examples) <= 3


async def test_a_required_json_path_that_is_empty_is_missing_path(server: DelayServer) -> None:
    result = await _run(
        server.url + "/empty-features",
        expect={"json_path": "$.features", "non_empty_json": False},
    )
    assert result.failures.missing_path == 20
    assert result.failures.empty_json == 0


async def test_a_present_json_path_passes(server: DelayServer) -> None:
    result = await _run(server.url + "/delay?ms=1", expect={"json_path": "$.features.a"})
    assert result.failures.total == 0
    assert result.completed == 20


async def test_a_body_shorter_than_its_content_length_is_truncated(server: DelayServer) -> None:
    result = await _run(server.url + "/truncated")
    assert result.failures.truncated == 20
    example = result.examples[0]
    assert example.kind == "truncated"
    assert example.content_length == 100
    assert example.received_bytes == len('{"features": {"a": 1')


async def test_a_503_is_a_status_failure(server: DelayServer) -> None:
    result = await _run(server.url + "/unavailable")
    assert result.status_counts == {"503": 20}
    assert result.failures.status == 20
    assert "UNAVAILABLE" in (result.examples[0].body or "")


async def test_a_listed_status_is_accepted(server: DelayServer) -> None:
    result = await _run(server.url + "/unavailable", expect={"status": [503], "non_empty_json": False})
    assert result.failures.total == 0


async def test_a_slow_answer_times_out_without_retry(server: DelayServer) -> None:
    result = await _run(server.url + "/delay?ms=3000", rate=10, duration_s=0.5, timeout_s=0.3)
    assert result.sent == 5
    assert result.failures.timeout == 5
    assert result.completed == 0
    # A timed-out request's latency is what the user waited: about the timeout.
    assert result.latency_ms.p50 is not None
    assert 250 <= result.latency_ms.p50 <= 600
    assert server.stats()["count"] <= 5  # at most the 5 sent: no retries


async def test_a_closed_port_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = await _run(f"http://127.0.0.1:{port}/", rate=20, duration_s=0.5)
    assert result.failures.connect_error == 10
    assert result.completed == 0
    assert result.examples[0].kind == "connect_error"
    assert "refused" in (result.examples[0].error or "").lower()


async def test_connection_close_means_one_connection_per_request(server: DelayServer) -> None:
    closing = await _run(server.url + "/close?ms=2", rate=50, duration_s=1)
    reused = await _run(server.url + "/delay?ms=2", rate=50, duration_s=1)
    assert closing.connections_opened == closing.finished == 50
    assert reused.connections_opened <= 5
    assert closing.phases_ms.connect.count == 50
    assert closing.phases_ms.connect.p50 is not None
    assert closing.phases_ms.connect.p50 > 0


async def test_json_output_follows_the_contract_and_histograms_merge(server: DelayServer) -> None:
    first = await _run(server.url + "/delay?ms=5", rate=40, duration_s=0.5)
    second = await _run(server.url + "/delay?ms=5", rate=40, duration_s=0.5)
    data = first.model_dump(mode="json")
    assert set(data) >= CONTRACT_KEYS
    assert {"p50", "p75", "p90", "p99", "p999", "max"} <= set(data["latency_ms"])
    assert {"p50", "p99", "max"} <= set(data["service_time_ms"]) & set(data["schedule_lag_ms"])
    assert set(data["phases_ms"]) == {"connect", "tls", "ttfb", "body"}
    assert {
        "empty_body",
        "empty_json",
        "missing_path",
        "truncated",
        "timeout",
        "connect_error",
        "status",
    } <= set(data["failures"])
    assert ProbeResult.model_validate(data) == first
    merged = merge_histograms([first.histogram, second.histogram])
    assert merged.get_total_count() == 40
    assert merged.get_value_at_percentile(50) >= 5000  # microseconds; the server waits 5 ms


async def test_rotating_bodies_are_sent_in_turn(server: DelayServer) -> None:
    result = await _run(
        server.url + "/delay?ms=1", method="POST", bodies=["a", "bb", "ccc"], rate=30, duration_s=0.2
    )
    assert result.sent == 6
    assert result.failures.total == 0


async def test_a_pool_too_small_is_reported_as_the_bottleneck(server: DelayServer) -> None:
    result = await _run(server.url + "/delay?ms=50", rate=100, duration_s=0.5, max_connections=2)
    assert result.pool_waits > 0
    assert result.bottleneck == "connection_pool"
    assert any("free connection" in w for w in result.warnings)
    # The default pool (Little's law at the timeout) never waits.
    roomy = await _run(server.url + "/delay?ms=50", rate=100, duration_s=0.5)
    assert roomy.pool_waits == 0
    assert roomy.bottleneck is None


async def test_a_blocked_event_loop_is_reported_as_a_scheduler_bottleneck(server: DelayServer) -> None:
    import asyncio
    import time

    async def hog() -> None:
        # Something else in the process holds the loop for 30 ms at a time.
        while True:
            await asyncio.sleep(0.1)
            time.sleep(0.03)  # noqa: ASYNC251 - blocking the loop is the point of this test

    hogging = asyncio.create_task(hog())
    try:
        result = await _run(server.url + "/delay?ms=1", rate=200, duration_s=1)
    finally:
        hogging.cancel()
    assert result.schedule_lag_ms.p99 is not None
    assert result.schedule_lag_ms.p99 > 10
    assert result.bottleneck == "scheduler"
    assert any("could not keep" in w for w in result.warnings)


async def test_the_garbage_collector_is_paused_for_the_run_and_restored(server: DelayServer) -> None:
    import gc

    assert gc.isenabled()
    states: list[bool] = []
    run = ProbeRun(spec_from_url(server.url + "/delay?ms=1", rate=40, duration_s=0.3), ProbeSettings())
    watcher = asyncio.create_task(_watch_gc(states))
    await run.run()
    watcher.cancel()
    assert False in states  # paused while the requests were in flight
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


async def _watch_gc(states: list[bool]) -> None:
    import gc

    while True:
        states.append(gc.isenabled())
        await asyncio.sleep(0.02)
