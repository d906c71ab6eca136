"""Acceptance: the probe's percentiles agree with the server's own, and a stall is not hidden."""

from __future__ import annotations

from diagnoser.config import ProbeSettings
from diagnoser.probe import ProbeRun, spec_from_url
from tests.probe.conftest import DelayServer


async def test_at_200_per_second_probe_agrees_with_the_servers_own_service_time(server: DelayServer) -> None:
    # A short warm-up: the server process may have just started (lazy imports, first accepts).
    await ProbeRun(spec_from_url(f"{server.url}/delay?ms=1", rate=50, duration_s=0.3), ProbeSettings()).run()
    server.reset()
    spec = spec_from_url(f"{server.url}/delay?ms=20", rate=200, duration_s=5)
    result = await ProbeRun(spec, ProbeSettings()).run()
    own = server.stats()

    assert result.sent == 1000
    assert result.completed == 1000
    assert result.failures.total == 0
    assert own["count"] == 1000
    assert result.latency_ms.p50 is not None
    assert result.latency_ms.p99 is not None
    assert abs(result.latency_ms.p50 - own["p50_ms"]) <= 1.5, (result.latency_ms, own)
    assert abs(result.latency_ms.p99 - own["p99_ms"]) <= 5.0, (result.latency_ms, own)
    # Nothing can answer faster than the server: the probe never reports less than it.
    assert result.latency_ms.p50 >= own["p50_ms"]
    assert 195 <= result.achieved_rate <= 205


async def test_a_one_second_stall_shows_in_the_p99_and_not_in_the_p50(server: DelayServer) -> None:
    server.stall(1000, after_s=4)
    spec = spec_from_url(f"{server.url}/delay?ms=20", rate=100, duration_s=10)
    result = await ProbeRun(spec, ProbeSettings()).run()

    assert result.sent == 1000
    assert result.failures.total == 0
    assert result.latency_ms.p99 is not None
    assert result.latency_ms.p50 is not None
    # ~100 requests were sent during the stall and waited for its end: 1,000 ms down to ~0.
    assert result.latency_ms.p99 >= 500, result.latency_ms
    assert result.latency_ms.max is not None
    assert result.latency_ms.max >= 950
    assert result.latency_ms.p50 <= 25, result.latency_ms
    # The slowest 1 % spent their time waiting for the first byte, not in the probe or in connects.
    assert result.phase_share_p99.ttfb > 0.9, result.phase_share_p99
    # The schedule was kept through the stall: requests left on time, they just waited.
    assert result.schedule_lag_ms.p99 is not None
    assert result.schedule_lag_ms.p99 < 20
