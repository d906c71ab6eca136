"""The worker protocol: what a coordinator and its probe workers say to each other.

One TCP connection per worker, opened by the worker (a local process or a pod of an Indexed Job)
to the coordinator; one JSON object per line. Kubernetes starts the pods and restarts nothing;
this protocol only carries a run's orders and its results::

    worker -> hello {index, token, pid, cores}            the barrier: a run starts once all have
    coord  -> run   {run_id, spec, settings, explicit_target, share: [i, n], start_at, slow_ms}
    worker -> live  {run_id, live, tally, stopped}        every quarter second while it runs
    coord  -> stop  {run_id, reason}                      Ctrl-C, a cap, another worker's abort
    worker -> part  {run_id, part}                        its share: counters and HdrHistograms
    coord  -> tail  {run_id, cut_ms}  /  worker -> tail {run_id, sums}     tail shares at the merged p99
    worker -> error {run_id, message}                     the run could not start or broke
    coord  -> exit  {}                                    (or the connection closes)

``spec`` is the :class:`~diagnoser.probe.spec.ProbeSpec` and ``settings`` the
:class:`~diagnoser.config.ProbeSettings` as JSON: whatever the transport, a worker runs the
same open loop as a single process. ``start_at`` is a wall-clock time (``time.time()``), so
pods on different nodes start together to within their clocks' agreement.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from diagnoser.errors import ProbeWorkerError

__all__ = ["MAX_MESSAGE_BYTES", "read_message", "send_message"]

#: A part carries seven encoded histograms (a few KB each) and a few examples: far below this.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


async def send_message(writer: asyncio.StreamWriter, kind: str, **fields: Any) -> None:
    """Write one message and wait until the socket took it (back-pressure, not a growing buffer)."""
    writer.write(json.dumps({"type": kind, **fields}, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or ``None`` when the other side closed the connection.

    Raises :class:`ProbeWorkerError` for a line that is not a JSON object with a ``type``.
    """
    try:
        line = await reader.readline()
    except (ValueError, asyncio.LimitOverrunError) as exc:
        raise ProbeWorkerError(f"a worker message over {MAX_MESSAGE_BYTES} bytes: {exc}") from exc
    except OSError:
        return None
    if not line:
        return None
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise ProbeWorkerError(f"not a worker protocol message: {line[:80]!r}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProbeWorkerError(f"not a worker protocol message: {line[:80]!r}")
    return message
