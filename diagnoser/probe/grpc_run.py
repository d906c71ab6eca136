"""The open loop over gRPC: unary calls on a few HTTP/2 channels, each call leaving on schedule.

:class:`GrpcProbeRun` is :class:`~diagnoser.probe.open_loop.ProbeRun` with another transport
and another answer check; the schedule, the timer, timeouts, the abort rule and the recorder
are the open loop's own. ``ProbeRun(spec, settings)`` makes one for a ``grpc://`` spec.

- **Channels.** ``grpc.channels`` grpc.aio channels (default 2), each its own HTTP/2
  connection (a local subchannel pool), used in turn; each carries many concurrent calls. They
  connect to the address the resolved-address rule accepted, with retries off.
- **Timing.** Latency from the intended send time, as for HTTP. Phases where gRPC shows them:
  ``connect`` for the first call on each channel (until the channel is ready; TLS included for
  grpcs), ``ttfb`` from the call's start to its response (a unary answer arrives whole).
- **Statuses.** ``status_counts`` are keyed by gRPC status name (``OK``, ``UNAVAILABLE``...).
  A call that never reached the server (the channel could not connect) has no status: it is a
  ``connect_error``, as for HTTP. ``DEADLINE_EXCEEDED`` (the per-call deadline is the spec's
  timeout) is a ``timeout``; any other status but ``OK`` a ``status`` failure.
- **Answers.** An ``OK`` is checked as a message (:func:`diagnoser.probe.validate.check_message`):
  an empty message, a JSON path that must be present, a map or list that must not be empty.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio

from diagnoser.probe.grpc_schema import GrpcSchema, channel_credentials, channel_options, dial_address
from diagnoser.probe.grpc_target import GrpcTarget
from diagnoser.probe.http1_connection import RequestTimings
from diagnoser.probe.open_loop import ProbeRun, ProbeTransport
from diagnoser.probe.parts import RunPart
from diagnoser.probe.result import Percentiles, ProbeResult, ResponseExample
from diagnoser.probe.spec import effective_caps
from diagnoser.probe.validate import check_message

__all__ = ["GrpcAnswer", "GrpcProbeRun", "GrpcTransport"]

#: The sweep of the open loop ends a call this long after its gRPC deadline: the deadline ends
#: it first (as DEADLINE_EXCEEDED), the sweep only a call the library failed to end.
_SWEEP_GRACE_S = 0.5


#: How gRPC's client says that no connection could be made (its pick-first policy's words).
_CONNECT_FAILURE = "failed to connect"
#: How it says that an answer was over ``grpc.max_receive_message_length``.
_TOO_LARGE = "larger than max"


class GrpcAnswer:
    """How one call ended: its status name, the response bytes (``OK``), the details."""

    __slots__ = ("code", "details", "payload")

    def __init__(self, code: str, payload: bytes | None, details: str) -> None:
        self.code = code
        self.payload = payload
        self.details = details


class GrpcTransport:
    """A few grpc.aio channels to one address; ``start`` sends one unary call on the next one."""

    def __init__(
        self,
        channels: list[grpc.aio.Channel],
        method: str,
        *,
        metadata: tuple[tuple[str, str], ...],
        deadline_s: float,
    ) -> None:
        self._channels = channels
        self._calls: list[grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = [
            c.unary_unary(method) for c in channels
        ]
        self._used = [False] * len(channels)
        self._ready: list[float] = [0.0] * len(channels)
        self._watchers: list[asyncio.Task[None]] = []
        self._next = 0
        self._metadata = metadata
        self._deadline_s = deadline_s

    def start(self, request: bytes, timings: RequestTimings) -> asyncio.Future[GrpcAnswer]:
        index = self._next
        self._next = (index + 1) % len(self._calls)
        loop = asyncio.get_running_loop()
        timings.sent = time.monotonic()
        if not self._used[index]:
            # The channel connects with its first call: that call pays for (and shows) the connect.
            self._used[index] = True
            timings.connect_start = timings.sent
            self._watchers.append(loop.create_task(self._watch_ready(index)))
        call = self._calls[index](request, timeout=self._deadline_s, metadata=self._metadata)
        return loop.create_task(self._finish(call, index, timings))

    async def _watch_ready(self, index: int) -> None:
        await self._channels[index].channel_ready()
        self._ready[index] = time.monotonic()

    async def _finish(self, call: Any, index: int, timings: RequestTimings) -> GrpcAnswer:
        try:
            payload: bytes = await call
            answer = GrpcAnswer("OK", payload, "")
        except grpc.aio.AioRpcError as exc:
            answer = GrpcAnswer(exc.code().name, None, exc.details() or "")
        timings.done = timings.first_byte = time.monotonic()
        if timings.connect_start and self._ready[index]:
            timings.tcp_end = self._ready[index]
        return answer

    async def aclose(self) -> None:
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*(channel.close() for channel in self._channels), return_exceptions=True)


class GrpcProbeRun(ProbeRun):
    """The open loop of :class:`ProbeRun`, sending unary gRPC calls (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schema = GrpcSchema.of(self.spec)
        self.call_deadline_s = self.timeout_s
        self.timeout_s = self.timeout_s + _SWEEP_GRACE_S
        assert self.spec.grpc is not None
        # The config's connection cap holds for channels too (each is one connection).
        self.pool_size = min(self.spec.grpc.channels, effective_caps(self.settings)[3])

    async def _open_transport(self) -> ProbeTransport:
        target: GrpcTarget = self.schema.target
        address = await asyncio.to_thread(
            dial_address, target, self.settings, explicit_target=self._explicit_target
        )
        credentials = await asyncio.to_thread(channel_credentials, target, self.spec.verify_tls)
        options = channel_options(self.spec, target)
        channels = [
            grpc.aio.secure_channel(address, credentials, options)
            if credentials is not None
            else grpc.aio.insecure_channel(address, options)
            for _ in range(self.pool_size)
        ]
        # gRPC metadata keys are lower case; the user agent is the channel's (see channel_options).
        metadata = tuple((k.lower(), v) for k, v in self.spec.headers.items() if k.lower() != "user-agent")
        return GrpcTransport(channels, target.path, metadata=metadata, deadline_s=self.call_deadline_s)

    def _build_request(self, body: bytes | None) -> bytes:
        return self.schema.encode_request(body)

    def _answered(
        self, intended: float, started: float, timings: RequestTimings, pending: asyncio.Future[Any]
    ) -> None:
        timed_out = self._settled(pending)
        if timed_out is None:
            return  # the run ended with it in flight: not an answer
        status: str | None = None
        failure: str | None
        body: str | None = None
        error: str | None = None
        exc = None if timed_out else pending.exception()
        if timed_out:
            failure, error = "timeout", f"no answer within {self.call_deadline_s:g} s"
        elif exc is not None:
            failure, error = "read_error", f"{type(exc).__name__}: {exc}"[:300]
        else:
            answer: GrpcAnswer = pending.result()
            status, failure, body, error = self._judge(answer)
        done_at = timings.done or time.monotonic()
        if status == "DEADLINE_EXCEEDED":
            # The client's own deadline: counted under its status, but, like an HTTP timeout, not
            # as an answer (a capacity step's served rate counts answers).
            self._record(timings, intended, started, done_at, None, failure, True)
            counts = self.recorder.status_counts
            counts[status] = counts.get(status, 0) + 1
        else:
            self._record(timings, intended, started, done_at, status, failure, timed_out)
        if failure is not None and self.recorder.wants_example(failure):
            self.recorder.sample(ResponseExample(kind=failure, status=status, body=body, error=error))

    def _result(self) -> ProbeResult:
        result = super()._result()
        # A unary answer arrives whole: there is no download phase to show.
        result.phases_ms.body = Percentiles()
        return result

    def part(self, cpu_s: float = 0.0) -> RunPart:
        part = super().part(cpu_s)
        part.histograms["body"] = ""  # as in _result: no download phase, whatever the recorder saw
        return part

    def _judge(self, answer: GrpcAnswer) -> tuple[str | None, str | None, str | None, str | None]:
        """``(status, failure, body as JSON, error)`` of one answer."""
        code = answer.code
        if code == "OK":
            failure, body = check_message(
                self.spec.expect, self._json_path, answer.payload or b"", self.schema.response_json
            )
            return code, failure, body, None
        error = f"{code}: {answer.details}"[:300]
        if code == "DEADLINE_EXCEEDED":
            return code, "timeout", None, error
        details = answer.details.lower()
        if code == "UNAVAILABLE" and _CONNECT_FAILURE in details:
            # The library's own UNAVAILABLE: no connection to the server, no answer from it.
            return None, "connect_error", None, error
        if code == "RESOURCE_EXHAUSTED" and _TOO_LARGE in details:
            return code, "too_large", None, error
        return code, "status", None, error
