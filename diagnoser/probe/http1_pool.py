"""The connections of the probe's transport to one origin: name resolution, the address rule,
the TCP connect and TLS handshake, keep-alive reuse and the connection limit.

:class:`ConnectionPool` hands out the most recently used idle connection, opens a new one while
under its limit, and otherwise queues the request until a connection is released or a slot frees
(a request that waited is marked in its :class:`~diagnoser.probe.http1_connection.RequestTimings`).
The address guard is checked at every connect, since a name may resolve elsewhere than when the
run was allowed; IP literals skip the resolver's thread-pool hop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from diagnoser.probe.http1_connection import Http1Connection, RequestTimings

__all__ = ["KEEPALIVE_EXPIRY_S", "ConnectionPool"]

AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]

#: Idle connections older than this are closed rather than reused (httpx's default is 5 s).
KEEPALIVE_EXPIRY_S = 4.0


class ConnectionPool:
    """Connections to one origin: idle ones are reused most-recent first, at most ``limit`` open."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        limit: int,
    ) -> None:
        self.loop = loop
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.limit = limit
        self.idle: list[Http1Connection] = []
        self.open: set[Http1Connection] = set()
        #: Slots taken by connections open or being opened.
        self.taken = 0
        self.waiters: deque[asyncio.Future[Http1Connection | None]] = deque()
        self.opened = 0
        self.closing = False
        self.address_guard: Callable[[str, str], str | None] | None = None

    async def acquire(self, timings: RequestTimings) -> Http1Connection:
        """An idle connection, a new one if the limit allows, else the next one released."""
        while True:
            connection = self.take_idle()
            if connection is not None:
                return connection
            if self.taken < self.limit:
                self.taken += 1
                break
            timings.pool_wait = True
            handed = await self._wait()
            if handed is None:
                break  # a slot freed by a closed connection, already counted as ours
            if handed.usable:
                return handed
        try:
            return await self._connect(timings)
        except BaseException:
            self.taken -= 1
            self._wake_opener()
            raise

    def take_idle(self) -> Http1Connection | None:
        """The most recently used idle connection, if any.

        A connection idle for longer than ``KEEPALIVE_EXPIRY_S`` is closed instead: servers close
        idle connections on their own timer (Node.js after 5 s), and a request sent just as that
        close arrives fails; the probe never retries.
        """
        idle = self.idle
        while idle:
            connection = idle.pop()
            if not connection.usable:
                continue
            if time.monotonic() - connection.idle_since > KEEPALIVE_EXPIRY_S:
                connection.close()
                continue
            return connection
        return None

    async def _wait(self) -> Http1Connection | None:
        waiter: asyncio.Future[Http1Connection | None] = self.loop.create_future()
        self.waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Handed a connection (or a slot) just as the wait was cancelled: pass it on.
                connection = waiter.result()
                if connection is not None:
                    self.release(connection)
                else:
                    self.taken -= 1
                    self._wake_opener()
            raise

    def release(self, connection: Http1Connection) -> None:
        """A connection finished its exchange: hand it to the longest waiter, or keep it idle."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self.idle.append(connection)

    def forget(self, connection: Http1Connection) -> None:
        """A connection closed: its slot is free."""
        if connection in self.open:
            self.open.discard(connection)
            self.taken -= 1
            self._wake_opener()

    def _wake_opener(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.taken += 1
                waiter.set_result(None)
                return

    async def _addresses(self) -> Sequence[AddrInfo]:
        """Where to connect, without the addresses the guard refuses (checked at every connect:
        a name may resolve elsewhere than when the run was allowed)."""
        addresses = await self._resolved()
        if self.address_guard is None:
            return addresses
        allowed = [a for a in addresses if self.address_guard(self.host, str(a[4][0])) is None]
        if not allowed and addresses:
            reason = self.address_guard(self.host, str(addresses[0][4][0]))
            raise httpx.ConnectError(f"refused by the probe's address rule: {reason}")
        return allowed

    async def _resolved(self) -> Sequence[AddrInfo]:
        """An IP literal as it is, a name through the resolver."""
        try:
            ip = ipaddress.ip_address(self.host)
        except ValueError:
            pass
        else:
            # No resolver call: it runs in a thread pool, a hop that costs milliseconds under load.
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (self.host, self.port))]
        try:
            return await self.loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise httpx.ConnectError(f"cannot resolve {self.host}: {exc}") from exc

    async def _connect(self, timings: RequestTimings) -> Http1Connection:
        loop = self.loop
        # The connect phase counts from here: name resolution and every address tried.
        timings.connect_start = time.monotonic()
        addresses = await self._addresses()
        last: OSError | None = None
        for family, kind, proto, _, address in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
                timings.tcp_end = time.monotonic()
            except OSError as exc:
                sock.close()
                last = exc
                continue
            except BaseException:
                sock.close()
                raise
            connection = Http1Connection(self)
            try:
                await loop.create_connection(
                    lambda connection=connection: connection,
                    sock=sock,
                    ssl=self.ssl_context,
                    server_hostname=self.host if self.ssl_context is not None else None,
                )
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise httpx.ConnectError(f"TLS handshake with {self.host}:{self.port} failed: {exc}") from exc
            except BaseException:
                sock.close()
                raise
            if self.ssl_context is not None:
                timings.tls_end = time.monotonic()

            self.open.add(connection)
            self.opened += 1
            return connection
        raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {last}") from last

    def close(self) -> None:
        self.closing = True
        for connection in list(self.open):
            connection.close()
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_exception(
                    httpx.ConnectError("the transport was closed before a connection was free")
                )
        self.waiters.clear()
        self.idle.clear()
