"""Limits on the daemon's HTTP listener: a cap on open connections and a deadline for request headers.

aiohttp's server has neither: a client that opens connections and sends half a request line
holds a socket and a task each for as long as it likes. :func:`start_limited_server` serves an
:class:`aiohttp.web.AppRunner`'s application through a thin protocol wrapper that:

- answers ``503`` and closes a connection beyond ``max_connections`` at once;
- answers ``408`` and closes a connection whose first request's headers are not complete
  ``header_timeout_s`` after it opened (later requests on a kept-alive connection are bounded
  by aiohttp's ``keepalive_timeout``, which the daemon sets to the same value). ::

    limits = ConnectionLimits(max_connections=100, header_timeout_s=10, on_drop=count)
    server = await start_limited_server(runner, "127.0.0.1", 8080, limits)
    ...
    server.close()
    await runner.cleanup()
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from aiohttp import web

__all__ = ["ConnectionLimits", "start_limited_server"]

_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
)
_TOO_SLOW = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_END_OF_HEADERS = b"\r\n\r\n"


@dataclass
class ConnectionLimits:
    """The limits, and the count of connections open now."""

    max_connections: int
    header_timeout_s: float
    #: Called with ``"connection_cap"`` or ``"header_timeout"`` for each connection dropped.
    on_drop: Callable[[str], None] = field(default=lambda reason: None)
    open: int = 0


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
        self._timer: asyncio.TimerHandle | None = None
        self._head_tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        if self._limits.open >= self._limits.max_connections:
            self._limits.on_drop("connection_cap")
            transport.write(_TOO_MANY)
            transport.close()
            return
        self._limits.open += 1
        self._counted = True
        self._timer = self._loop.call_later(self._limits.header_timeout_s, self._headers_too_slow)
        self._inner.connection_made(transport)

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
            self._head_tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._counted else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counted:
            self._counted = False
            self._limits.open -= 1
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
