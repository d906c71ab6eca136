"""One HTTP/1.1 keep-alive connection of the probe's transport, and what one exchange yields.

:class:`Http1Connection` is an :class:`asyncio.Protocol` carrying one request at a time: it writes
the request bytes, feeds what arrives to ``httptools``' response parser (llhttp, in C) and
resolves one future with the whole answer (a :class:`RawResponse`), stamping each phase into the
request's :class:`RequestTimings` on the ``time.monotonic()`` clock as the parser's callbacks
fire. Its owner (:class:`~diagnoser.probe.http1_pool.ConnectionPool`) takes it back when the
answer is complete and the server keeps the connection alive. A cancelled request, an answer
nobody asked for or a malformed one drops the connection: a late answer must never reach the
next request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol, cast

import httptools
import httpx

__all__ = ["ConnectionOwner", "Headers", "Http1Connection", "IncompleteBody", "RawResponse", "RequestTimings"]

Headers = list[tuple[bytes, bytes]]


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

    Raised from :meth:`~diagnoser.probe.http1.Http1Transport.handle_async_request`, ``response`` is
    ``partial`` as an ``httpx.Response``.
    """

    def __init__(self, message: str, partial: RawResponse) -> None:
        super().__init__(message)
        self.partial = partial
        self.response: httpx.Response | None = None


@dataclass(slots=True)
class RawResponse:
    """A whole answer as read off the wire, before any httpx object is made of it."""

    status: int
    headers: Headers
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


class ConnectionOwner(Protocol):
    """What a connection needs from the pool it belongs to."""

    loop: asyncio.AbstractEventLoop
    #: The transport is closing: a request cut off now is the caller's doing, not the server's.
    closing: bool

    def release(self, connection: Http1Connection) -> None:
        """The exchange finished and the connection stays open: it may carry the next request."""

    def forget(self, connection: Http1Connection) -> None:
        """The connection closed: its slot is free."""


class Http1Connection(asyncio.Protocol):
    """One keep-alive connection; it carries one request at a time."""

    def __init__(self, pool: ConnectionOwner) -> None:
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
        self._headers: Headers = []
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
        if len(name) not in _INTERESTING_LENGTHS:
            return  # most headers (Date, Server, Connection...): no lower-casing per request
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


#: Lengths of the header names the parser looks at: content-type, content-length, transfer-encoding.
_INTERESTING_LENGTHS = frozenset({12, 14, 17})


class _UnsolicitedAnswer(Exception):
    """Raised inside the parser to stop it at an answer nobody asked for."""
