"""The open-loop sender: each request leaves at its intended time, whatever earlier ones do.

One scheduler coroutine walks the schedule's intended send times, waits for each with a precise
timer (:mod:`diagnoser.probe.timer`) and starts the request as its own task; it never waits for a
response. Requests go through httpx's transport API (``httpx.Request`` in, ``httpx.Response``
out) over an aiohttp transport: httpx's default transport costs 1.5-2 ms of CPU per request and
collapses near 600-1,000 req/s on one core, the aiohttp one holds several thousand. The full
``httpx.AsyncClient`` layer (auth, redirects, cookies) is skipped on purpose: a probe wants none
of it and it triples the CPU per request. A socket factory times each new connection's TCP
connect, aiohttp's tracing adds the end of the TLS handshake, and a context variable ties each
hook to its request; a request sent while every pooled connection is busy is counted as a pool
wait (the pool is sized from Little's law so that should not happen).

Per request the probe records, in microseconds: latency from the intended send time (no
coordinated omission), service time from the actual send, schedule lag (actual minus intended),
and phases. Only in-flight tasks are kept (finished task objects kept alive cost 20-40 ms GC
pauses) and the garbage collector pauses for the run (see :meth:`ProbeRun.run`). No retries,
ever; each request has a timeout; the run aborts when the error ratio over a sliding window
passes the threshold.

Usage::

    run = ProbeRun(spec, settings)
    result = await run.run()        # run.stop() from elsewhere ends it early with a partial result
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import math
import os
import random
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from diagnoser.config import ProbeSettings
from diagnoser.probe.result import ProbeRecorder, ProbeResult, ResponseExample
from diagnoser.probe.schedule import arrival_offsets
from diagnoser.probe.spec import ProbeSpec
from diagnoser.probe.timer import PreciseTimer, make_timer
from diagnoser.probe.validate import check_response, parse_json_path

__all__ = ["INTERRUPTED", "USER_AGENT", "LiveStats", "ProbeRun", "aiohttp_transport"]

USER_AGENT = "diagnoser-probe/0.1"
#: The reason a run stopped by :meth:`ProbeRun.stop` without one (Ctrl-C).
INTERRUPTED = "interrupted by the user"
#: Lag p99 above this means the probe could not keep its schedule.
SCHEDULE_LAG_LIMIT_MS = 2.0
#: Fewest finished requests in the window before the abort ratio is trusted (fewer at low rates).
ABORT_MIN_REQUESTS = 10
_TICK_S = 0.1
#: With the automatic collector paused, collect the young generations once this many tracked
#: objects have accumulated (cyclic garbage from failures, or growth): a few ms, rarely.
_GC_BUDGET_OBJECTS = 100_000


@dataclass(slots=True)
class _RequestTiming:
    """Timestamps the tracing hooks fill in for the request running in the current task."""

    connect_start: float = 0.0
    tcp_end: float = 0.0
    connect_end: float = 0.0


_current_timing: contextvars.ContextVar[_RequestTiming | None] = contextvars.ContextVar(
    "diagnoser_probe_timing", default=None
)


class _TimedSocket(socket.socket):
    """A socket that notes when its TCP connect completed, to split TCP from the TLS handshake."""

    timing: _RequestTiming | None = None

    def connect(self, address: Any) -> None:
        super().connect(address)
        if self.timing is not None:
            self.timing.tcp_end = time.monotonic()

    def getsockopt(self, *args: Any) -> Any:
        value = super().getsockopt(*args)
        # The event loop asks SO_ERROR once the non-blocking connect finished.
        timing = self.timing
        if args[:2] == (socket.SOL_SOCKET, socket.SO_ERROR) and value == 0 and timing and not timing.tcp_end:
            timing.tcp_end = time.monotonic()
        return value


def _timed_socket(addr_info: Any) -> socket.socket:
    family, type_, proto, _, _ = addr_info
    sock = _TimedSocket(family=family, type=type_, proto=proto)
    timing = _current_timing.get()
    if timing is not None:
        timing.connect_start = time.monotonic()
        sock.timing = timing
    return sock


async def _on_connection_ready(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    timing = _current_timing.get()
    if timing is not None:
        timing.connect_end = time.monotonic()


def _tls_trace_config() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_connection_create_end.append(_on_connection_ready)
    return config


@dataclass
class LiveStats:
    """What the live progress view shows; read it with :meth:`ProbeRun.live`."""

    elapsed_s: float
    planned_s: float
    sent: int
    finished: int
    failures: int
    achieved_rate: float
    recent_p99_ms: float | None
    in_flight: int


class ProbeRun:
    """One run of one probe. Create it, then ``await run()``; ``stop()`` ends it early."""

    def __init__(
        self,
        spec: ProbeSpec,
        settings: ProbeSettings,
        *,
        transport_factory: Callable[[ProbeSpec, int], httpx.AsyncBaseTransport] | None = None,
        precise_timer: bool = True,
        pause_gc: bool = True,
        base_dir: Path | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.timeout_s = _first(spec.timeout_s, settings.request_timeout_s)
        self.abort_ratio = _first(spec.abort_error_ratio, settings.abort_error_ratio)
        self.abort_window_s = _first(spec.abort_window_s, settings.abort_window_s)
        # Little's law: enough connections for the peak rate even if every request ran to its timeout.
        needed = math.ceil(spec.peak_rate * self.timeout_s)
        self.pool_size = spec.max_connections or max(16, min(10000, needed))
        self.recorder = ProbeRecorder()
        self._transport_factory = transport_factory or aiohttp_transport
        self._precise_timer = precise_timer
        self._pause_gc = pause_gc
        self._bodies = spec.request_bodies(base_dir)
        self._json_path = parse_json_path(spec.expect.json_path) if spec.expect.json_path else None
        self._stop = asyncio.Event()
        self._abort_reason: str | None = None
        #: In-flight requests and their deadlines; finished ones leave at once (no GC pressure).
        self._in_flight: dict[asyncio.Task[None], float] = {}
        self._timed_out: set[asyncio.Task[None]] = set()
        self._transport: httpx.AsyncBaseTransport | None = None
        self._timer: PreciseTimer | None = None
        self._start = 0.0
        self._end: float | None = None
        # Finished and failed counts per tick, for the sliding abort window.
        slots = max(1, math.ceil(self.abort_window_s / _TICK_S))
        expected_in_window = spec.peak_rate * self.abort_window_s
        self._abort_min = max(3, min(ABORT_MIN_REQUESTS, math.ceil(expected_in_window / 2)))
        self._window_done = [0] * slots
        self._window_bad = [0] * slots
        self._window_slot = 0

    # -- control ------------------------------------------------------------------------------

    def stop(self, reason: str = INTERRUPTED) -> None:
        """End the run early; in-flight requests finish (up to their timeout), then the result is built."""
        if self._abort_reason is None:
            self._abort_reason = reason
        self._stop.set()
        if self._timer is not None:
            self._timer.interrupt()

    def live(self) -> LiveStats:
        """A snapshot for the progress view; resets the recent-latency window it reads."""
        now = time.monotonic()
        elapsed = max(0.0, (self._end or now) - self._start) if self._start else 0.0
        rec = self.recorder
        recent = rec.recent
        p99 = recent.get_value_at_percentile(99) / 1000.0 if recent.get_total_count() else None
        recent.reset()
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

    async def run(self) -> ProbeResult:
        transport = self._transport_factory(self.spec, self.pool_size)
        self._transport = transport
        requests = [self._build_request(body) for body in self._bodies]
        timer = make_timer(precise=self._precise_timer)
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
            self._start = time.monotonic() + 0.02
            watchdog = asyncio.get_running_loop().create_task(self._watch())
            await self._send_all(requests, timer)
            self._end = time.monotonic()
            await self._drain()
        finally:
            timer.close()
            if watchdog is not None:
                watchdog.cancel()
            leftovers = list(self._in_flight)
            for task in leftovers:
                task.cancel()
            if leftovers:
                await asyncio.gather(*leftovers, return_exceptions=True)
            await transport.aclose()
            if paused_gc:
                gc.unfreeze()
                gc.enable()
        return self._result()

    def _build_request(self, body: bytes | None) -> httpx.Request:
        headers = {"User-Agent": USER_AGENT, **self.spec.headers}
        return httpx.Request(self.spec.method, self.spec.target, headers=headers, content=body)

    async def _send_all(self, requests: list[httpx.Request], timer: PreciseTimer) -> None:
        loop = asyncio.get_running_loop()
        spec = self.spec
        rng = random.Random(spec.seed)
        end = self._start + spec.duration_s
        count = len(requests)
        stop = self._stop
        in_flight = self._in_flight
        timeout = self.timeout_s
        pool_size = self.pool_size
        recorder = self.recorder
        offsets = arrival_offsets(spec.schedule.segments(), spec.schedule.arrivals, rng)
        for index, offset in enumerate(offsets):
            intended = self._start + offset
            if intended > time.monotonic():
                await timer.wait_until(intended)
            if stop.is_set():
                return
            if len(in_flight) >= pool_size:
                # Every connection is busy: this request will queue for one inside the client.
                recorder.pool_waits += 1
            task = loop.create_task(self._one(requests[index % count], intended))
            recorder.sent += 1
            in_flight[task] = intended + timeout
            task.add_done_callback(self._forget)
        # Hold the schedule's full duration, so the achieved rate is per planned second.
        if end > time.monotonic() and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), end - time.monotonic())

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._timed_out.discard(task)

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
        within a tick, and the per-request cost stays a dictionary entry.
        """
        slots = len(self._window_done)
        while True:
            await asyncio.sleep(_TICK_S)
            now = time.monotonic()
            for task, deadline in list(self._in_flight.items()):
                if deadline <= now and task not in self._timed_out:
                    self._timed_out.add(task)
                    task.cancel()
            done = sum(self._window_done)
            bad = sum(self._window_bad)
            if done >= self._abort_min and bad / done > self.abort_ratio and not self._stop.is_set():
                self.stop(
                    f"error ratio {bad / done:.0%} over the last {self.abort_window_s:g} s passed the "
                    f"abort threshold of {self.abort_ratio:.0%} ({bad} of {done} requests failed)"
                )
            if not gc.isenabled() and gc.get_count()[0] > _GC_BUDGET_OBJECTS:
                gc.collect(1)
            self._window_slot = (self._window_slot + 1) % slots
            self._window_done[self._window_slot] = 0
            self._window_bad[self._window_slot] = 0

    async def _one(self, request: httpx.Request, intended: float) -> None:
        sent_at = time.monotonic()
        timing = _RequestTiming()
        _current_timing.set(timing)
        status: int | None = None
        failure: str | None = None
        headers_at: float | None = None
        chunks: list[bytes] = []
        size = 0
        content_length: int | None = None
        content_type: str | None = None
        error: str | None = None
        timed_out = False
        expect = self.spec.expect
        transport = self._transport
        assert transport is not None
        try:
            response = await transport.handle_async_request(request)
            headers_at = time.monotonic()
            try:
                status = response.status_code
                content_type = response.headers.get("content-type")
                length_header = response.headers.get("content-length")
                content_length = int(length_header) if length_header and length_header.isdigit() else None
                try:
                    async for chunk in response.aiter_raw():
                        chunks.append(chunk)
                        size += len(chunk)
                        if size > expect.max_body_bytes:
                            failure = "too_large"
                            break
                except httpx.HTTPError as exc:
                    # Fewer bytes than Content-Length announced: the body was cut off.
                    error = _describe_error(exc)
                    cut_off = content_length is not None and size < content_length
                    failure = "truncated" if cut_off else "read_error"
            finally:
                await response.aclose()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task not in self._timed_out:
                raise
            timed_out = True
            failure = "timeout"
            error = f"no complete response within {self.timeout_s:g} s"
        except httpx.HTTPError as exc:
            failure = _classify(exc)
            error = _describe_error(exc)
        except (aiohttp.ClientError, OSError, ssl.SSLError) as exc:
            connect = isinstance(exc, aiohttp.ClientConnectorError | OSError)
            failure = "connect_error" if connect else "read_error"
            error = _describe_error(exc)
        done_at = time.monotonic()
        body = b"".join(chunks)
        if failure is None and status is not None:
            failure = check_response(
                expect,
                self._json_path,
                status=status,
                content_type=content_type,
                content_length=content_length,
                body=body,
                method=self.spec.method,
            )
        connect_s = tls_s = None
        if timing.connect_start:
            connect_end = timing.connect_end or timing.tcp_end
            if timing.connect_end and timing.tcp_end:
                connect_s = timing.tcp_end - timing.connect_start
                tls_s = timing.connect_end - timing.tcp_end
            elif connect_end:
                connect_s = connect_end - timing.connect_start
        ready_at = max(sent_at, timing.connect_end, timing.tcp_end)
        self.recorder.record(
            # A partial (truncated) answer and a timeout are what the user got: their latency counts.
            latency_s=(done_at - intended) if (status is not None or timed_out) else None,
            service_s=done_at - sent_at,
            lag_s=sent_at - intended,
            opened_connection=bool(timing.connect_start),
            connect_s=connect_s,
            tls_s=tls_s,
            # A request that timed out before its first byte spent the whole wait "waiting".
            ttfb_s=(headers_at if headers_at is not None else done_at) - ready_at
            if headers_at is not None or timed_out
            else None,
            body_s=(done_at - headers_at) if headers_at is not None else None,
            status=status,
            failure=failure,
        )
        slot = self._window_slot
        self._window_done[slot] += 1
        if failure in _OVERLOAD_FAILURES:
            self._window_bad[slot] += 1
        if failure is not None and self.recorder.wants_example(failure):
            self.recorder.sample(
                ResponseExample(
                    kind=failure,
                    status=status,
                    body=body.decode("utf-8", "replace") if status is not None else None,
                    content_length=content_length,
                    received_bytes=len(body) if status is not None else None,
                    error=error,
                )
            )

    def _result(self) -> ProbeResult:
        end = self._end or time.monotonic()
        elapsed = max(0.0, end - self._start)
        return self.recorder.build(
            target=self.spec.target,
            requested_rate=_mean_rate(self.spec),
            elapsed_s=elapsed,
            aborted=self._stop.is_set(),
            abort_reason=self._abort_reason if self._stop.is_set() else None,
            lag_limit_ms=SCHEDULE_LAG_LIMIT_MS,
        )


#: Failures that can mean an overloaded target; only they count toward the abort. A wrong but
#: fast body is what the probe is here to measure, not a reason to stop.
_OVERLOAD_FAILURES = frozenset({"status", "timeout", "connect_error", "read_error"})


def _first(value: float | None, default: float) -> float:
    return value if value is not None else default


def _mean_rate(spec: ProbeSpec) -> float:
    segments = spec.schedule.segments()
    return sum(s.expected_requests for s in segments) / sum(s.duration_s for s in segments)


def _describe_error(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    text = str(cause) or type(cause).__name__
    errno = getattr(getattr(cause, "os_error", None), "errno", None) or getattr(cause, "errno", None)
    if isinstance(errno, int) and errno > 0:
        # "Connect call failed" says nothing; the errno says refused, unreachable, reset...
        text = f"{text} ({os.strerror(errno)})"
    return f"{type(cause).__name__}: {text}"[:300]


def _classify(exc: httpx.HTTPError) -> str:
    """httpx-aiohttp maps several aiohttp errors onto one httpx type; the cause tells them apart."""
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ClientConnectorError) or isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(cause, aiohttp.ServerTimeoutError) or (
        isinstance(exc, httpx.TimeoutException) and cause is None
    ):
        return "timeout"
    if isinstance(cause, aiohttp.ClientPayloadError):
        return "truncated"
    return "read_error"


def aiohttp_transport(spec: ProbeSpec, pool_size: int) -> httpx.AsyncBaseTransport:
    """httpx's transport API over an aiohttp connection pool of ``pool_size`` connections.

    A socket factory notes when each new connection's TCP connect starts and ends (cheap, no
    per-request cost); for https, aiohttp's tracing adds the end of the TLS handshake. Tracing is
    left off for plain http because it costs every request several coroutine calls.
    """
    https = spec.target.startswith("https:")
    ssl_context: ssl.SSLContext | bool = True
    if https:
        ssl_context = ssl.create_default_context()
        if not spec.verify_tls:
            ssl_context.check_hostname = False
            ssl_context.verify_mode = ssl.CERT_NONE
    connector = aiohttp.TCPConnector(
        limit=pool_size,
        limit_per_host=pool_size,
        ssl=ssl_context,
        socket_factory=_timed_socket,
        keepalive_timeout=30,
    )
    session = aiohttp.ClientSession(
        connector=connector,
        trace_configs=[_tls_trace_config()] if https else None,
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding",),
    )
    return AiohttpTransport(client=session)
