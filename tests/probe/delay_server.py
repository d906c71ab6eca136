"""A small HTTP/1.1 server for probe tests and the benchmark, run as its own process.

It records its own service time (request parsed -> response written) for every ``/delay``
request: the physical reference no client can beat. Routes::

    GET  /delay?ms=20          200 {"features": {"a": 1}} after ms milliseconds
    GET  /empty-object         200 {}
    GET  /empty-features       200 {"features": {}}
    GET  /empty                200 with an empty body
    GET  /truncated            Content-Length: 100, 20 bytes sent, then the connection closes
    GET  /unavailable          503 {"error": "UNAVAILABLE"}
    GET  /close?ms=5           like /delay, but answers "Connection: close" (no reuse)
    GET  /serial?ms=10         like /delay, but one request at a time over every connection, in
                               arrival order: at most 1000/ms req/s, and a queue beyond that
    GET  /limited?rps=100      a token bucket (refilled at rps, holding a tenth of a second of it):
                               200 while it holds a token, else at once 503 (a plain rate limiter)
    POST /control/stall?ms=1000&after_s=2   every request arriving in that window waits for its end
    GET  /stats                {"count": .., "p50_ms": .., "p99_ms": .., "max_ms": ..}
    POST /stats/reset

Written on raw asyncio protocols (keep-alive, one request at a time per connection) so the
server is cheap and in full control of the bytes it sends, including wrong Content-Lengths.
Start: ``python delay_server.py [--port 0] [--uvloop] [--tls CERT KEY]``; it prints ``PORT <n>`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from urllib.parse import parse_qs, urlsplit

from hdrh.histogram import HdrHistogram

_FEATURES = b'{"features": {"a": 1}}'


class ServerState:
    def __init__(self) -> None:
        self.histogram = HdrHistogram(1, 60_000_000, 3)
        self.stall_start = 0.0
        self.stall_end = 0.0
        #: When the serial route's one server is free again.
        self.serial_free_at = 0.0
        #: The limited route's buckets by rate: (tokens, when last refilled).
        self.buckets: dict[float, tuple[float, float]] = {}

    def take_token(self, rps: float, now: float) -> bool:
        """One token from the bucket of ``rps`` (burst: a tenth of a second of it, at least one)."""
        burst = max(1.0, rps / 10)
        tokens, since = self.buckets.get(rps, (burst, now))
        tokens = min(burst, tokens + (now - since) * rps)
        taken = tokens >= 1.0
        self.buckets[rps] = (tokens - 1.0 if taken else tokens, now)
        return taken

    def stats(self) -> dict[str, float | int | None]:
        h = self.histogram
        count = h.get_total_count()
        if not count:
            return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
        values = h.get_percentile_to_value_dict([50, 99])
        return {
            "count": count,
            "p50_ms": values[50] / 1000,
            "p99_ms": values[99] / 1000,
            "max_ms": h.get_max_value() / 1000,
        }


def _response(
    status: int, body: bytes, *, reason: str = "OK", close: bool = False, length: int | None = None
) -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n"
        f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
    )
    return head.encode() + body


class DelayProtocol(asyncio.Protocol):
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].decode("latin-1")
        lines = head.split("\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length :]
        method, target, _ = lines[0].split(" ", 2)
        self._handle(method, target, time.monotonic())

    def _send(self, payload: bytes, *, close: bool = False) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(payload)
        if close:
            self.transport.close()
            return
        self.busy = False
        self._next()

    def _handle(self, method: str, target: str, received: float) -> None:
        parts = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        path = parts.path
        loop = asyncio.get_running_loop()
        state = self.state
        self.busy = True
        if path in ("/delay", "/close"):
            delay = float(query.get("ms", "0")) / 1000
            wake = received + delay
            if state.stall_start <= received < state.stall_end:
                wake = max(wake, state.stall_end)
            close = path == "/close"

            def answer() -> None:
                self._send(_response(200, _FEATURES, close=close), close=close)
                state.histogram.record_value(max(1, int((time.monotonic() - received) * 1e6)))

            if wake <= received:
                answer()
            else:
                loop.call_at(wake, answer)
        elif path == "/serial":
            # A single server: each request starts when the one before it is done.
            wake = max(received, state.serial_free_at) + float(query.get("ms", "10")) / 1000
            state.serial_free_at = wake
            loop.call_at(wake, lambda: self._send(_response(200, _FEATURES)))
        elif path == "/limited":
            if state.take_token(float(query.get("rps", "100")), received):
                self._send(_response(200, _FEATURES))
            else:
                self._send(_response(503, b'{"error": "rate limited"}', reason="Service Unavailable"))
        elif path == "/empty-object":
            self._send(_response(200, b"{}"))
        elif path == "/empty-features":
            self._send(_response(200, b'{"features": {}}'))
        elif path == "/empty":
            self._send(_response(200, b""))
        elif path == "/truncated":
            self._send(_response(200, b'{"features": {"a": 1', length=100), close=True)
        elif path == "/unavailable":
            self._send(_response(503, b'{"error": "UNAVAILABLE"}', reason="Service Unavailable"))
        elif path == "/control/stall" and method == "POST":
            after = float(query.get("after_s", "0"))
            state.stall_start = time.monotonic() + after
            state.stall_end = state.stall_start + float(query.get("ms", "1000")) / 1000
            self._send(_response(200, b'{"armed": true}'))
        elif path == "/stats" and method == "GET":
            self._send(_response(200, json.dumps(state.stats()).encode()))
        elif path == "/stats/reset" and method == "POST":
            state.histogram.reset()
            self._send(_response(200, b'{"reset": true}'))
        else:
            self._send(_response(404, b'{"error": "not found"}', reason="Not Found"))


async def serve(port: int, tls: tuple[str, str] | None = None) -> None:
    state = ServerState()
    loop = asyncio.get_running_loop()
    context = None
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
    server = await loop.create_server(
        lambda: DelayProtocol(state), "127.0.0.1", port, backlog=4096, ssl=context
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"PORT {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve https with this certificate")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.install()
    try:
        asyncio.run(serve(args.port, tuple(args.tls) if args.tls else None))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
