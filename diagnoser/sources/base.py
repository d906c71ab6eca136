"""What every source shares: the typed set of sources, one single-flight cache, one blocking-call helper.

- :class:`Sources` is what one evaluation may read. Check kinds name what they read
  (``reads={"prometheus", "kubernetes"}``) with :data:`SourceName`; :meth:`Sources.get` answers
  by name, so a kind naming a source that does not exist fails when it registers, not silently.
- :class:`SingleFlight` lets concurrently evaluated rules share one request per question: the
  first caller starts it, the others await the same answer, later callers reuse it for
  ``ttl_s`` (counted from the answer). A caller that gives up (its deadline) never cancels the
  answer others wait for. While a run holds it (:meth:`SingleFlight.holding`), nothing is evicted
  for room: a diagnosis over hundreds of families asks more distinct questions than the resting
  size, and the answers every rule shares (the name list, recognition) must outlive them.
- :func:`run_blocking` runs a blocking client call (the Kubernetes client, file parsing) in a
  daemon thread whose awaiting can be cancelled at once, so a server that never answers cannot
  hold the process open past its deadline (``asyncio.to_thread`` workers are joined at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

if TYPE_CHECKING:
    from diagnoser.probe.result import ProbeResult
    from diagnoser.sources.elasticsearch import ElasticsearchSource
    from diagnoser.sources.kubernetes import KubernetesSource
    from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["SOURCE_NAMES", "SingleFlight", "SourceName", "Sources", "run_blocking"]

T = TypeVar("T")

SourceName = Literal["prometheus", "kubernetes", "elasticsearch", "probe"]
SOURCE_NAMES: frozenset[str] = frozenset(get_args(SourceName))


@dataclass
class Sources:
    """The sources one evaluation may use; ``None`` means not configured (rules needing it are skipped).

    ``probe`` is the latest probe result: evidence read like any other source.
    """

    prometheus: PrometheusSource | None = None
    elasticsearch: ElasticsearchSource | None = None
    kubernetes: KubernetesSource | None = None
    probe: ProbeResult | None = None

    def get(self, name: SourceName) -> object | None:
        """The source called ``name``, or ``None`` when it is not configured."""
        found: object | None = getattr(self, name)
        return found

    @contextlib.contextmanager
    def holding_answers(self) -> Iterator[None]:
        """Keep every answer the sources share until the block ends (one diagnosis), however many
        it asks (:meth:`SingleFlight.holding`); a stand-in without answers to keep holds nothing."""
        hold = getattr(self.prometheus, "holding_answers", None)
        with hold() if hold is not None else contextlib.nullcontext():
            yield

    def clients(self) -> list[PrometheusSource | ElasticsearchSource | KubernetesSource]:
        """The sources that hold connections (all but the probe's result), to close when done."""
        return [s for s in (self.prometheus, self.elasticsearch, self.kubernetes) if s is not None]


class SingleFlight:
    """One request per key at a time, its answer shared while in flight and for ``ttl_s`` after.

    Entries are per event loop (a future of a closed loop is never awaited again) and at most
    ``max_entries`` are kept, oldest first out: a daemon keeps a source for days, and a cached
    list of thousands of pods must not outlive its use. That bound is the resting size: while any
    run holds the cache (:meth:`holding`) it grows to whatever the run asks, and is trimmed back
    when the last run lets go, so no answer a run shares is asked twice within it.
    """

    def __init__(self, *, ttl_s: float = math.inf, max_entries: int = 256) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[asyncio.Future[Any], float]] = OrderedDict()
        self._holders = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def held(self) -> bool:
        """Whether a run holds the cache now (:meth:`holding`)."""
        return self._holders > 0

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Keep every answer while the block runs (one diagnosis); trim to ``max_entries`` after."""
        self._holders += 1
        try:
            yield
        finally:
            self._holders -= 1
            self._trim()

    def _trim(self) -> None:
        while not self._holders and len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def run(self, key: Hashable, start: Callable[[], Awaitable[T]]) -> T:
        """The answer to ``key``: shared if one is in flight or fresh, else from ``start()``."""
        loop = asyncio.get_running_loop()
        self._drop_stale(loop)
        entry = self._entries.get(key)
        if entry is None:
            future: asyncio.Future[T] = asyncio.ensure_future(start())
            self._entries[key] = (future, math.inf)
            # The time to live counts from the answer, not the question.
            future.add_done_callback(lambda done: self._answered(key, done))
            self._trim()
        else:
            future = entry[0]
        result: T = await asyncio.shield(future)
        return result

    def _answered(self, key: Hashable, future: asyncio.Future[Any]) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry[0] is future:
            self._entries[key] = (future, time.monotonic())

    def _drop_stale(self, loop: asyncio.AbstractEventLoop) -> None:
        # A run may hold thousands of answers: they are looked through only when some can have
        # gone stale (a finite time to live) or belong to another loop.
        if self.ttl_s == math.inf and loop is self._loop:
            return
        self._loop = loop
        now = time.monotonic()
        stale = [
            key
            for key, (future, answered) in self._entries.items()
            if future.get_loop() is not loop or (future.done() and now - answered >= self.ttl_s)
        ]
        for key in stale:
            del self._entries[key]

    def clear(self) -> None:
        """Forget every answer and cancel the requests nobody can await any more."""
        for future, _ in self._entries.values():
            if not future.done() and not future.get_loop().is_closed():
                future.cancel()
        self._entries.clear()


async def run_blocking(func: Callable[..., T], *args: Any, limit: asyncio.Semaphore | None = None) -> T:
    """``func(*args)`` in a daemon thread; its result or exception, delivered on this loop.

    Awaiting it can be cancelled at once (the caller stops waiting; the thread finishes or dies
    with the process), and ``limit`` bounds how many run at once. The cost is a thread start per
    call (tens of microseconds), negligible next to a network call.
    """
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
