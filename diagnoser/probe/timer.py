"""Precise wake-ups for the open-loop scheduler.

``asyncio.sleep`` and ``loop.call_at`` round their timeout to whole milliseconds and so fire up
to 1 ms after the intended send time; at 1,000 req/s and above that lag is the measurement
error. On Linux a ``timerfd`` armed with an absolute ``CLOCK_MONOTONIC`` deadline (the clock the
event loop uses) becomes readable at the deadline itself, and the loop wakes on it through epoll
like on any socket. Elsewhere, :class:`CallAtTimer` falls back to ``loop.call_at``.

The timers call a plain callback from the event loop's I/O phase, ahead of the callbacks
queued for its next turn (answers being validated and recorded): a coroutine woken through a
future would wait behind all of those, and under a burst of answers that wait is the lag.

On a virtual machine an idle vCPU halts and can take a millisecond or more to be woken, so
``spin_s`` arms the timer that much early and covers the last stretch by turning the event loop
(``call_soon``: I/O still runs) instead of idling. It costs CPU, about ``rate x spin_s`` of a
core, and never more than half of each wait.

Usage::

    timer = make_timer(spin_s=0.0002)
    timer.call_at(time.monotonic() + 0.0005, send_next)    # one pending call at a time
    ...
    timer.close()
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["CallAtTimer", "PreciseTimer", "TimerfdTimer", "make_timer"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class PreciseTimer(Protocol):
    """Calls one callback at an absolute ``time.monotonic()`` instant."""

    def call_at(self, deadline: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` at ``deadline`` (soon, if it has passed), replacing any pending call."""

    def interrupt(self) -> None:
        """Call the pending callback now (a stop must not wait for a far-off send time)."""

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


class _SpinningTimer:
    """What both timers share: the pending callback, the early wake-up and the spin to the deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, spin_s: float) -> None:
        self._loop = loop
        self._spin_s = spin_s
        self._callback: Callable[[], None] | None = None
        self._deadline = 0.0

    def call_at(self, deadline: float, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._deadline = deadline
        now = time.monotonic()
        # Spin at most half the wait, so that at high rates the loop still idles half the gap.
        wake = deadline - min(self._spin_s, (deadline - now) / 2)
        if wake <= now:
            self._loop.call_soon(self._spin)
        else:
            self._arm(wake)

    def interrupt(self) -> None:
        self._disarm()
        self._deadline = 0.0
        self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        if self._callback is None:
            return
        if time.monotonic() < self._deadline:
            self._loop.call_soon(self._spin)
            return
        callback, self._callback = self._callback, None
        callback()

    def _arm(self, wake: float) -> None:
        raise NotImplementedError

    def _disarm(self) -> None:
        raise NotImplementedError


class TimerfdTimer(_SpinningTimer):
    """A one-shot timerfd re-armed for each call; the event loop watches its descriptor."""

    def __init__(self, libc: ctypes.CDLL, loop: asyncio.AbstractEventLoop, spin_s: float = 0.0) -> None:
        super().__init__(loop, spin_s)
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._libc = libc
        self._fd: int = fd
        self._spec = _Itimerspec()
        loop.add_reader(fd, self._on_expired)

    def _on_expired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        self._spin()

    def _arm(self, wake: float) -> None:
        seconds = int(wake)
        self._spec.it_value.tv_sec = seconds
        # A zero it_value disarms the timer; one nanosecond keeps it armed.
        self._spec.it_value.tv_nsec = max(1, int((wake - seconds) * 1e9))
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            self._loop.call_at(self._loop.time() + max(0.0, wake - time.monotonic()), self._spin)

    def _disarm(self) -> None:
        if self._fd >= 0:
            self._spec.it_value.tv_sec = 0
            self._spec.it_value.tv_nsec = 0
            self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None)

    def close(self) -> None:
        self._callback = None
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


class CallAtTimer(_SpinningTimer):
    """The portable fallback: ``loop.call_at`` (fires up to 1 ms late)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, spin_s: float = 0.0) -> None:
        super().__init__(loop, spin_s)
        self._handle: asyncio.TimerHandle | None = None

    def _arm(self, wake: float) -> None:
        self._disarm()
        # loop.time() is time.monotonic() on the standard loops and uvloop; convert to be sure.
        self._handle = self._loop.call_at(self._loop.time() + (wake - time.monotonic()), self._spin)

    def _disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        self._callback = None
        self._disarm()


def make_timer(*, precise: bool = True, spin_s: float = 0.0) -> PreciseTimer:
    """A timerfd timer on Linux when ``precise``, else the ``loop.call_at`` fallback."""
    loop = asyncio.get_running_loop()
    libc = _libc() if precise else None
    if libc is not None:
        try:
            return TimerfdTimer(libc, loop, spin_s)
        except (OSError, NotImplementedError):
            pass
    return CallAtTimer(loop, spin_s)
