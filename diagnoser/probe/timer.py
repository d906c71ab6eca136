"""Precise waits for the open-loop scheduler.

``asyncio.sleep`` rounds its timeout to whole milliseconds and so wakes a request up to 1 ms
after its intended send time; at 1,000 req/s and above that lag is the measurement error. On
Linux a ``timerfd`` armed with an absolute ``CLOCK_MONOTONIC`` deadline (the clock the event
loop uses) becomes readable at the deadline itself, and the loop wakes on it through epoll
like on any socket. Elsewhere, :class:`SleepTimer` falls back to ``asyncio.sleep``.

Usage::

    timer = make_timer()
    try:
        await timer.wait_until(loop.time() + 0.0005)
    finally:
        timer.close()
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time
from typing import Protocol

__all__ = ["PreciseTimer", "SleepTimer", "TimerfdTimer", "make_timer"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class PreciseTimer(Protocol):
    """Something that wakes the current task at an absolute ``time.monotonic()`` instant."""

    async def wait_until(self, deadline: float) -> None: ...

    def interrupt(self) -> None:
        """Wake the current wait now (a stop must not wait for a far-off send time)."""

    def close(self) -> None: ...


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        ]
    except (OSError, AttributeError):
        return None
    return libc


class TimerfdTimer:
    """A one-shot timerfd re-armed for each wait; the event loop watches its descriptor."""

    def __init__(self, libc: ctypes.CDLL, loop: asyncio.AbstractEventLoop) -> None:
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._libc = libc
        self._fd: int = fd
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None
        self._spec = _Itimerspec()
        loop.add_reader(fd, self._on_expired)

    def _on_expired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        self._on_expired_now()

    async def wait_until(self, deadline: float) -> None:
        if deadline <= time.monotonic():
            return
        seconds = int(deadline)
        self._spec.it_value.tv_sec = seconds
        # A zero it_value disarms the timer; one nanosecond keeps it armed.
        self._spec.it_value.tv_nsec = max(1, int((deadline - seconds) * 1e9))
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiter = waiter
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            self._waiter = None
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            return
        try:
            await waiter
        finally:
            self._waiter = None

    def interrupt(self) -> None:
        self._on_expired_now()

    def _on_expired_now(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


class SleepTimer:
    """The portable fallback: ``asyncio.sleep`` (wakes up to 1 ms late)."""

    def __init__(self) -> None:
        self._sleeper: asyncio.Task[None] | None = None

    async def wait_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay <= 0:
            return
        self._sleeper = asyncio.ensure_future(asyncio.sleep(delay))
        try:
            await self._sleeper
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # our caller was cancelled, not just the sleep interrupted
        finally:
            self._sleeper = None

    def interrupt(self) -> None:
        if self._sleeper is not None:
            self._sleeper.cancel()

    def close(self) -> None:
        return None


def make_timer(*, precise: bool = True) -> PreciseTimer:
    """A timerfd timer on Linux when ``precise``, else the ``asyncio.sleep`` fallback."""
    libc = _libc() if precise else None
    if libc is not None:
        try:
            return TimerfdTimer(libc, asyncio.get_running_loop())
        except (OSError, NotImplementedError):
            pass
    return SleepTimer()
