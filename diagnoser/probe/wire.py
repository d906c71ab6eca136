"""The worker protocol: what a coordinator and its workers say to each other, and how each proves who it is.

One TCP connection per worker, opened by the worker (a local process or a pod of an Indexed Job)
to the coordinator; one message per line. Both sides hold the run's token; neither ever sends it.
The connection opens with a challenge-response in both directions (HMAC-SHA256 of each side's
fresh nonce under the token), and every message after it carries a MAC under a key derived from
the token and both nonces, with a sequence number per direction, so a message that was altered,
replayed, reordered or injected by someone without the token ends the connection::

    worker -> hello     {index, pid, cores, nonce}          in clear: no secret in it
    coord  -> challenge {nonce, proof}                       the coordinator proves it holds the token
    worker -> proof     {proof}                              and the worker that it does
    ---- from here, every line is "<MAC> <JSON>" ----
    coord  -> run   {run_id, spec, settings, share: [i, n], start_at, slow_ms}
    worker -> live  {run_id, live, tally, stopped}        every quarter second while it runs
    coord  -> stop  {run_id, reason}                      Ctrl-C, a cap, another worker's abort
    worker -> part  {run_id, part}                        its share: counters and HdrHistograms
    coord  -> tail  {run_id, cut_ms}  /  worker -> tail {run_id, sums}     tail shares at the merged p99
    worker -> error {run_id, message}                     the run could not start, was refused, or broke
    coord  -> exit  {}                                    (or the connection closes)

A worker checks the coordinator's proof before it answers with its own, so a listener that does
not hold the token learns nothing it could replay, and gets no run started. What is told is
authenticated, not encrypted: a run order (the probe's target, headers and body) is readable on
the network path, which is why the worker applies its own caps and allowlist to it
(:mod:`diagnoser.probe.worker`) and never sends response bodies back.

``spec`` is the :class:`~diagnoser.probe.spec.ProbeSpec` and ``settings`` the
:class:`~diagnoser.config.ProbeSettings` as JSON; ``start_at`` is a wall-clock time
(``time.time()``), so pods on different nodes start together to within their clocks' agreement.
Before the handshake a side reads at most :data:`HANDSHAKE_MAX_BYTES` per line, so a stranger
cannot make it buffer more than that; after it, up to :data:`MAX_MESSAGE_BYTES`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
from typing import Any

from diagnoser.errors import ProbeWorkerError

__all__ = [
    "HANDSHAKE_MAX_BYTES",
    "HANDSHAKE_TIMEOUT_S",
    "MAX_MESSAGE_BYTES",
    "MIN_TOKEN_CHARS",
    "Channel",
    "check_token",
    "coordinator_handshake",
    "new_token",
    "worker_handshake",
]

#: A part carries seven encoded histograms (a few KB each) and a few examples: far below this.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: A hello, a challenge or a proof is well under a kilobyte.
HANDSHAKE_MAX_BYTES = 4096
#: Seconds each side waits for the other's next handshake message.
HANDSHAKE_TIMEOUT_S = 10.0
#: 128 bits written as hex (``openssl rand -hex 16``, :func:`new_token`): 32 characters. A token
#: in another alphabet carries at least as many bits in as many characters.
MIN_TOKEN_CHARS = 32
_MAC_HEX = 64
_READ_CHUNK = 64 * 1024


def new_token() -> str:
    """A fresh run token: 128 random bits as 32 hex digits."""
    return secrets.token_hex(16)


def check_token(token: str, where: str) -> None:
    """Refuse (``ValueError``) a token shorter than 128 bits' worth of hex digits."""
    if len(token.strip()) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"{where}: the token must be at least {MIN_TOKEN_CHARS} characters (128 bits: "
            f"openssl rand -hex 16), got {len(token.strip())}"
        )


def _mac(key: bytes, *parts: str | bytes) -> str:
    message = b"\n".join(p.encode() if isinstance(p, str) else p for p in parts)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class Channel:
    """One side of a worker connection: whole lines in, whole lines out, MACs once keyed.

    Lines are read in chunks into a buffer of our own, so the bound on a line is the caller's
    (``max_bytes``) and not the stream's: a peer that never sends a newline costs at most that.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, role: str) -> None:
        self.reader = reader
        self.writer = writer
        self._role = role  # "coordinator" or "worker": the direction label of what this side sends
        self._peer_role = "worker" if role == "coordinator" else "coordinator"
        self._key: bytes | None = None
        self._sent = 0
        self._received = 0
        self._buffer = bytearray()

    def key(self, key: bytes) -> None:
        """From now on every message in either direction carries its MAC under ``key``."""
        self._key = key

    async def send(self, kind: str, **fields: Any) -> None:
        """Write one message and wait until the socket took it (back-pressure, not a growing buffer)."""
        body = json.dumps({"type": kind, **fields}, separators=(",", ":")).encode()
        if self._key is not None:
            mac = _mac(self._key, self._role, str(self._sent), body)
            self._sent += 1
            body = mac.encode() + b" " + body
        self.writer.write(body + b"\n")
        await self.writer.drain()

    async def receive(self, max_bytes: int = MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
        """The next message, or ``None`` when the other side closed the connection.

        Raises :class:`ProbeWorkerError` for a line over ``max_bytes``, one that is not a JSON
        object with a ``type``, or (once keyed) one whose MAC does not verify.
        """
        line = await self._line(max_bytes)
        if line is None:
            return None
        if self._key is not None:
            mac, _, line = line.partition(b" ")
            expected = _mac(self._key, self._peer_role, str(self._received), line)
            if len(mac) != _MAC_HEX or not hmac.compare_digest(mac, expected.encode()):
                raise ProbeWorkerError(f"a message from the {self._peer_role} failed its authentication")
            self._received += 1
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise ProbeWorkerError(f"not a worker protocol message: {bytes(line[:80])!r}") from exc
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ProbeWorkerError(f"not a worker protocol message: {bytes(line[:80])!r}")
        return message

    async def _line(self, max_bytes: int) -> bytes | None:
        searched = 0
        while True:
            end = self._buffer.find(b"\n", searched)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return line
            searched = len(self._buffer)
            if searched > max_bytes:
                raise ProbeWorkerError(f"a worker message over {max_bytes} bytes")
            try:
                chunk = await self.reader.read(_READ_CHUNK)
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk

    def close(self) -> None:
        self.writer.close()


def _session_key(token: str, worker_nonce: str, coordinator_nonce: str) -> bytes:
    return bytes.fromhex(_mac(token.encode(), "session", worker_nonce, coordinator_nonce))


def _proof(token: str, role: str, first: str, second: str, index: int) -> str:
    return _mac(token.encode(), role, first, second, str(index))


async def _handshake_message(channel: Channel, kind: str) -> dict[str, Any]:
    try:
        message = await asyncio.wait_for(channel.receive(HANDSHAKE_MAX_BYTES), HANDSHAKE_TIMEOUT_S)
    except TimeoutError:
        raise ProbeWorkerError(f"no {kind} within {HANDSHAKE_TIMEOUT_S:g} s") from None
    if message is None:
        raise ProbeWorkerError(f"the connection closed before the {kind}")
    if message["type"] != kind or not all(isinstance(v, str | int) for v in message.values()):
        raise ProbeWorkerError(f"expected a {kind}, got {message['type']!r}")
    return message


async def worker_handshake(channel: Channel, token: str, *, index: int, pid: int, cores: int) -> None:
    """The worker's side: hello, check the coordinator's proof, answer with its own; then keyed.

    Raises :class:`ProbeWorkerError` when the coordinator does not prove it holds the token.
    """
    nonce = secrets.token_hex(16)
    await channel.send("hello", index=index, pid=pid, cores=cores, nonce=nonce)
    challenge = await _handshake_message(channel, "challenge")
    theirs = str(challenge.get("nonce", ""))
    expected = _proof(token, "coordinator", nonce, theirs, index)
    if len(theirs) < 32 or not hmac.compare_digest(str(challenge.get("proof", "")), expected):
        raise ProbeWorkerError("the coordinator did not prove it holds this worker's token: nothing was run")
    await channel.send("proof", proof=_proof(token, "worker", theirs, nonce, index))
    channel.key(_session_key(token, nonce, theirs))


async def coordinator_handshake(channel: Channel, token: str) -> dict[str, Any]:
    """The coordinator's side: read the hello, prove itself, check the worker's proof; then keyed.

    Returns the hello (``index``, ``pid``, ``cores``). Raises :class:`ProbeWorkerError` for a
    peer that does not speak the protocol or does not hold the token.
    """
    hello = await _handshake_message(channel, "hello")
    index, theirs = hello.get("index"), str(hello.get("nonce", ""))
    if not isinstance(index, int) or len(theirs) < 32:
        raise ProbeWorkerError("a hello without an index or a nonce")
    nonce = secrets.token_hex(16)
    await channel.send("challenge", nonce=nonce, proof=_proof(token, "coordinator", theirs, nonce, index))
    answer = await _handshake_message(channel, "proof")
    if not hmac.compare_digest(str(answer.get("proof", "")), _proof(token, "worker", nonce, theirs, index)):
        raise ProbeWorkerError("a worker did not prove it holds the run's token")
    channel.key(_session_key(token, theirs, nonce))
    return hello
