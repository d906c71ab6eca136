"""Probe workers: the exact merge, the schedule shares, a dead worker, the load-test caps.

The merge is checked on recorded samples: several workers' recorders against one recorder of
their union (what a single process would have measured). The live tests run a second or two
of light load against the delay server through real worker processes.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket

import pytest

from diagnoser.config import CapacitySettings, ProbeSettings, Settings
from diagnoser.errors import ProbeWorkerError
from diagnoser.probe.entry import run_event_loop
from diagnoser.probe.parts import latency_p99, merge_parts, part_of
from diagnoser.probe.result import ProbeRecorder, ResponseExample, shares_from
from diagnoser.probe.running import default_workers
from diagnoser.probe.spec import spec_from_url
from diagnoser.probe.worker import WorkerLimits
from diagnoser.probe.workers import WorkerPool
from tests.conftest import run_cli
from tests.probe.conftest import DelayServer, connected

FAILURES = ("status", "timeout", "empty_json", None, None, None, None, None)
#: The test servers' address, allowed to the workers as if typed on their command line.
LOCAL = WorkerLimits.allowing("127.0.0.1")


def _record(recorders: list[ProbeRecorder], rng: random.Random) -> None:
    """One request's values into every recorder given (a worker's and the union's)."""
    latency = rng.lognormvariate(1.5, 0.8) / 1000  # seconds: a few ms with a long tail
    failure = rng.choice(FAILURES)
    reused = rng.random() < 0.9
    status = None if failure == "timeout" else rng.choice((200, 200, 200, 503))
    lag = rng.random() / 5000
    for recorder in recorders:
        recorder.sent += 1
        recorder.record(
            latency_s=latency,
            service_s=latency * 0.9,
            lag_s=lag,
            opened_connection=not reused,
            connect_s=None if reused else latency / 5,
            tls_s=None,
            ttfb_s=latency * 0.7,
            body_s=latency * 0.1,
            status=status,
            failure=failure,
        )
        if failure and recorder.wants_example(failure):
            recorder.sample(ResponseExample(kind=failure, status=status))


def test_merged_percentiles_equal_those_of_the_union_of_the_samples() -> None:
    rng = random.Random(21)
    workers = [ProbeRecorder() for _ in range(3)]
    union = ProbeRecorder()
    for index in range(30_000):
        state = rng.getstate()
        _record([workers[index % 3]], rng)
        rng.setstate(state)  # the union records exactly the same request
        _record([union], rng)
    parts = [part_of(r, index=i, elapsed_s=10.0, aborted=False, abort_reason=None, cpu_s=0.0)
             for i, r in enumerate(workers)]  # fmt: skip
    cut = latency_p99(parts)
    shares = shares_from(r.tail_sums(cut) for r in workers)
    merged = merge_parts(parts, shares, target="http://t/", requested_rate=3000.0, lag_limit_ms=2.0)
    alone = union.build(target="http://t/", requested_rate=3000.0, elapsed_s=10.0, aborted=False,
                        abort_reason=None, lag_limit_ms=2.0)  # fmt: skip
    assert merged.latency_ms.count == 30_000
    for field in ("latency_ms", "service_time_ms", "schedule_lag_ms", "phases_ms", "status_counts",
                  "failures", "sent", "finished", "completed", "connections_opened", "phase_share_p99"):  # fmt: skip
        assert getattr(merged, field) == getattr(alone, field), field
    assert merged.histogram == alone.histogram
    # Examples: at most three of each kind, as one process keeps.
    kinds = [e.kind for e in merged.examples]
    assert all(kinds.count(k) <= ProbeRecorder.MAX_EXAMPLES_PER_KIND for k in set(kinds))


def test_an_average_of_percentiles_is_not_what_the_merge_gives() -> None:
    """The test above can fail: two workers with different tails have a p99 of neither's mean."""
    fast, slow = ProbeRecorder(), ProbeRecorder()
    for recorder, latency_ms in ((fast, 1.0), (slow, 100.0)):
        for i in range(1000):
            recorder.sent += 1
            ms = latency_ms if i < 980 else latency_ms * 10
            recorder.record(latency_s=ms / 1000, service_s=ms / 1000, lag_s=0.0, opened_connection=False,
                            connect_s=None, tls_s=None, ttfb_s=None, body_s=None, status=200, failure=None)  # fmt: skip
    parts = [part_of(r, index=i, elapsed_s=1.0, aborted=False, abort_reason=None, cpu_s=0.0)
             for i, r in enumerate((fast, slow))]  # fmt: skip
    merged = merge_parts(parts, shares_from([]), target="http://t/", requested_rate=2000.0, lag_limit_ms=2.0)
    each = [r.build(target="t", requested_rate=1, elapsed_s=1, aborted=False, abort_reason=None,
                    lag_limit_ms=2.0).latency_ms.p99 for r in (fast, slow)]  # fmt: skip
    assert merged.latency_ms.p99 is not None and each[0] is not None and each[1] is not None
    assert merged.latency_ms.p99 != pytest.approx((each[0] + each[1]) / 2, rel=0.05)
    # 980 at 1 ms, 20 at 10, 980 at 100, 20 at 1000: the 1,980th of 2,000 is 100 ms (the mean
    # of the workers' p99s, 10 and 1000, would say 505).
    assert merged.latency_ms.p99 == pytest.approx(100.0, rel=0.01)


def test_default_workers_one_per_core_no_more_than_the_rate_needs() -> None:
    assert default_workers(10, cores=8) == 1
    assert default_workers(1000, cores=8) == 1  # every rate the probe's ceiling allows: one process
    assert default_workers(3000, cores=2) == 2
    assert default_workers(3000, cores=8) == 3
    assert default_workers(50_000, cores=4) == 4


def test_the_capacity_ceiling_cannot_be_configured_away() -> None:
    with pytest.raises(ValueError, match=r"capacity\.max_rate"):
        Settings.model_validate({"capacity": {"max_rate": 200_000}})
    with pytest.raises(ValueError, match=r"capacity\.max_duration_s"):
        Settings.model_validate({"capacity": {"max_duration_s": 7200}})
    assert CapacitySettings().max_rate == 20_000


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # The probe's own ceiling holds whatever capacity.* says: without --load-test, 1,000 req/s.
        (["probe", "{url}", "--rate", "1500", "--duration", "1"], "probe.max_rate, at most 1000"),
        (["probe", "{url}", "--rate", "25000", "--duration", "1", "--load-test"], "capacity.max_rate"),
        (["probe", "{url}", "--rate", "2000", "--duration", "4000", "--load-test"], "capacity.max_duration_s"),
        (["capacity", "{url}", "--slo-p99-ms", "50", "--max-rate", "30000"], "capacity.max_rate of 20000"),
        (["capacity", "{url}", "--slo-p99-ms", "50", "--steps", "1000,150000"], "capacity.max_rate"),
    ],
)
def test_over_a_cap_exits_2_before_anything_is_sent(
    listener: tuple[str, socket.socket], args: list[str], expected: str
) -> None:
    url, sock = listener
    result = run_cli(*[a.format(url=url) for a in args], timeout=30)
    assert result.code == 2, result.stderr
    assert expected in result.stderr
    assert not connected(sock)


def test_a_configured_capacity_cap_above_the_ceiling_is_a_config_error(
    listener: tuple[str, socket.socket],
) -> None:
    url, sock = listener
    result = run_cli("capacity", url, "--slo-p99-ms", "50", env={"DIAGNOSER_CAPACITY__MAX_RATE": "150000"})
    assert result.code == 2 and "capacity.max_rate" in result.stderr
    assert not connected(sock)


def test_workers_send_the_whole_schedule_between_them(delay_server: DelayServer) -> None:
    spec = spec_from_url(delay_server.url + "/delay?ms=1", rate=300, duration_s=1)

    async def main() -> tuple[int, list[int], int]:
        pool = WorkerPool(2, limits=LOCAL)
        await pool.start()
        try:
            result = await pool.launch(spec, ProbeSettings(), explicit_target=True).result()
        finally:
            await pool.aclose()
        return result.sent, [p.counts.sent for p in pool.last_parts], result.status_counts.get("200", 0)

    sent, per_worker, ok = run_event_loop(main())
    assert sent == 300 and per_worker == [150, 150] and ok == 300


def test_a_killed_worker_fails_the_run_clearly(delay_server: DelayServer) -> None:
    spec = spec_from_url(delay_server.url + "/delay?ms=1", rate=100, duration_s=6)

    async def main() -> tuple[str, str | None]:
        pool = WorkerPool(2, limits=LOCAL)
        await pool.start()
        try:
            run = pool.launch(spec, ProbeSettings(), explicit_target=True)
            task = asyncio.get_running_loop().create_task(run.result())
            await asyncio.sleep(1.0)
            victim = pool.members()[1]
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            with pytest.raises(ProbeWorkerError) as failed:
                await task
            with pytest.raises(ProbeWorkerError, match="lost a worker"):
                pool.launch(spec, ProbeSettings(), explicit_target=True)  # nothing more runs on it
            return str(failed.value), pool.broken
        finally:
            await pool.aclose()

    message, broken = run_event_loop(main())
    assert "worker 1" in message and "killed by signal 9" in message
    assert broken is not None and "killed by signal 9" in broken


def test_diagnose_probe_with_workers_through_the_cli(delay_server: DelayServer) -> None:
    import json

    result = run_cli("probe", delay_server.url + "/delay?ms=1", "--rate", "400", "--duration", "1",
                     "--workers", "2", "--format", "json", timeout=60)  # fmt: skip
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sent"] == 400 and report["status_counts"] == {"200": 400}
    assert report["latency_ms"]["count"] == 400


def test_a_stop_before_the_run_orders_went_out_still_stops_every_worker(delay_server: DelayServer) -> None:
    """Ctrl-C while the workers are still being told what to send: none of them sends it all."""
    from diagnoser.probe.open_loop import INTERRUPTED

    spec = spec_from_url(delay_server.url + "/delay?ms=1", rate=100, duration_s=20)

    async def main() -> tuple[bool, str | None, list[int]]:
        pool = WorkerPool(2, limits=LOCAL)
        await pool.start()
        try:
            run = pool.launch(spec, ProbeSettings(), explicit_target=True)
            run.stop()  # before result() has sent a single order
            result = await run.result()
        finally:
            await pool.aclose()
        return result.aborted, result.abort_reason, [p.counts.sent for p in pool.last_parts]

    aborted, reason, per_worker = run_event_loop(main())
    assert aborted and reason == INTERRUPTED
    assert all(sent < 1000 for sent in per_worker)  # each would send 1,000 over the 20 s


def test_only_a_worker_with_the_run_token_passes_the_barrier() -> None:
    from diagnoser.probe.wire import Channel, worker_handshake

    async def hello(address: tuple[str, int], token: str) -> Channel | None:
        """The connection, if the coordinator let a worker through the handshake with ``token``."""
        reader, writer = await asyncio.open_connection(*address)
        channel = Channel(reader, writer, role="worker")
        try:
            await worker_handshake(channel, token, index=0, pid=0, cores=1)
        except ProbeWorkerError:
            channel.close()
            return None  # the coordinator's proof did not check out: it holds another token
        return channel

    async def main() -> tuple[bool, int, bool, int]:
        pool = WorkerPool(1, spawn=False, token="the-token-of-this-run-32-chars-at-least", startup_s=5)
        address = await pool.open()
        try:
            stranger = await hello(address, "a-guess-of-the-token-32-chars-or-more!")
            here_after_stranger = len(pool.members())
            member = await hello(address, "the-token-of-this-run-32-chars-at-least")
            await asyncio.wait_for(pool.wait_for_workers(), 5)
            here_after_member = len(pool.members())
            if member is not None:
                member.close()
        finally:
            await pool.aclose()
        return stranger is None, here_after_stranger, member is not None, here_after_member

    refused, after_stranger, admitted, after_member = run_event_loop(main())
    assert refused and after_stranger == 0
    assert admitted and after_member == 1
