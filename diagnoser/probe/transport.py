"""What the open loop sends through, and the HTTP/1.1 transport it uses for http(s):// targets.

:class:`ProbeTransport` is the boundary of :class:`~diagnoser.probe.open_loop.ProbeRun`: a
transport starts one request and returns the future of its answer (the HTTP/1.1 transport of
:mod:`diagnoser.probe.http1`, or gRPC channels in :mod:`diagnoser.probe.grpc_run`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Protocol

from diagnoser.probe.http1 import Http1Transport
from diagnoser.probe.http1_connection import RequestTimings
from diagnoser.probe.spec import ProbeSpec

__all__ = ["ProbeTransport", "describe_error", "probe_transport"]


class ProbeTransport(Protocol):
    """Starts a request now; the future completes with its answer (or the transport's error)."""

    def start(self, request: Any, timings: RequestTimings) -> asyncio.Future[Any]: ...

    async def aclose(self) -> None: ...


def describe_error(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    text = str(cause) or type(cause).__name__
    errno = getattr(cause, "errno", None)
    if isinstance(errno, int) and errno > 0:
        # "Connect call failed" says nothing; the errno says refused, unreachable, reset...
        text = f"{text} ({os.strerror(errno)})"
    return f"{type(cause).__name__}: {text}"[:300]


def probe_transport(spec: ProbeSpec, pool_size: int) -> Http1Transport:
    """The probe's transport: ``pool_size`` keep-alive connections, bodies read up to the cap."""
    return Http1Transport(
        max_connections=pool_size, body_limit=spec.expect.max_body_bytes, verify_tls=spec.verify_tls
    )
