"""The probe's HTTP/1.1 client: httpx's transport API on asyncio protocols and the llhttp parser.

Why the probe carries its own transport: an open-loop probe is only as good as its schedule, and
the schedule slips as soon as the sender's CPU per request approaches the gap between requests.
Measured on the 2-core reference machine against a 10 ms server (``bench/probe.py``), CPU per
request was 1.5-2 ms with httpx's default transport (httpcore), about 450 us through aiohttp
(``httpx-aiohttp``), and about 150 us with this module: a keep-alive pool of
:class:`asyncio.Protocol` connections whose responses are parsed in C by ``httptools`` (llhttp,
Node.js's parser) with no task, stream or buffer object per request beyond one future.

It is deliberately small: HTTP/1.1 only, one request at a time per connection (no pipelining),
no redirects, cookies, retries, proxies or decompression (``Accept-Encoding`` is not sent unless
the caller sets it, and the body is returned as received). What it adds is timing: every request
carries a :class:`RequestTimings` with the TCP connect, the TLS handshake, the write, the first
response byte and the end of the body, on the ``time.monotonic()`` clock.

Usage::

    transport = Http1Transport(max_connections=64)
    async with httpx.AsyncClient(transport=transport) as client:   # the usual httpx way:
        response = await client.get(url)      # response.extensions["timings"]: RequestTimings
    # or, as the probe does, without building an httpx.Response per answer:
    timings = RequestTimings()
    answer = await transport.start(httpx.Request("GET", url), timings)   # a RawResponse

Errors are httpx's: :class:`httpx.ConnectError` (with the ``OSError`` as ``__cause__``),
:class:`IncompleteBody` (a :class:`httpx.RemoteProtocolError` carrying the partial response) when
the server closes before the body it announced, :class:`httpx.RemoteProtocolError` for a
malformed response or a connection closed before any answer. Cancelling a request (a timeout)
closes its connection: the late answer must not reach the next request.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import httptools
import httpx

__all__ = ["Http1Transport", "IncompleteBody", "RawResponse", "RequestTimings"]

_Headers = list[tuple[bytes, bytes]]
_AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]

#: Idle connections older than this are closed rather than reused (httpx's default is 5 s).
KEEPALIVE_EXPIRY_S = 4.0


@dataclass(slots=True)
class RequestTimings:
    """When each phase of one request happened (``time.monotonic()``; 0.0 = did not happen)."""

    #: A new connection was opened for this request: connecting (name resolution included)
    #: started / the TCP connect finished.
    connect_start: float = 0.0
    tcp_end: float = 0.0
    #: The TLS handshake on that new connection finished (https only).
    tls_end: float = 0.0
    #: The request waited for a connection because the pool was at its limit.
    pool_wait: bool = False
    #: The request bytes were handed to the socket.
    sent: float = 0.0
    first_byte: float = 0.0
    headers_end: float = 0.0
    #: The last body byte arrived (or the body was cut at the limit).
    done: float = 0.0


class IncompleteBody(httpx.RemoteProtocolError):
    """The server closed the connection before the whole body arrived; ``partial`` has what did.

    Raised from :meth:`Http1Transport.handle_async_request`, ``response`` is ``partial`` as an
    ``httpx.Response``.
    """

    def __init__(self, message: str, partial: RawResponse) -> None:
        super().__init__(message)
        self.partial = partial
        self.response: httpx.Response | None = None


@dataclass(slots=True)
class RawResponse:
    """A whole answer as read off the wire, before any httpx object is made of it."""

    status: int
    headers: _Headers
    body: bytes
    #: Reading stopped at the body limit; the connection was closed.
    cut: bool
    #: The announced Content-Length and the Content-Type, as the parser met them.
    content_length: int | None = None
    content_type: bytes | None = None

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (``name`` in lower case)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


class _Connection(asyncio.Protocol):
    """One keep-alive connection; it carries one request at a time."""

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self.closed = False
        #: Dropped by this side; ``closed`` follows once the loop reports the close.
        self._aborted = False
        #: When it last went idle (``time.monotonic()``).
        self.idle_since = 0.0
        self._waiter: asyncio.Future[RawResponse] | None = None
        self._timings = RequestTimings()
        self._head = False
        self._limit = 0
        self._headers: _Headers = []
        self._chunks: list[bytes] = []
        self._size = 0
        self._headers_done = False
        self._content_length: int | None = None
        self._content_type: bytes | None = None
        self._chunked = False

    # -- the exchange ---------------------------------------------------------------------------

    def exchange(
        self, raw: bytes, timings: RequestTimings, *, head: bool, limit: int
    ) -> asyncio.Future[RawResponse]:
        """Write one request; the future resolves with the whole answer."""
        assert self._transport is not None
        assert self._waiter is None
        waiter: asyncio.Future[RawResponse] = self._pool.loop.create_future()
        waiter.add_done_callback(self._abort_if_cancelled)
        self._waiter = waiter
        self._timings = timings
        self._head = head
        self._limit = limit
        self._headers = []
        self._chunks = []
        self._size = 0
        self._headers_done = False
        self._content_length = None
        self._content_type = None
        self._chunked = False
        timings.sent = time.monotonic()
        self._transport.write(raw)
        return waiter

    def _abort_if_cancelled(self, waiter: asyncio.Future[RawResponse]) -> None:
        # A cancelled request (a timeout): its late answer must not reach the next one.
        if waiter.cancelled():
            self.abort()

    @property
    def usable(self) -> bool:
        return not self.closed and not self._aborted

    def abort(self) -> None:
        """Drop the connection now (the request was cancelled; its answer must not be read later)."""
        self._waiter = None
        self._aborted = True
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self._aborted = True
        if self._transport is not None:
            self._transport.close()

    def _finish(self, *, cut: bool = False) -> None:
        waiter, self._waiter = self._waiter, None
        self._timings.done = time.monotonic()
        answer = self._answer(cut)
        self._headers = []
        self._chunks = []
        if cut or not self._parser.should_keep_alive():
            self.close()
        elif self.usable:
            self.idle_since = self._timings.done
            self._pool.release(self)
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def _answer(self, cut: bool) -> RawResponse:
        return RawResponse(
            self._parser.get_status_code(),
            self._headers,
            b"".join(self._chunks),
            cut,
            self._content_length,
            self._content_type,
        )

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            # Bytes nobody asked for (a late answer, or garbage): the connection cannot be trusted.
            self.abort()
            return
        if not self._timings.first_byte:
            self._timings.first_byte = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP response: {exc}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._pool.forget(self)
        if self._waiter is None:
            return
        if self._headers_done and self._content_length is None and not self._chunked:
            # No length and not chunked: the body is whatever came before the close.
            self._finish()
            return
        reason = f" ({exc})" if exc else ""
        if self._pool.closing:
            self._fail(httpx.RemoteProtocolError("the transport was closed with this request in flight"))
            return
        if not self._headers_done:
            self._fail(httpx.RemoteProtocolError(f"server closed the connection without a response{reason}"))
            return
        expected = f"{self._content_length} announced" if self._content_length is not None else "chunked"
        answer = self._answer(cut=False)
        self._timings.done = time.monotonic()
        message = f"server closed the connection after {self._size} body bytes ({expected}){reason}"
        self._fail(IncompleteBody(message, answer))

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None:
            # Another answer right behind the one just finished, in the same read: nobody asked
            # for it. Stop parsing (the parser raises) and drop the connection.
            raise _UnsolicitedAnswer

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length":
            self._content_length = int(value) if value.strip().isdigit() else None
        elif lower == b"content-type":
            self._content_type = value
        elif lower == b"transfer-encoding" and b"chunked" in value.lower():
            self._chunked = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            # An interim answer (100 Continue, 103 Early Hints): the real one follows.
            self._headers = []
            self._content_length = None
            self._chunked = False
            return
        self._headers_done = True
        self._timings.headers_end = time.monotonic()
        if self._head:
            # A HEAD answer announces a length but has no body; llhttp cannot be told, so this
            # answer ends here and the connection gets a fresh parser for the next one.
            self._finish()
            self._parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        if self._waiter is None:
            return
        self._chunks.append(body)
        self._size += len(body)
        if self._size > self._limit:
            self._finish(cut=True)

    def on_message_complete(self) -> None:
        if self._waiter is not None and self._headers_done:
            self._finish()


class _UnsolicitedAnswer(Exception):
    """Raised inside the parser to stop it at an answer nobody asked for."""


class _Pool:
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
        self.idle: list[_Connection] = []
        self.open: set[_Connection] = set()
        #: Slots taken by connections open or being opened.
        self.taken = 0
        self.waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self.opened = 0
        self.closing = False
        self.address_guard: Callable[[str, str], str | None] | None = None

    async def acquire(self, timings: RequestTimings) -> _Connection:
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

    def take_idle(self) -> _Connection | None:
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

    async def _wait(self) -> _Connection | None:
        waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
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

    def release(self, connection: _Connection) -> None:
        """A connection finished its exchange: hand it to the longest waiter, or keep it idle."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self.idle.append(connection)

    def forget(self, connection: _Connection) -> None:
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

    async def _addresses(self) -> Sequence[_AddrInfo]:
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

    async def _resolved(self) -> Sequence[_AddrInfo]:
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

    async def _connect(self, timings: RequestTimings) -> _Connection:
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
            connection = _Connection(self)
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


class Http1Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive transport with at most ``max_connections`` connections per origin.

    ``body_limit`` bounds what is read of each body: past it reading stops, the connection is
    closed and the response carries the first ``body_limit + 1`` bytes or a little more, so the caller
    sees the limit was passed. ``verify_tls=False`` accepts any certificate.
    """

    def __init__(
        self, *, max_connections: int = 100, body_limit: int = 64 << 20, verify_tls: bool = True
    ) -> None:
        self.max_connections = max_connections
        self.body_limit = body_limit
        #: ``(host, address) -> reason or None``: an address it names is never connected to.
        self.address_guard: Callable[[str, str], str | None] | None = None
        self._verify_tls = verify_tls
        self._ssl_context: ssl.SSLContext | None = None
        self._pools: dict[tuple[str, str, int], _Pool] = {}

    @property
    def connections_opened(self) -> int:
        return sum(pool.opened for pool in self._pools.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        timings = RequestTimings()
        try:
            answer = await self.start(request, timings)
        except IncompleteBody as exc:
            exc.request = request
            exc.response = _to_httpx(request, exc.partial, timings)
            raise
        except httpx.HTTPError as exc:
            exc.request = request
            raise
        return _to_httpx(request, answer, timings)

    def start(self, request: httpx.Request, timings: RequestTimings) -> asyncio.Future[RawResponse]:
        """Send ``request`` (its body already read) and return the future of its whole answer.

        With an idle pooled connection the request is on the wire when this returns: an
        open-loop sender's "actual send time" is then the call itself, with no trip through the
        event loop's ready queue. Otherwise a task opens a connection, or waits for one when
        the pool is at its limit, and sends then. Cancelling the future closes the connection.
        """
        pool = self._pool_for(request.url)
        raw = _serialize(request, request.content)
        head = request.method == "HEAD"
        connection = pool.take_idle()
        if connection is not None:
            return connection.exchange(raw, timings, head=head, limit=self.body_limit)
        return pool.loop.create_task(self._exchange_later(pool, raw, timings, head))

    async def _exchange_later(
        self, pool: _Pool, raw: bytes, timings: RequestTimings, head: bool
    ) -> RawResponse:
        connection = await pool.acquire(timings)
        return await connection.exchange(raw, timings, head=head, limit=self.body_limit)

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        # Let the closed transports run their connection_lost callbacks.
        await asyncio.sleep(0)

    def prepare(self, url: str | httpx.URL) -> None:
        """Set up the pool for ``url`` now, TLS context included (loading the system's CA
        certificates takes tens of milliseconds), so that cost does not land on a measured request."""
        self._pool_for(httpx.URL(url))

    def _pool_for(self, url: httpx.URL) -> _Pool:
        scheme = url.scheme
        port = url.port or (443 if scheme == "https" else 80)
        key = (scheme, url.host, port)
        pool = self._pools.get(key)
        if pool is None:
            if scheme not in ("http", "https"):
                raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}: http or https only")
            context = self._tls_context() if scheme == "https" else None
            pool = _Pool(asyncio.get_running_loop(), url.host, port, context, self.max_connections)
            pool.address_guard = self.address_guard
            self._pools[key] = pool
        return pool

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            if not self._verify_tls:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._ssl_context = context
        return self._ssl_context


def _serialize(request: httpx.Request, body: bytes) -> bytes:
    parts = [request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
    chunked = False
    for name, value in request.headers.raw:
        parts += (name, b": ", value, b"\r\n")
        if name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    parts.append(b"\r\n")
    if chunked:
        # httpx announces chunked for a streamed body; it was read whole, so it goes as one chunk.
        parts += (b"%x\r\n" % len(body), body, b"\r\n0\r\n\r\n") if body else (b"0\r\n\r\n",)
    elif body:
        parts.append(body)
    return b"".join(parts)


def _to_httpx(request: httpx.Request, answer: RawResponse, timings: RequestTimings) -> httpx.Response:
    return httpx.Response(
        answer.status,
        headers=answer.headers,
        stream=httpx.ByteStream(answer.body),
        request=request,
        extensions={"http_version": b"HTTP/1.1", "timings": timings, "body_cut": answer.cut},
    )
