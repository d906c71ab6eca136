"""Blocking calls off the event loop, in daemon threads that can never hold the process open.

``asyncio.to_thread`` and ``ThreadPoolExecutor`` workers are joined when the interpreter exits
(and ``asyncio.run`` waits for its default executor), so one blocking call to a server that never
answers keeps the process alive long after the diagnosis' deadline has passed and its report is
printed. :func:`run_blocking` runs the call in a fresh daemon thread instead: awaiting it can be
cancelled at once (the caller stops waiting; the thread finishes or dies with the process), and
a bounded :class:`asyncio.Semaphore` of the caller's limits how many run at once::

    page = await run_blocking(fetch, path, limit=semaphore)

The cost is a thread start per call (tens of microseconds), negligible next to a network call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["run_blocking"]

T = TypeVar("T")


async def run_blocking(func: Callable[..., T], *args: Any, limit: asyncio.Semaphore | None = None) -> T:
    """``func(*args)`` in a daemon thread; its result or exception, delivered on this loop."""
    async with limit if limit is not None else contextlib.nullcontext():
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def deliver(value: T | None, error: BaseException | None) -> None:
            if future.done():  # the waiter was cancelled: nobody wants the answer any more
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)  # type: ignore[arg-type]

        def work() -> None:
            try:
                value = func(*args)
            except BaseException as exc:  # delivered to the awaiting coroutine, re-raised there
                error: BaseException | None = exc
                value = None
            else:
                error = None
            with contextlib.suppress(RuntimeError):  # the loop closed while the call ran
                loop.call_soon_threadsafe(deliver, value, error)

        name = f"diagnoser-{getattr(func, '__name__', 'call')}"
        threading.Thread(target=work, name=name, daemon=True).start()
        return await future
