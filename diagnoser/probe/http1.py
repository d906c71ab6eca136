"""The probe's HTTP/1.1 client: httpx's transport API on asyncio protocols and the llhttp parser.

Why the probe carries its own transport: an open-loop probe is only as good as its schedule, and
the schedule slips as soon as the sender's CPU per request approaches the gap between requests.
Measured on the 2-core reference machine against a 10 ms server (``bench/probe.py``), CPU per
request was 1.5-2 ms with httpx's default transport (httpcore), about 450 us through aiohttp
(``httpx-aiohttp``), and about 150 us with this module: a keep-alive pool of
:class:`asyncio.Protocol` connections whose responses are parsed in C by ``httptools`` (llhttp,
Node.js's parser) with no task, stream or buffer object per request beyond one future. This
module is the httpx-facing transport; one connection and its parsing and timings live in
:mod:`diagnoser.probe.http1_connection`, the per-origin pool (resolve, address rule, connect, TLS,
reuse) in :mod:`diagnoser.probe.http1_pool`.

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
import ssl
from collections.abc import Callable

import httpx

from diagnoser.probe.http1_connection import IncompleteBody, RawResponse, RequestTimings
from diagnoser.probe.http1_pool import ConnectionPool

__all__ = ["Http1Transport"]

#: Requests whose wire form is kept (a probe rotates through a few; others come and go).
_PREPARED_MAX = 64


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
        self._pools: dict[tuple[str, str, int], ConnectionPool] = {}
        #: ``id(request) -> (request, pool, wire bytes, is HEAD)``: the probe sends the same few
        #: request objects thousands of times; their pool lookup and serialisation were a tenth
        #: of its CPU per request. The request is kept so its id is not reused; bounded.
        self._prepared: dict[int, tuple[httpx.Request, ConnectionPool, bytes, bool]] = {}

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
        A request object is serialised once and reused as is: do not change it between sends.
        """
        prepared = self._prepared.get(id(request))
        if prepared is None or prepared[0] is not request:
            prepared = (request, self._pool_for(request.url), _serialize(request, request.content),
                        request.method == "HEAD")  # fmt: skip
            if len(self._prepared) >= _PREPARED_MAX:
                self._prepared.clear()
            self._prepared[id(request)] = prepared
        _, pool, raw, head = prepared
        connection = pool.take_idle()
        if connection is not None:
            return connection.exchange(raw, timings, head=head, limit=self.body_limit)
        return pool.loop.create_task(self._exchange_later(pool, raw, timings, head))

    async def _exchange_later(
        self, pool: ConnectionPool, raw: bytes, timings: RequestTimings, head: bool
    ) -> RawResponse:
        connection = await pool.acquire(timings)
        return await connection.exchange(raw, timings, head=head, limit=self.body_limit)

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._prepared.clear()
        # Let the closed transports run their connection_lost callbacks.
        await asyncio.sleep(0)

    def prepare(self, url: str | httpx.URL) -> None:
        """Set up the pool for ``url`` now, TLS context included (loading the system's CA
        certificates takes tens of milliseconds), so that cost does not land on a measured request."""
        self._pool_for(httpx.URL(url))

    def _pool_for(self, url: httpx.URL) -> ConnectionPool:
        scheme = url.scheme
        port = url.port or (443 if scheme == "https" else 80)
        key = (scheme, url.host, port)
        pool = self._pools.get(key)
        if pool is None:
            if scheme not in ("http", "https"):
                raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}: http or https only")
            context = self._tls_context() if scheme == "https" else None
            pool = ConnectionPool(asyncio.get_running_loop(), url.host, port, context, self.max_connections)
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
