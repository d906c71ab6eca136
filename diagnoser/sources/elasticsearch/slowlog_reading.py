"""Slow log files read under a deadline: off the event loop, and in worker processes that stop with it.

Parsing a big slow log takes seconds of CPU. :func:`read_slowlog_files` plans the work in a
daemon thread (:func:`diagnoser.sources.base.run_blocking`), reads a small log in that thread, and
spreads a big one (over :data:`~.slowlog_files.CHUNK_BYTES`) over a ``spawn`` process pool. Every
wait is cancellable: when the diagnosis deadline cancels the caller, the pool's workers are
terminated at once instead of being waited for, so a given-up diagnosis neither keeps burning
CPU nor holds the process open at exit (``concurrent.futures`` pools are joined at exit,
which is why this uses :class:`multiprocessing.pool.Pool`, whose workers are killed)::

    summary = await read_slowlog_files([Path("/var/log/elasticsearch")], since=an_hour_ago)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.pool import Pool
from pathlib import Path

from diagnoser.sources.base import run_blocking
from diagnoser.sources.elasticsearch.slowlog_files import (
    SlowlogChunk,
    SlowlogPlan,
    merge_chunks,
    plan_slowlog_files,
    summarise_chunk,
)
from diagnoser.sources.elasticsearch.slowlog_summary import SlowlogSummary

__all__ = ["SlowlogRead", "read_slowlog_files"]


@dataclass
class SlowlogRead:
    """The slow log entries a source read, and what it read, as evidence names it."""

    summary: SlowlogSummary
    #: ``slow log files /var/log/...``, ``GET slowlogs-*/_search``.
    queries: list[str]


async def read_slowlog_files(
    paths: Sequence[Path],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    workers: int | None = None,
) -> SlowlogSummary:
    """Every slow log file under ``paths`` in one summary, read without blocking the event loop.

    ``workers`` caps the processes a big log is spread over (default: one per CPU, at most 4;
    ``1`` reads in a thread of this process). Raises ``OSError`` when files were found and none
    could be read.
    """
    plan = await run_blocking(functools.partial(plan_slowlog_files, paths, since=since, until=until))
    processes = plan.processes(workers)
    if processes == 1:
        return await run_blocking(_summarise_here, plan)
    results = await _in_worker_processes(plan.chunks, processes)
    return await run_blocking(merge_chunks, plan, results)


def _summarise_here(plan: SlowlogPlan) -> SlowlogSummary:
    return merge_chunks(plan, (summarise_chunk(chunk) for chunk in plan.chunks))


async def _in_worker_processes(chunks: list[SlowlogChunk], processes: int) -> list[SlowlogSummary]:
    """Each chunk's summary, read by ``processes`` workers; the workers are gone when this returns."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[list[SlowlogSummary]] = loop.create_future()

    def settle(results: list[SlowlogSummary] | None, error: BaseException | None) -> None:
        if answer.done():  # the caller gave up: nobody wants the results
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(results or [])

    def deliver(results: list[SlowlogSummary] | None, error: BaseException | None) -> None:
        # Called on the pool's result thread.
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, results, error)

    # "spawn": this process runs threads (the event loop's helpers, HTTP clients) that fork would copy.
    pool = multiprocessing.get_context("spawn").Pool(processes)
    try:
        pool.map_async(
            summarise_chunk,
            chunks,
            chunksize=1,
            callback=lambda results: deliver(results, None),
            error_callback=lambda error: deliver(None, error),
        )
        results = await answer
    except BaseException:
        _terminate_soon(pool)  # cancelled (the deadline) or failed: nothing to wait for
        raise
    # Done: the idle workers are stopped and reaped before returning, so what they used is
    # accounted to this process (``RUSAGE_CHILDREN``) and no worker outlives the call.
    await run_blocking(pool.terminate)
    return results


def _terminate_soon(pool: Pool) -> None:
    """Kill the pool's workers without making the event loop wait for them to exit."""
    # Pool.terminate joins its handler threads and reaps the workers: a few milliseconds that are
    # spent in a daemon thread, so a cancelled caller returns at once.
    threading.Thread(target=pool.terminate, name="diagnoser-slowlog-pool-stop", daemon=True).start()
