"""Limits on the daemon's HTTP listener: caps on open connections and a deadline for request headers.

aiohttp's server has neither: a client that opens connections and sends half a request line
holds a socket and a task each for as long as it likes. :func:`start_limited_server` serves an
:class:`aiohttp.web.AppRunner`'s application through a thin protocol wrapper that:

- answers ``503`` and closes, at once, a connection beyond ``max_per_peer`` open from the same
  address, so one client (a broken retry loop, a slowloris) cannot take the whole cap (nginx's
  ``limit_conn`` keyed by ``$binary_remote_addr`` is the same idea);
- beyond ``max_connections`` in all, keeps ``probe_reserve`` more connections for the health
  probes only (:func:`probe_reserve_middleware`); once those are taken too, a new connection
  takes the place of the oldest one that has not finished sending its first request's headers
  (answered ``503`` and closed), and only when every connection has, is it refused (``503``);
- answers ``408`` and closes a connection whose first request's headers are not complete
  ``header_timeout_s`` after it opened (later requests on a kept-alive connection are bounded
  by aiohttp's ``keepalive_timeout``, which the daemon sets to the same value). ::

    limits = ConnectionLimits(max_connections=100, max_per_peer=20, header_timeout_s=10, on_drop=count)
    runner = web.AppRunner(web.Application(middlewares=[probe_reserve_middleware(limits, {"/healthz"})]))
    await runner.setup()
    server = await start_limited_server(runner, "127.0.0.1", 8080, limits)
    ...
    server.close()
    await runner.cleanup()

Why a reserve rather than exempting the probes from the cap: which path a connection asks for is
known only once its request line arrives, and the cap must act before (the point is not to hold
sockets for clients that never send one). A few connections kept apart, as PostgreSQL keeps
``superuser_reserved_connections`` beyond ``max_connections``, let the kubelet see a daemon that
is busy but alive, where otherwise a full cap would read as a dead process and get it restarted
(kube-apiserver likewise exempts ``/healthz``, ``/livez`` and ``/readyz`` from its request
limits). A reserved connection answers one probe and is closed; anything else on it is ``503``.
The reserve obeys the per-peer limit too, so one client cannot fill it; many clients together
could, until the header deadline freed their connections, which is why a connection that has not
sent its headers yet gives its place to a new one: clients spread over many addresses that hold
half-sent requests (a slowloris) keep nobody out, since a probe's request arrives whole within
milliseconds of its connection and the oldest half-sent one is closed for it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

__all__ = ["ConnectionLimits", "probe_reserve_middleware", "start_limited_server"]

_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
)
_TOO_SLOW = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_END_OF_HEADERS = b"\r\n\r\n"


@dataclass
class ConnectionLimits:
    """The limits, and the connections open now."""

    max_connections: int
    header_timeout_s: float
    #: Connections one address may hold open (every port of it counts as the same peer).
    max_per_peer: int = 1 << 30
    #: Connections beyond ``max_connections`` kept for the health probes.
    probe_reserve: int = 0
    #: Called with ``"connection_cap"``, ``"peer_cap"`` or ``"header_timeout"`` for each connection dropped.
    on_drop: Callable[[str], None] = field(default=lambda reason: None)
    #: Connections open within ``max_connections`` (the reserved ones are not among them).
    open: int = 0
    by_peer: Counter[str] = field(default_factory=Counter)
    #: The transports of the connections open in the reserve.
    reserved: set[object] = field(default_factory=set)
    #: Connections still sending their first request's headers, oldest first (each can give its
    #: place to a new connection when every place is taken).
    waiting: dict[object, Callable[[], None]] = field(default_factory=dict)

    def admit(self, transport: asyncio.Transport, peer: str, evict: Callable[[], None]) -> str | None:
        """Count a new connection from ``peer`` in, or say why it is dropped.

        ``evict`` closes this connection should a newer one need its place before its headers
        are in (:meth:`headers_done` says they are)."""
        if self.by_peer[peer] >= self.max_per_peer:
            return "peer_cap"
        if self.open < self.max_connections:
            self.open += 1
        elif len(self.reserved) < self.probe_reserve:
            self.reserved.add(transport)
        elif self.waiting:
            oldest = next(iter(self.waiting))
            self.waiting.pop(oldest)()  # it releases its place at once, in this call
            return self.admit(transport, peer, evict)
        else:
            return "connection_cap"
        self.by_peer[peer] += 1
        self.waiting[transport] = evict
        return None

    def headers_done(self, transport: asyncio.Transport) -> None:
        """The connection's first request has all its headers: it keeps its place."""
        self.waiting.pop(transport, None)

    def release(self, transport: asyncio.Transport, peer: str) -> None:
        """Count a connection :meth:`admit` let in out again."""
        self.waiting.pop(transport, None)
        if transport in self.reserved:
            self.reserved.discard(transport)
        else:
            self.open -= 1
        self.by_peer[peer] -= 1
        if self.by_peer[peer] <= 0:
            del self.by_peer[peer]  # a Counter of every address ever seen would only grow


def _peer(transport: asyncio.BaseTransport) -> str:
    """The connection's remote address without its port (``""`` for a Unix socket)."""
    name = transport.get_extra_info("peername")
    return str(name[0]) if isinstance(name, tuple) and name else ""


class _LimitedProtocol(asyncio.Protocol):
    """Wraps aiohttp's request handler; everything it does not intercept is passed on unchanged."""

    def __init__(
        self, inner: asyncio.Protocol, limits: ConnectionLimits, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._inner = inner
        self._limits = limits
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._counted = False
        #: Closed to make room for a newer connection: aiohttp still hears of its end.
        self._evicted = False
        self._peer = ""
        self._timer: asyncio.TimerHandle | None = None
        self._head_tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        self._peer = _peer(transport)
        refused = self._limits.admit(transport, self._peer, self._evict)
        if refused is not None:
            self._limits.on_drop(refused)
            transport.write(_TOO_MANY)
            transport.close()
            return
        self._counted = True
        self._timer = self._loop.call_later(self._limits.header_timeout_s, self._headers_too_slow)
        self._inner.connection_made(transport)

    def _evict(self) -> None:
        """Give this connection's place to a newer one: it still has not sent its headers."""
        self._limits.on_drop("connection_cap")
        self._release()
        self._evicted = True
        assert self._transport is not None
        self._transport.write(_TOO_MANY)
        self._transport.close()

    def _release(self) -> None:
        """Count this connection out (once), and stop its header deadline."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counted:
            self._counted = False
            assert self._transport is not None
            self._limits.release(self._transport, self._peer)

    def _headers_too_slow(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._limits.on_drop("header_timeout")
            self._transport.write(_TOO_SLOW)
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._counted:
            return
        if self._timer is not None:
            # Only the end of the first request's headers matters; keep the last 3 bytes so a
            # terminator split across reads is still seen.
            seen = self._head_tail + data
            if _END_OF_HEADERS in seen:
                self._timer.cancel()
                self._timer = None
                assert self._transport is not None
                self._limits.headers_done(self._transport)
            self._head_tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._counted else None

    def connection_lost(self, exc: Exception | None) -> None:
        admitted = self._counted or self._evicted
        self._release()
        if admitted:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


async def start_limited_server(
    runner: web.AppRunner, host: str, port: int, limits: ConnectionLimits
) -> asyncio.Server:
    """Listen on ``host:port`` for ``runner``'s application (after ``runner.setup()``), within ``limits``."""
    loop = asyncio.get_running_loop()
    handler_factory = runner.server
    assert handler_factory is not None, "call runner.setup() first"
    return await loop.create_server(
        lambda: _LimitedProtocol(handler_factory(), limits, loop), host, port, reuse_address=True
    )


def probe_reserve_middleware(limits: ConnectionLimits, probe_paths: Collection[str]) -> Middleware:
    """An aiohttp middleware that lets a reserved connection answer one ``GET`` of ``probe_paths``.

    Any other request on a reserved connection is answered ``503`` (counted as ``connection_cap``),
    as it would have been without the reserve; either way the connection is closed afterwards,
    so the reserve is free again for the next probe.
    """

    @web.middleware
    async def reserve(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.transport not in limits.reserved:
            return await handler(request)
        response: web.StreamResponse
        if request.method == "GET" and request.path in probe_paths:
            response = await handler(request)
        else:
            limits.on_drop("connection_cap")
            response = web.Response(status=503, headers={"Retry-After": "1"})
        response.force_close()
        return response

    return reserve
