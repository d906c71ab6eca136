"""The open-loop sender: each request leaves at its intended time, whatever earlier ones do.

One scheduler walks the schedule's intended send times, waits for each with a precise timer
(:mod:`diagnoser.probe.timer`) and starts the request; it never waits for a response. Requests go
over the probe's own HTTP/1.1 transport (:mod:`diagnoser.probe.http1`, through the boundary of
:mod:`diagnoser.probe.transport`), which times each request's phases; its keep-alive pool is sized
from Little's law so that no request waits for a connection (one that does is a pool wait). The
``httpx.AsyncClient`` layer (auth, redirects, cookies) is skipped: a probe wants none of it.

Per request the probe records, in microseconds: latency from the intended send time (no
coordinated omission), service time from the actual send, schedule lag (actual minus intended),
and phases. Only in-flight tasks are kept (finished task objects kept alive cost 20-40 ms GC
pauses) and the garbage collector pauses for the run (see :meth:`ProbeRun.run`). No retries,
ever; each request has a timeout; the run aborts when the error ratio over a sliding window
passes the threshold.

Usage: ``result = await ProbeRun(spec, settings).run()``; ``stop()`` ends it early (partial result).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import math
import random
import time
from pathlib import Path
from typing import Any

import httpx

from diagnoser.config import ProbeSettings
from diagnoser.probe.http1_connection import IncompleteBody, RawResponse, RequestTimings
from diagnoser.probe.live import LiveStats
from diagnoser.probe.parts import RunPart, part_of
from diagnoser.probe.result import ERROR_RATIO_ABORT, ProbeRecorder, ProbeResult, ResponseExample
from diagnoser.probe.schedule import arrival_offsets
from diagnoser.probe.spec import ProbeSpec, address_refusal, effective_caps
from diagnoser.probe.timer import PreciseTimer, make_timer
from diagnoser.probe.transport import ProbeTransport, describe_error, probe_transport
from diagnoser.probe.validate import check_response, parse_json_path

__all__ = ["INTERRUPTED", "USER_AGENT", "LiveStats", "ProbeRun", "ProbeTransport", "probe_transport"]

USER_AGENT = "diagnoser-probe/0.1"
#: The reason a run stopped by :meth:`ProbeRun.stop` without one (Ctrl-C).
INTERRUPTED = "interrupted by the user"
#: Lag p99 above this means the probe could not keep its schedule.
SCHEDULE_LAG_LIMIT_MS = 2.0
#: Fewest finished requests in the window before the abort ratio is trusted (fewer at low rates).
ABORT_MIN_REQUESTS = 10
_TICK_S = 0.1
#: With the collector paused, collect the young generations past this many tracked objects.
_GC_BUDGET_OBJECTS = 100_000


class ProbeRun:
    """One run of one probe: ``await run()``; ``stop()`` ends it early. A ``grpc://`` spec makes a
    :class:`~diagnoser.probe.grpc_run.GrpcProbeRun` (see ``__new__``)."""

    def __new__(cls, spec: ProbeSpec, *args: Any, **kwargs: Any) -> ProbeRun:
        # Every caller (a command, a capacity step, a worker) gets the right run for its spec.
        if cls is ProbeRun and spec.is_grpc:
            from diagnoser.probe.grpc_run import GrpcProbeRun  # grpcio is loaded for gRPC only

            cls = GrpcProbeRun
        return super().__new__(cls)

    def __init__(
        self,
        spec: ProbeSpec,
        settings: ProbeSettings,
        *,
        precise_timer: bool = True,
        pause_gc: bool = True,
        base_dir: Path | None = None,
        explicit_target: bool | None = None,
        share: tuple[int, int] = (0, 1),
        start_at: float | None = None,
    ) -> None:
        """``explicit_target`` (a typed URL or a probe file) turns on the resolved-address rule
        at every connection (:func:`~diagnoser.probe.spec.address_refusal`); ``None`` leaves
        it to the caller. ``share`` ``(i, n)``: send every n-th request from the i-th (a worker's
        share); ``start_at``: the schedule's ``time.monotonic()`` start (workers share one)."""
        self.spec = spec
        self.settings = settings
        self._explicit_target = explicit_target
        self.share = share
        self._start_at = start_at
        own_rate = spec.peak_rate / share[1]
        self.timeout_s = _first(spec.timeout_s, settings.request_timeout_s)
        self.abort_ratio = _first(spec.abort_error_ratio, settings.abort_error_ratio)
        self.abort_window_s = _first(spec.abort_window_s, settings.abort_window_s)
        # Little's law: enough connections for the peak rate even if every request ran to its timeout.
        needed = math.ceil(own_rate * self.timeout_s)
        cap = effective_caps(settings)[3]
        self.pool_size = min(cap, spec.max_connections or max(16, needed))
        self.recorder = ProbeRecorder()
        self._precise_timer = precise_timer
        self._pause_gc = pause_gc
        self._bodies = spec.request_bodies(base_dir)
        self._json_path = parse_json_path(spec.expect.json_path) if spec.expect.json_path else None
        self._stop = asyncio.Event()
        self._stopped_early = False
        self._abort_reason: str | None = None
        #: In-flight requests and their deadlines; finished ones leave at once (no GC pressure).
        #: Ordered by send time, hence by deadline (one timeout for every request).
        self._in_flight: dict[asyncio.Future[Any], float] = {}
        self._timed_out: set[asyncio.Future[Any]] = set()
        self._transport: ProbeTransport | None = None
        self._timer: PreciseTimer | None = None
        self._start = 0.0
        self._end: float | None = None
        # Finished and failed counts per tick, for the sliding abort window.
        slots = max(1, math.ceil(self.abort_window_s / _TICK_S))
        expected_in_window = own_rate * self.abort_window_s
        self._abort_min = max(3, min(ABORT_MIN_REQUESTS, math.ceil(expected_in_window / 2)))
        self._window_done = [0] * slots
        self._window_bad = [0] * slots
        self._window_slot = 0

    # -- control ------------------------------------------------------------------------------

    def stop(self, reason: str = INTERRUPTED) -> None:
        """End the run early; in-flight requests finish (up to their timeout), then the result is built."""
        if self._abort_reason is None:
            self._abort_reason = reason
        if self._end is None:
            # Only a stop before the schedule ended cuts the run short; one while the last
            # answers drain (an error-ratio abort on a run already sent) leaves it complete.
            self._stopped_early = True
        self._stop.set()
        if self._timer is not None:
            self._timer.interrupt()

    @property
    def stop_reason(self) -> str | None:
        return self._abort_reason

    def live(self) -> LiveStats:
        """A snapshot for the progress view; resets the recent-latency window it reads."""
        now = time.monotonic()
        elapsed = max(0.0, (self._end or now) - self._start) if self._start else 0.0
        rec = self.recorder
        p99 = rec.recent_p99_ms()
        return LiveStats(
            elapsed_s=elapsed,
            planned_s=self.spec.duration_s,
            sent=rec.sent,
            finished=rec.finished,
            failures=sum(rec.failures.values()),
            achieved_rate=rec.sent / elapsed if elapsed > 0 else 0.0,
            recent_p99_ms=p99,
            in_flight=len(self._in_flight),
        )

    # -- the run ------------------------------------------------------------------------------

    async def _open_transport(self) -> ProbeTransport:
        transport = probe_transport(self.spec, self.pool_size)
        if self._explicit_target is not None:
            settings, explicit = self.settings, self._explicit_target
            transport.address_guard = lambda host, address: address_refusal(
                host, address, settings, explicit_target=explicit
            )
        transport.prepare(self.spec.target)
        return transport

    async def run(self) -> ProbeResult:
        await self.send()
        return self._result()

    async def send(self) -> None:
        """The run without its result (a worker sends its :meth:`part` instead)."""
        transport = await self._open_transport()
        self._transport = transport
        requests = [self._build_request(body) for body in self._bodies]
        timer = make_timer(precise=self._precise_timer, spin_s=self.settings.timer_spin_us / 1e6)
        self._timer = timer
        watchdog: asyncio.Task[None] | None = None
        paused_gc = False
        try:
            if self._pause_gc and gc.isenabled():
                # A collection walks every live object; in-flight requests keep tens of thousands
                # alive, so automatic collections stalled the schedule for 5-90 ms at 1,500 req/s
                # here. A run makes almost no cyclic garbage (under a hundred objects for 9,000
                # requests), so the collector pauses for the run, start-up objects are frozen out of
                # its view, and the watchdog collects the young generations if garbage does pile up.
                gc.collect()
                gc.freeze()
                gc.disable()
                paused_gc = True
            self._start = self._start_at if self._start_at is not None else time.monotonic() + 0.02
            watchdog = asyncio.get_running_loop().create_task(self._watch())
            await self._send_all(requests, timer)
            self._end = time.monotonic()
            await self._drain()
        finally:
            timer.close()
            if watchdog is not None:
                watchdog.cancel()
            leftovers = list(self._in_flight)
            for pending in leftovers:
                pending.cancel()
            if leftovers:
                await asyncio.gather(*leftovers, return_exceptions=True)
            await transport.aclose()
            if paused_gc:
                gc.unfreeze()
                gc.enable()

    def _build_request(self, body: bytes | None) -> Any:
        headers = {"User-Agent": USER_AGENT, **self.spec.headers}
        return httpx.Request(self.spec.method, self.spec.target, headers=headers, content=body)

    async def _send_all(self, requests: list[Any], timer: PreciseTimer) -> None:
        """Send every request of the schedule on time; returns at the end of the planned duration.

        The sending runs in the timer's callback (see :mod:`diagnoser.probe.timer`): each call
        sends whatever is due, then arms the timer for the next intended send time.
        """
        spec = self.spec
        start = self._start
        end = start + spec.duration_s
        count = len(requests)
        stop = self._stop
        dispatch = self._dispatch
        offsets = arrival_offsets(spec.schedule.segments(), spec.schedule.arrivals, random.Random(spec.seed))
        first, every = self.share
        if every > 1:  # each worker keeps its own requests of the one schedule (Poisson too)
            offsets = itertools.islice(offsets, first, None, every)
        sent_all: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        index = 0
        intended = start + next(offsets, math.inf)

        def send_due() -> None:
            nonlocal index, intended
            try:
                while not stop.is_set() and intended != math.inf:
                    if intended > time.monotonic():
                        timer.call_at(intended, send_due)
                        return
                    dispatch(requests[index % count], intended)
                    index += 1
                    intended = start + next(offsets, math.inf)
            except BaseException as exc:  # a bug here must end the run, not hang it
                if not sent_all.done():
                    sent_all.set_exception(exc)
                raise
            if not sent_all.done():
                sent_all.set_result(None)

        send_due()
        await sent_all
        # Hold the schedule's full duration, so the achieved rate is per planned second.
        if end > time.monotonic() and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), end - time.monotonic())

    def _dispatch(self, request: Any, intended: float) -> None:
        """Send one request now; its answer is handled by :meth:`_answered` when it completes.

        No task per request: on a pooled connection the request is written before this returns,
        so the send time is the scheduler's own, and the answer arrives as a future's callback.
        """
        transport = self._transport
        assert transport is not None
        timings = RequestTimings()
        started = time.monotonic()
        recorder = self.recorder
        recorder.sent += 1
        if started - intended > recorder.send_lag_max_s:
            recorder.send_lag_max_s = started - intended
        try:
            pending = transport.start(request, timings)
        except httpx.HTTPError as exc:
            pending = asyncio.get_running_loop().create_future()
            pending.set_exception(exc)
        self._in_flight[pending] = intended + self.timeout_s
        pending.add_done_callback(functools.partial(self._answered, intended, started, timings))

    def _settled(self, pending: asyncio.Future[Any]) -> bool | None:
        """Take a finished request off the books: whether it timed out, ``None`` if it was cut off."""
        self._in_flight.pop(pending, None)
        if pending in self._timed_out:
            self._timed_out.discard(pending)
            return True
        return None if pending.cancelled() else False

    def _answered(
        self, intended: float, started: float, timings: RequestTimings, pending: asyncio.Future[RawResponse]
    ) -> None:
        timed_out = self._settled(pending)
        if timed_out is None:
            return  # the run ended with it in flight: not an answer
        received: RawResponse | None = None
        failure: str | None = None
        error: str | None = None
        exc = None if timed_out else pending.exception()
        if timed_out:
            failure = "timeout"
            error = f"no complete response within {self.timeout_s:g} s"
        elif exc is None:
            received = pending.result()
        elif isinstance(exc, IncompleteBody):
            # Fewer bytes than announced: what the user got is a cut-off answer.
            received = exc.partial
            failure = "truncated"
            error = str(exc)
        else:
            failure = "connect_error" if isinstance(exc, httpx.ConnectError) else "read_error"
            error = describe_error(exc)
        # The last byte as the connection saw it, not when this callback got its turn.
        done_at = timings.done or time.monotonic()
        if received is not None and failure is None:
            if received.cut:
                failure = "too_large"
            else:
                content_type = received.content_type
                failure = check_response(
                    self.spec.expect,
                    self._json_path,
                    status=received.status,
                    content_type=content_type.decode("latin-1") if content_type else None,
                    content_length=received.content_length,
                    body=received.body,
                    method=self.spec.method,
                )
        status = received.status if received is not None else None
        self._record(timings, intended, started, done_at, status, failure, timed_out)
        if failure is not None and self.recorder.wants_example(failure):
            self.recorder.sample(
                ResponseExample(
                    kind=failure,
                    status=status,
                    body=received.body.decode("utf-8", "replace") if received is not None else None,
                    content_length=received.content_length if received is not None else None,
                    received_bytes=len(received.body) if received is not None else None,
                    error=error,
                )
            )

    async def _drain(self) -> None:
        if not self._in_flight:
            return
        grace = self.timeout_s + 2 * _TICK_S
        if self._abort_reason == INTERRUPTED:
            grace = min(grace, 1.0)
        await asyncio.wait(set(self._in_flight), timeout=grace)

    async def _watch(self) -> None:
        """Every tick: time out overdue requests, advance the abort window, stop on too many errors.

        One sweep per tick instead of a timer per request: a request's timeout is honoured to
        within a tick, and the per-request cost stays a dictionary entry. The sweep stops at the
        first request not yet due.
        """
        slots = len(self._window_done)
        while True:
            await asyncio.sleep(_TICK_S)
            now = time.monotonic()
            overdue = []
            for pending, deadline in self._in_flight.items():
                if deadline > now:
                    break  # in send order, so every later one is due later
                if pending not in self._timed_out:
                    overdue.append(pending)
            for pending in overdue:
                self._timed_out.add(pending)
                pending.cancel()
            done = sum(self._window_done)
            bad = sum(self._window_bad)
            if done >= self._abort_min and bad / done > self.abort_ratio and not self._stop.is_set():
                self.stop(
                    f"{ERROR_RATIO_ABORT}{bad / done:.0%} over the last {self.abort_window_s:g} s passed the "
                    f"abort threshold of {self.abort_ratio:.0%} ({bad} of {done} requests failed)"
                )
            if not gc.isenabled() and gc.get_count()[0] > _GC_BUDGET_OBJECTS:
                gc.collect(1)
            self._window_slot = (self._window_slot + 1) % slots
            self._window_done[self._window_slot] = 0
            self._window_bad[self._window_slot] = 0

    def _record(
        self,
        timings: RequestTimings,
        intended: float,
        started: float,
        done_at: float,
        status: int | str | None,
        failure: str | None,
        timed_out: bool,
    ) -> None:
        connect_s = tls_s = None
        if timings.connect_start and timings.tcp_end:
            connect_s = timings.tcp_end - timings.connect_start
            if timings.tls_end:
                tls_s = timings.tls_end - timings.tcp_end
        recorder = self.recorder
        if timings.pool_wait:
            recorder.pool_waits += 1
        # Waiting: from the request on the wire to its first byte back (or to the timeout).
        first_byte = timings.first_byte or (done_at if timed_out else 0.0)
        recorder.record(
            # A partial (truncated) answer and a timeout are what the user got: their latency counts.
            latency_s=(done_at - intended) if (status is not None or timed_out) else None,
            service_s=done_at - started,
            lag_s=started - intended,
            opened_connection=bool(timings.connect_start),
            connect_s=connect_s,
            tls_s=tls_s,
            ttfb_s=(first_byte - timings.sent) if first_byte and timings.sent else None,
            body_s=(done_at - timings.first_byte) if timings.first_byte and status is not None else None,
            status=status,
            failure=failure,
        )
        slot = self._window_slot
        self._window_done[slot] += 1
        if failure in _OVERLOAD_FAILURES:
            self._window_bad[slot] += 1

    def part(self, cpu_s: float = 0.0) -> RunPart:
        """This run as one worker's share of a larger one (see :mod:`diagnoser.probe.parts`)."""
        elapsed, early = max(0.0, (self._end or time.monotonic()) - self._start), self._stopped_early
        reason = self._abort_reason if early else None
        return part_of(self.recorder, index=self.share[0], elapsed_s=elapsed, aborted=early,
                       abort_reason=reason, cpu_s=cpu_s)  # fmt: skip

    def _result(self) -> ProbeResult:
        end = self._end or time.monotonic()
        elapsed = max(0.0, end - self._start)
        return self.recorder.build(
            target=self.spec.target,
            requested_rate=self.spec.mean_rate,
            elapsed_s=elapsed,
            aborted=self._stopped_early,
            abort_reason=self._abort_reason if self._stopped_early else None,
            lag_limit_ms=SCHEDULE_LAG_LIMIT_MS,
        )


#: Failures that can mean an overloaded target; only they count toward the abort. A wrong but
#: fast body is what the probe is here to measure, not a reason to stop.
_OVERLOAD_FAILURES = frozenset({"status", "timeout", "connect_error", "read_error"})


def _first(value: float | None, default: float) -> float:
    return value if value is not None else default


