"""The probe's HTTP/1.1 transport (diagnoser.probe.http1) against real sockets on 127.0.0.1.

Most tests run a small in-test server (:class:`ScriptedServer`) whose handler writes exact bytes, so
the transport meets chunked bodies, bodies ended by a close, wrong lengths, garbage, HEAD answers
and closes at chosen moments, and the server side can count connections and see disconnects. The
TLS tests and the truncated-body test use the delay server process from conftest.py.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import httpx
import pytest

from diagnoser.probe import http1_pool
from diagnoser.probe.http1 import Http1Transport
from diagnoser.probe.http1_connection import IncompleteBody, RawResponse, RequestTimings
from tests.probe.conftest import DelayServer

#: Bound on every wait. A healthy exchange on loopback takes well under 10 ms.
WAIT = 2.0
#: Bound for answers that must fail at once (the parser rejects them on their first bytes).
FAILS_FAST = 0.5


# -- an in-test server that sends exactly the bytes a test chooses ---------------------------------


@dataclass
class Received:
    """One request as the server read it off the wire."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


class Peer:
    """The server side of one accepted connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        self.reader = reader
        self.writer = writer
        self.index = index
        self.requests: list[Received] = []
        #: The client closed (or reset) this connection, as seen by a read.
        self.client_closed = asyncio.Event()
        #: The handler is over and the server closed its side.
        self.closed = asyncio.Event()

    async def read_request(self) -> Received | None:
        """The next request on this connection, or None once the client has closed it."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.client_closed.set()
            return None
        lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
        assert version == "HTTP/1.1", lines[0]
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            assert colon, f"malformed header line {line!r}"
            headers.append((name, value.strip()))
        request = Received(method, target, headers, b"")
        if "chunked" in (request.header("transfer-encoding") or "").lower():
            request.body = await self._read_chunked()
        else:
            request.body = await self.reader.readexactly(int(request.header("content-length") or 0))
        self.requests.append(request)
        return request

    async def _read_chunked(self) -> bytes:
        body = b""
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                assert await self.reader.readuntil(b"\r\n") == b"\r\n", "no trailers expected"
                return body
            body += await self.reader.readexactly(size)
            assert await self.reader.readexactly(2) == b"\r\n", "chunk not followed by CRLF"

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until_client_closes(self) -> bytes:
        """Read until the client closes the connection; what it sent meanwhile."""
        extra = b""
        with suppress(ConnectionError):
            while chunk := await self.reader.read(65536):
                extra += chunk
        self.client_closed.set()
        return extra


Handler = Callable[[Peer], Awaitable[None]]


class ScriptedServer:
    """``asyncio.start_server`` on 127.0.0.1 running ``handler`` per connection; the connection is
    closed when the handler returns. Counts connections, and how many were open at once."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.peers: list[Peer] = []
        self.open_now = 0
        self.max_open = 0
        self.errors: list[BaseException] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[Received]:
        return [request for peer in self.peers for request in peer.requests]

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        if kind is None:
            assert not self.errors, f"the test server failed: {self.errors!r}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = Peer(reader, writer, len(self.peers))
        self.peers.append(peer)
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            await self.handler(peer)
        except (ConnectionError, asyncio.IncompleteReadError):
            peer.client_closed.set()
        except asyncio.CancelledError:
            pass  # the test is over
        except Exception as exc:
            self.errors.append(exc)
        finally:
            self.open_now -= 1
            writer.close()
            with suppress(Exception, asyncio.CancelledError):  # cancelled here too when the test ends
                await writer.wait_closed()
            peer.closed.set()
            self._tasks.discard(task)


def response(
    body: bytes = b"",
    *,
    status: str = "200 OK",
    headers: Sequence[tuple[str, str]] = (),
    length: bool = True,
    version: str = "HTTP/1.1",
) -> bytes:
    """The bytes of one answer; ``length=False`` leaves out Content-Length."""
    lines = [f"{version} {status}", *(f"{name}: {value}" for name, value in headers)]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def echo(peer: Peer) -> None:
    """Keep-alive: answer every request with its method and target until the client closes."""
    while (request := await peer.read_request()) is not None:
        await peer.send(response(f"{request.method} {request.target}".encode()))


@asynccontextmanager
async def opened(transport: Http1Transport) -> AsyncIterator[Http1Transport]:
    try:
        yield transport
    finally:
        await transport.aclose()


async def fetch(
    transport: Http1Transport, url: str, method: str = "GET", timings: RequestTimings | None = None
) -> RawResponse:
    """One request through the ``start`` fast path, bounded by WAIT."""
    return await asyncio.wait_for(
        transport.start(httpx.Request(method, url), timings or RequestTimings()), WAIT
    )


async def wait_until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():  # noqa: ASYNC110 - transport state has no event to wait on
            await asyncio.sleep(0.002)

    await asyncio.wait_for(poll(), WAIT)


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- the httpx client path: status, headers, body, timings, request bytes ---------------------------


async def test_get_through_httpx_client_returns_status_headers_body_and_ordered_timings() -> None:
    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            body = f"hello {request.target}".encode()
            await peer.send(response(body, status="201 Created", headers=[("X-Test", "abc")]))

    async with ScriptedServer(handler) as srv, httpx.AsyncClient(transport=Http1Transport()) as client:
        answer = await asyncio.wait_for(client.get(srv.url + "/path?q=1"), WAIT)

    assert answer.status_code == 201
    assert answer.headers["x-test"] == "abc"
    assert answer.headers["content-length"] == str(len(b"hello /path?q=1"))
    assert answer.content == b"hello /path?q=1"
    assert answer.extensions["http_version"] == b"HTTP/1.1"
    assert answer.extensions["body_cut"] is False
    timings = answer.extensions["timings"]
    assert isinstance(timings, RequestTimings)
    assert 0 < timings.connect_start <= timings.tcp_end <= timings.sent
    assert timings.sent <= timings.first_byte <= timings.headers_end <= timings.done
    assert timings.tls_end == 0.0
    assert timings.pool_wait is False


async def test_post_bytes_body_arrives_intact_with_method_target_host_and_length() -> None:
    # 256 KiB with CRLFs and every byte value: more than one socket write, nothing may be re-framed.
    body = bytes(range(256)) * 1024 + b"\r\n\r\nend"
    async with ScriptedServer(echo) as srv, httpx.AsyncClient(transport=Http1Transport()) as client:
        answer = await asyncio.wait_for(
            client.post(srv.url + "/submit?x=1&y=a%20b", content=body, headers={"X-Custom": "v"}), WAIT
        )

    assert answer.status_code == 200
    assert answer.content == b"POST /submit?x=1&y=a%20b"
    [received] = srv.requests
    assert received.method == "POST"
    assert received.target == "/submit?x=1&y=a%20b"
    assert received.header("host") == f"127.0.0.1:{srv.port}"
    assert received.header("content-length") == str(len(body))
    assert received.header("transfer-encoding") is None
    assert received.header("x-custom") == "v"
    assert received.body == body


async def test_streamed_request_body_goes_as_a_well_framed_chunked_request() -> None:
    async def parts() -> AsyncIterator[bytes]:
        yield b"first,"
        yield b"second"

    async with ScriptedServer(echo) as srv, httpx.AsyncClient(transport=Http1Transport()) as client:
        posted = await asyncio.wait_for(client.post(srv.url + "/stream", content=parts()), WAIT)
        # The same connection then carries another request: the chunked framing ended exactly.
        after = await asyncio.wait_for(client.get(srv.url + "/after"), WAIT)

    assert posted.content == b"POST /stream"
    assert after.content == b"GET /after"
    first, second = srv.requests
    assert first.header("transfer-encoding") == "chunked"
    assert first.header("content-length") is None
    assert first.body == b"first,second"
    assert second.target == "/after"
    assert len(srv.peers) == 1


# -- keep-alive and connection reuse ----------------------------------------------------------------


async def test_sequential_requests_reuse_one_connection_and_only_the_first_has_connect_timings() -> None:
    transport = Http1Transport()
    async with ScriptedServer(echo) as srv, httpx.AsyncClient(transport=transport) as client:
        answers = [await asyncio.wait_for(client.get(f"{srv.url}/n{i}"), WAIT) for i in range(3)]
        assert transport.connections_opened == 1

    assert [answer.content for answer in answers] == [b"GET /n0", b"GET /n1", b"GET /n2"]
    assert len(srv.peers) == 1
    assert [request.target for request in srv.peers[0].requests] == ["/n0", "/n1", "/n2"]
    first, *later = [answer.extensions["timings"] for answer in answers]
    assert 0 < first.connect_start <= first.tcp_end <= first.sent
    for timings in later:
        assert timings.connect_start == timings.tcp_end == timings.tls_end == 0.0
        assert 0 < timings.sent <= timings.first_byte <= timings.headers_end <= timings.done
        assert timings.sent > first.done


async def test_connection_close_answers_are_not_reused_and_the_client_closes_them() -> None:
    # The server says "Connection: close" but keeps its side open: only the client's decision counts.
    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            await peer.send(response(request.target.encode(), headers=[("Connection", "close")]))

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        answers = [await fetch(transport, f"{srv.url}/c{i}") for i in range(3)]
        for peer in srv.peers:
            await asyncio.wait_for(peer.client_closed.wait(), WAIT)
        assert transport.connections_opened == 3

    assert [answer.body for answer in answers] == [b"/c0", b"/c1", b"/c2"]
    assert [len(peer.requests) for peer in srv.peers] == [1, 1, 1]


async def test_http10_answer_without_keep_alive_is_not_reused() -> None:
    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            await peer.send(response(request.target.encode(), version="HTTP/1.0"))

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        first = await fetch(transport, srv.url + "/a")
        await asyncio.wait_for(srv.peers[0].client_closed.wait(), WAIT)
        second = await fetch(transport, srv.url + "/b")

    assert (first.status, first.body, second.body) == (200, b"/a", b"/b")
    assert [len(peer.requests) for peer in srv.peers] == [1, 1]


async def test_server_closing_an_idle_connection_makes_the_next_request_open_a_new_one() -> None:
    async def handler(peer: Peer) -> None:
        request = await peer.read_request()
        assert request is not None
        await peer.send(response(f"{request.target} on {peer.index}".encode()))
        await asyncio.sleep(0.02)  # the client's connection is idle in the pool; then the server closes

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        first = await fetch(transport, srv.url + "/a")
        await asyncio.wait_for(srv.peers[0].closed.wait(), WAIT)
        # No public signal tells when the client has processed the FIN; give its loop a moment.
        await asyncio.sleep(0.05)
        second = await fetch(transport, srv.url + "/b")
        assert transport.connections_opened == 2

    assert (first.body, second.body) == (b"/a on 0", b"/b on 1")


async def test_a_connection_idle_past_the_keepalive_expiry_is_closed_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1_pool, "KEEPALIVE_EXPIRY_S", 0.05)
    async with ScriptedServer(echo) as srv, opened(Http1Transport()) as transport:
        first = await fetch(transport, srv.url + "/a")
        again = await fetch(transport, srv.url + "/b")  # within the expiry: reused
        await asyncio.sleep(0.1)
        late = await fetch(transport, srv.url + "/c")
        await asyncio.wait_for(srv.peers[0].client_closed.wait(), WAIT)

    assert (first.body, again.body, late.body) == (b"GET /a", b"GET /b", b"GET /c")
    assert [len(peer.requests) for peer in srv.peers] == [2, 1]


async def test_no_content_answer_without_length_completes_and_keeps_the_connection() -> None:
    async def handler(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.send(b"HTTP/1.1 204 No Content\r\nX-Empty: yes\r\n\r\n")

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        answers = [await fetch(transport, srv.url + "/nothing") for _ in range(2)]
        assert transport.connections_opened == 1

    assert [(answer.status, answer.body, answer.cut) for answer in answers] == [(204, b"", False)] * 2
    assert answers[0].header(b"x-empty") == b"yes"
    assert len(srv.peers) == 1


# -- body framing: chunked, until close, HEAD ------------------------------------------------------


async def test_chunked_body_sent_in_pieces_is_reassembled_and_the_connection_reused() -> None:
    big = bytes(range(256)) * 8

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            pieces = [
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"5\r\nhel",  # a chunk split across writes
                b"lo\r\n",
                b"3;ext=1\r\nabc\r\n",  # a chunk extension
                b"%x\r\n" % len(big) + big + b"\r\n",
                b"%x\r\n%s\r\n" % (len(request.target), request.target.encode()),  # this request's own part
                b"0\r\nX-Trailer: t\r\n\r\n",  # a trailer
            ]
            for piece in pieces:
                await peer.send(piece)
                await asyncio.sleep(0.002)

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        first = await fetch(transport, srv.url + "/one")
        second = await fetch(transport, srv.url + "/two")
        assert transport.connections_opened == 1

    assert first.body == b"hello" + b"abc" + big + b"/one"
    assert second.body == b"hello" + b"abc" + big + b"/two"
    assert first.status == 200
    assert first.cut is False
    assert first.header(b"transfer-encoding") == b"chunked"
    assert len(srv.peers) == 1


async def test_body_without_length_ends_at_close_and_is_whole() -> None:
    async def handler(peer: Peer) -> None:
        request = await peer.read_request()
        assert request is not None
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart1-")
        await asyncio.sleep(0.01)
        await peer.send(b"part2-" + request.target.encode())
        # returning closes the connection: the end of the body

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        first = await fetch(transport, srv.url + "/a")
        second = await fetch(transport, srv.url + "/b")
        assert transport.connections_opened == 2

    assert (first.status, first.body, first.cut) == (200, b"part1-part2-/a", False)
    assert second.body == b"part1-part2-/b"


async def test_head_answer_announcing_a_length_completes_and_its_connection_serves_the_next_get() -> None:
    # HEAD announces the length of the GET body but sends none, as HTTP says.
    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            answer = response(b"hello", headers=[("X-Method", request.method)])
            await peer.send(answer[: -len(b"hello")] if request.method == "HEAD" else answer)

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        head = await fetch(transport, srv.url + "/h", "HEAD")
        get = await fetch(transport, srv.url + "/g")
        assert transport.connections_opened == 1

    assert (head.status, head.body, head.cut) == (200, b"", False)
    assert head.header(b"content-length") == b"5"
    assert head.header(b"x-method") == b"HEAD"
    assert (get.status, get.body, get.header(b"x-method")) == (200, b"hello", b"GET")
    assert len(srv.peers) == 1
    assert [request.method for request in srv.peers[0].requests] == ["HEAD", "GET"]


# -- the body limit -------------------------------------------------------------------------------


async def test_body_over_the_limit_is_cut_without_waiting_for_the_rest_and_dropped() -> None:
    # 10000 bytes announced, 1200 sent, then silence: a cut answer must not wait for the rest.
    async def handler(peer: Peer) -> None:
        request = await peer.read_request()
        assert request is not None
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n" + b"a" * 600)
        await asyncio.sleep(0.01)
        await peer.send(b"b" * 600)
        await peer.until_client_closes()

    async with ScriptedServer(handler) as srv, opened(Http1Transport(body_limit=1000)) as transport:
        answer = await fetch(transport, srv.url + "/big")
        await asyncio.wait_for(srv.peers[0].client_closed.wait(), WAIT)
        again = await fetch(transport, srv.url + "/big")
        assert transport.connections_opened == 2

    assert (answer.status, answer.cut) == (200, True)
    assert answer.body == b"a" * 600 + b"b" * 600
    assert again.cut is True
    assert len(srv.peers) == 2


@pytest.mark.parametrize(("size", "cut"), [(1000, False), (1001, True)])
async def test_body_limit_boundary_decides_cut_and_reuse(size: int, cut: bool) -> None:
    async def handler(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.send(response(b"x" * size))

    async with ScriptedServer(handler) as srv, opened(Http1Transport(body_limit=1000)) as transport:
        first = await fetch(transport, srv.url + "/a")
        second = await fetch(transport, srv.url + "/b")
        assert transport.connections_opened == (2 if cut else 1)

    assert (first.cut, second.cut) == (cut, cut)
    assert first.body == b"x" * size
    assert len(srv.peers) == (2 if cut else 1)


async def test_cut_body_is_flagged_in_the_httpx_response() -> None:
    async def handler(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.send(response(b"y" * 5000))

    transport = Http1Transport(body_limit=100)
    async with ScriptedServer(handler) as srv, httpx.AsyncClient(transport=transport) as client:
        answer = await asyncio.wait_for(client.get(srv.url + "/big"), WAIT)

    assert answer.status_code == 200
    assert answer.extensions["body_cut"] is True
    assert 100 < len(answer.content) <= 5000
    assert answer.content == b"y" * len(answer.content)


# -- failures -------------------------------------------------------------------------------------


async def test_close_before_the_announced_length_gives_incomplete_body_with_the_partial_answer() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\nX-A: 1\r\n\r\npartial")

    timings = RequestTimings()
    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        with pytest.raises(IncompleteBody) as caught:
            await fetch(transport, srv.url + "/short", timings=timings)

    partial = caught.value.partial
    assert isinstance(caught.value, httpx.RemoteProtocolError)
    assert (partial.status, partial.body, partial.cut) == (206, b"partial", False)
    assert partial.header(b"content-length") == b"100"
    assert partial.header(b"x-a") == b"1"
    assert caught.value.response is None  # only handle_async_request builds the httpx.Response
    assert 0 < timings.headers_end <= timings.done


async def test_truncated_body_through_httpx_client_raises_incomplete_body_with_the_response(
    server: DelayServer,
) -> None:
    async with httpx.AsyncClient(transport=Http1Transport()) as client:
        with pytest.raises(IncompleteBody) as caught:
            await asyncio.wait_for(client.get(server.url + "/truncated"), WAIT)

    partial = caught.value.response
    assert partial is not None
    assert partial.status_code == 200
    assert partial.headers["content-length"] == "100"
    assert partial.read() == b'{"features": {"a": 1'
    assert partial.extensions["timings"].done > 0
    assert caught.value.partial.body == b'{"features": {"a": 1'
    assert caught.value.request.url == server.url + "/truncated"


async def test_close_in_the_middle_of_a_chunked_body_gives_incomplete_body() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5\r\nab")

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        with pytest.raises(IncompleteBody) as caught:
            await fetch(transport, srv.url + "/chunks")

    assert caught.value.partial.status == 200
    assert caught.value.partial.body == b"helloab"


@pytest.mark.parametrize("sent", [b"", b"HTTP/1.1 200 OK\r\nContent-Le"], ids=["nothing", "half-a-head"])
async def test_close_before_a_whole_head_is_remote_protocol_error_not_incomplete_body(sent: bytes) -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(sent)

    async with ScriptedServer(handler) as srv, httpx.AsyncClient(transport=Http1Transport()) as client:
        with pytest.raises(httpx.RemoteProtocolError) as caught:
            await asyncio.wait_for(client.get(srv.url + "/gone"), WAIT)

    assert not isinstance(caught.value, IncompleteBody)
    assert caught.value.request.url == srv.url + "/gone"


@pytest.mark.parametrize(
    ("sent", "server_closes"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", False),
        (b"SSH-2.0-OpenSSH_9.6\r\n", True),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", False),
    ],
    ids=["not-http", "not-http-then-close", "bad-chunk-size"],
)
async def test_malformed_answer_is_remote_protocol_error_at_once_and_the_connection_dropped(
    sent: bytes, server_closes: bool
) -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(sent)
        if not server_closes:  # then only the parser can end this request in time
            await peer.until_client_closes()

    async with ScriptedServer(handler) as srv, httpx.AsyncClient(transport=Http1Transport()) as client:
        with pytest.raises(httpx.RemoteProtocolError) as caught:
            await asyncio.wait_for(client.get(srv.url + "/bad"), FAILS_FAST)
        if not server_closes:
            await asyncio.wait_for(srv.peers[0].client_closed.wait(), WAIT)

    assert not isinstance(caught.value, IncompleteBody)
    assert caught.value.request.url == srv.url + "/bad"


async def test_closed_port_is_connect_error_caused_by_the_oserror() -> None:
    async with httpx.AsyncClient(transport=Http1Transport()) as client:
        with pytest.raises(httpx.ConnectError) as caught:
            await asyncio.wait_for(client.get(f"http://127.0.0.1:{closed_port()}/"), WAIT)

    assert isinstance(caught.value.__cause__, OSError)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)


async def test_failed_connects_give_their_pool_slots_back() -> None:
    url = f"http://127.0.0.1:{closed_port()}/"
    async with opened(Http1Transport(max_connections=1)) as transport:
        futures = [transport.start(httpx.Request("GET", url), RequestTimings()) for _ in range(3)]
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT)
        with pytest.raises(httpx.ConnectError):
            await fetch(transport, url)

    assert all(isinstance(outcome, httpx.ConnectError) for outcome in outcomes), outcomes


async def test_unsupported_scheme_is_refused() -> None:
    async with opened(Http1Transport()) as transport:
        with pytest.raises(httpx.UnsupportedProtocol):
            transport.start(httpx.Request("GET", "ftp://127.0.0.1/file"), RequestTimings())


async def test_unrequested_bytes_on_an_idle_connection_drop_it_and_the_next_gets_its_own_answer() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index > 0:
            await echo(peer)
            return
        await peer.read_request()
        await peer.send(response(b"first"))
        await asyncio.sleep(0.02)
        await peer.send(response(b"nobody asked for this"))  # a late answer, on an idle connection
        await peer.until_client_closes()

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        first = await fetch(transport, srv.url + "/first")
        await asyncio.wait_for(srv.peers[0].client_closed.wait(), WAIT)
        second = await fetch(transport, srv.url + "/second")

    assert (first.body, second.body) == (b"first", b"GET /second")
    assert [len(peer.requests) for peer in srv.peers] == [1, 1]


async def test_unrequested_answer_in_the_same_segment_does_not_reach_the_next_request() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:  # the first connection misbehaves once; the rest is plain echo
            await peer.read_request()
            # One write: the answer, then the head of an answer nobody asked for.
            await peer.send(response(b"one") + b"HTTP/1.1 500 Stale\r\nContent-Length: 10\r\n\r\n")
        await echo(peer)

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        first = await fetch(transport, srv.url + "/first")
        second = await fetch(transport, srv.url + "/second")

    assert first.headers == [(b"Content-Length", b"3")]
    assert (second.status, second.body) == (200, b"GET /second")


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
    ],
    ids=["103", "100"],
)
@pytest.mark.parametrize("same_write", [False, True], ids=["apart", "together"])
async def test_interim_1xx_answer_is_skipped_for_the_final_one(interim: bytes, same_write: bool) -> None:
    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            final = response(request.target.encode())
            if same_write:
                await peer.send(interim + final)
            else:
                await peer.send(interim)
                await asyncio.sleep(0.01)
                await peer.send(final)

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        first = await fetch(transport, srv.url + "/hints")
        second = await fetch(transport, srv.url + "/again")
        assert transport.connections_opened == 1

    assert (first.status, first.body) == (200, b"/hints")
    assert first.headers == [(b"Content-Length", b"6")]
    assert (second.status, second.body) == (200, b"/again")


# -- the pool limit and cancellation --------------------------------------------------------------


async def test_pool_limit_caps_open_connections_and_marks_the_requests_that_waited() -> None:
    in_flight = 0
    most_in_flight = 0

    async def handler(peer: Peer) -> None:
        nonlocal in_flight, most_in_flight
        while (request := await peer.read_request()) is not None:
            in_flight += 1
            most_in_flight = max(most_in_flight, in_flight)
            await asyncio.sleep(0.05)
            in_flight -= 1
            await peer.send(response(request.target.encode()))

    transport = Http1Transport(max_connections=2)
    async with ScriptedServer(handler) as srv, httpx.AsyncClient(transport=transport) as client:
        answers = await asyncio.wait_for(
            asyncio.gather(*(client.get(f"{srv.url}/slow{i}") for i in range(5))), WAIT
        )
        assert transport.connections_opened == 2

    assert [answer.content for answer in answers] == [f"/slow{i}".encode() for i in range(5)]
    assert [answer.status_code for answer in answers] == [200] * 5
    assert srv.max_open == 2
    assert len(srv.peers) == 2
    assert most_in_flight == 2
    assert sum(answer.extensions["timings"].pool_wait for answer in answers) == 3


async def test_per_origin_limit_does_not_make_another_origin_wait() -> None:
    async def slow(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            await asyncio.sleep(0.05)
            await peer.send(response(request.target.encode()))

    async with (
        ScriptedServer(slow) as one,
        ScriptedServer(slow) as two,
        opened(Http1Transport(max_connections=1)) as transport,
    ):
        timings = [RequestTimings(), RequestTimings()]
        answers = await asyncio.wait_for(
            asyncio.gather(
                transport.start(httpx.Request("GET", one.url + "/one"), timings[0]),
                transport.start(httpx.Request("GET", two.url + "/two"), timings[1]),
            ),
            WAIT,
        )
        assert transport.connections_opened == 2

    assert [answer.body for answer in answers] == [b"/one", b"/two"]
    assert [t.pool_wait for t in timings] == [False, False]


def cancellable_handler(got_slow: asyncio.Event) -> Handler:
    """``/slow`` is answered late, after 0.3 s, unless the client closes the connection first."""

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            if request.target != "/slow":
                await peer.send(response(f"answer to {request.target}".encode()))
                continue
            got_slow.set()
            try:
                # Whatever the client sends meanwhile is swallowed, as a stuck server would.
                await asyncio.wait_for(peer.until_client_closes(), 0.3)
                return
            except TimeoutError:
                await peer.send(response(b"late answer to /slow"))

    return handler


async def test_cancelled_client_request_closes_its_connection_and_the_next_gets_its_own_answer() -> None:
    got_slow = asyncio.Event()
    async with (
        ScriptedServer(cancellable_handler(got_slow)) as srv,
        httpx.AsyncClient(transport=Http1Transport(max_connections=1)) as client,
    ):
        slow = asyncio.create_task(client.get(srv.url + "/slow"))
        await asyncio.wait_for(got_slow.wait(), WAIT)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        await asyncio.wait_for(srv.peers[0].client_closed.wait(), WAIT)
        answer = await asyncio.wait_for(client.get(srv.url + "/next"), WAIT)

    assert answer.content == b"answer to /next"
    assert len(srv.peers) == 2


async def test_cancelled_future_on_a_reused_connection_closes_it_and_the_next_gets_its_own_answer() -> None:
    got_slow = asyncio.Event()
    async with (
        ScriptedServer(cancellable_handler(got_slow)) as srv,
        opened(Http1Transport(max_connections=1)) as transport,
    ):
        warm = await fetch(transport, srv.url + "/warm")  # leaves an idle connection: start's fast path
        slow = transport.start(httpx.Request("GET", srv.url + "/slow"), RequestTimings())
        await asyncio.wait_for(got_slow.wait(), WAIT)
        slow.cancel()
        await asyncio.wait_for(srv.peers[0].client_closed.wait(), WAIT)
        answer = await fetch(transport, srv.url + "/next")

    assert warm.body == b"answer to /warm"
    assert slow.cancelled()
    assert answer.body == b"answer to /next"
    assert [[request.target for request in peer.requests] for peer in srv.peers] == [
        ["/warm", "/slow"],
        ["/next"],
    ]


@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
async def test_cancelling_a_request_waiting_for_a_pool_slot_does_not_leak_the_slot(
    limit: int, close: bool
) -> None:
    release = asyncio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            if request.target.startswith("/busy"):
                await release.wait()
            await peer.send(
                response(request.target.encode(), headers=[("Connection", "close")] if close else [])
            )
            if close:
                return

    def start(transport: Http1Transport, url: str, timings: RequestTimings) -> asyncio.Future[RawResponse]:
        return transport.start(httpx.Request("GET", url), timings)

    async with ScriptedServer(handler) as srv, opened(Http1Transport(max_connections=limit)) as transport:
        busy = [start(transport, f"{srv.url}/busy{i}", RequestTimings()) for i in range(limit)]
        cancelled_timings, kept_timings = RequestTimings(), RequestTimings()
        cancelled = start(transport, srv.url + "/cancelled", cancelled_timings)
        kept = start(transport, srv.url + "/kept", kept_timings)
        await wait_until(
            lambda: len(srv.requests) == limit and cancelled_timings.pool_wait and kept_timings.pool_wait
        )
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        release.set()
        first_round = await asyncio.wait_for(asyncio.gather(*busy, kept), WAIT)
        after = [start(transport, f"{srv.url}/after{i}", RequestTimings()) for i in range(limit + 1)]
        second_round = await asyncio.wait_for(asyncio.gather(*after), WAIT)

    assert [answer.body for answer in first_round] == [f"/busy{i}".encode() for i in range(limit)] + [
        b"/kept"
    ]
    assert [answer.body for answer in second_round] == [f"/after{i}".encode() for i in range(limit + 1)]
    assert "/cancelled" not in [request.target for request in srv.requests]
    assert srv.max_open <= limit


async def test_request_cancelled_just_after_being_handed_a_connection_passes_it_on() -> None:
    # The waiting request B is handed the connection when A's answer completes; B is cancelled
    # before its task runs. On the selector loop a callback queued before A's answer was read runs
    # before B's wake-up, so a poller that cancels B as soon as A is done hits exactly that window.
    release = asyncio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            if request.target == "/a":
                await release.wait()
            await peer.send(response(request.target.encode()))

    loop = asyncio.get_running_loop()
    async with ScriptedServer(handler) as srv, opened(Http1Transport(max_connections=1)) as transport:
        await fetch(transport, srv.url + "/warm")
        # On the idle connection: A's future is the exchange itself, done as soon as A's answer is read.
        a = transport.start(httpx.Request("GET", srv.url + "/a"), RequestTimings())
        b_timings = RequestTimings()
        b = transport.start(httpx.Request("GET", srv.url + "/b"), b_timings)
        await wait_until(lambda: b_timings.pool_wait)

        def cancel_b_once_a_is_done() -> None:
            if a.done():
                b.cancel()
            else:
                loop.call_soon(cancel_b_once_a_is_done)

        loop.call_soon(cancel_b_once_a_is_done)
        release.set()
        assert (await asyncio.wait_for(a, WAIT)).body == b"/a"
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(b, WAIT)
        # The connection B was handed went back to the pool: C gets it, with no new connection.
        assert (await fetch(transport, srv.url + "/c")).body == b"/c"
        assert transport.connections_opened == 1

    assert [request.target for request in srv.requests] == ["/warm", "/a", "/c"]


# -- TLS ------------------------------------------------------------------------------------------


async def test_tls_without_verification_succeeds_and_times_connect_then_handshake(
    tls_server: DelayServer,
) -> None:
    transport = Http1Transport(verify_tls=False)
    async with httpx.AsyncClient(transport=transport) as client:
        first = await asyncio.wait_for(client.get(tls_server.url + "/delay?ms=0"), WAIT)
        second = await asyncio.wait_for(client.get(tls_server.url + "/delay?ms=0"), WAIT)
        assert transport.connections_opened == 1

    assert (first.status_code, first.json()) == (200, {"features": {"a": 1}})
    assert (second.status_code, second.json()) == (200, {"features": {"a": 1}})
    timings = first.extensions["timings"]
    assert 0 < timings.connect_start < timings.tcp_end < timings.tls_end <= timings.sent
    assert timings.sent <= timings.first_byte <= timings.headers_end <= timings.done
    reused = second.extensions["timings"]
    assert reused.connect_start == reused.tcp_end == reused.tls_end == 0.0


async def test_tls_with_verification_rejects_the_self_signed_certificate_as_connect_error(
    tls_server: DelayServer,
) -> None:
    async with httpx.AsyncClient(transport=Http1Transport(max_connections=1, verify_tls=True)) as client:
        for _ in range(2):  # the failed handshake gives its pool slot back: the second fails the same way
            with pytest.raises(httpx.ConnectError) as caught:
                await asyncio.wait_for(client.get(tls_server.url + "/delay?ms=0"), WAIT)
            assert isinstance(caught.value.__cause__, ssl.SSLCertVerificationError)


# -- closing the transport ------------------------------------------------------------------------


async def test_aclose_closes_idle_connections() -> None:
    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            await asyncio.sleep(0.02)  # long enough for both requests to need a connection each
            await peer.send(response(request.target.encode()))

    async with ScriptedServer(handler) as srv:
        transport = Http1Transport()
        answers = await asyncio.wait_for(
            asyncio.gather(fetch(transport, srv.url + "/a"), fetch(transport, srv.url + "/b")), WAIT
        )
        assert len(srv.peers) == 2
        assert not any(peer.client_closed.is_set() for peer in srv.peers)
        await transport.aclose()
        for peer in srv.peers:
            await asyncio.wait_for(peer.client_closed.wait(), WAIT)

    assert [answer.body for answer in answers] == [b"/a", b"/b"]


async def test_aclose_fails_requests_in_flight_and_waiting_for_a_slot_with_httpx_errors() -> None:
    got = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        got.set()
        await peer.until_client_closes()

    async with ScriptedServer(handler) as srv:
        transport = Http1Transport(max_connections=1)
        timings = RequestTimings()
        in_flight = transport.start(httpx.Request("GET", srv.url + "/hang"), RequestTimings())
        waiting = transport.start(httpx.Request("GET", srv.url + "/wait"), timings)
        await asyncio.wait_for(got.wait(), WAIT)
        await wait_until(lambda: timings.pool_wait)
        await transport.aclose()
        outcomes = await asyncio.wait_for(asyncio.gather(in_flight, waiting, return_exceptions=True), WAIT)
        await asyncio.wait_for(srv.peers[0].client_closed.wait(), WAIT)

    assert isinstance(outcomes[0], httpx.RemoteProtocolError)
    assert "transport was closed" in str(outcomes[0])
    assert isinstance(outcomes[1], httpx.HTTPError), repr(outcomes[1])


# -- RawResponse ----------------------------------------------------------------------------------


async def test_raw_response_keeps_headers_in_order_and_header_finds_the_first_value_by_lower_name() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(
            response(b"{}", headers=[("X-Dup", "one"), ("x-DUP", "two"), ("Content-Type", "text/plain")])
        )

    async with ScriptedServer(handler) as srv, opened(Http1Transport()) as transport:
        answer = await fetch(transport, srv.url + "/h")

    assert answer.headers == [
        (b"X-Dup", b"one"),
        (b"x-DUP", b"two"),
        (b"Content-Type", b"text/plain"),
        (b"Content-Length", b"2"),
    ]
    assert answer.header(b"x-dup") == b"one"
    assert answer.header(b"content-type") == b"text/plain"
    assert answer.header(b"missing") is None
