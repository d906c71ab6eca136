"""When the daemon's jobs run: APScheduler with elastalert's habits, and a stop that waits a bounded time.

Every job runs on the daemon's one event loop at its own interval, never two runs of the same job
at once (``max_instances=1``), missed runs merged into one (``coalesce``) and dropped when later
than ``daemon.misfire_grace_s``, with jitter so replicas do not query in lockstep. A job that
fails is logged and runs again at its next time; one that is cancelled by shutdown is not an
error. :meth:`JobSchedule.drain` stops starting jobs, gives the runs in flight (scheduled ones
and background alert diagnoses alike) ``daemon.shutdown_grace_s`` and cancels the rest. ::

    schedule = JobSchedule(misfire_grace_s=30, jitter_s=5)
    schedule.add("diagnose", diagnose_job, every_s=60)
    schedule.start()
    schedule.run_soon("diagnose")
    await schedule.drain(grace_s=5)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

__all__ = ["GuardedRun", "JobSchedule"]

#: A run wrapped by :meth:`JobSchedule.guarded`.
GuardedRun = Callable[[], Coroutine[Any, Any, None]]

log = logging.getLogger(__name__)


class JobSchedule:
    """The daemon's scheduler and the runs it has in flight."""

    def __init__(self, *, misfire_grace_s: float, jitter_s: float) -> None:
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._misfire_grace_s = max(1, round(misfire_grace_s))
        self._jitter_s = jitter_s or None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._draining = False

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running) and not self._draining

    def add(
        self,
        job_id: str,
        func: Callable[[], Awaitable[Any]],
        *,
        every_s: float,
        jitter: bool = True,
        first_run_now: bool = True,
    ) -> None:
        """Run ``func`` every ``every_s`` seconds (the first time at once unless told otherwise)."""
        # Without next_run_time the first run is one interval away (None would add it paused).
        first_run: dict[str, Any] = {"next_run_time": datetime.now(UTC)} if first_run_now else {}
        self._scheduler.add_job(
            self.guarded(job_id, func),
            trigger="interval",
            id=job_id,
            seconds=every_s,
            jitter=self._jitter_s if jitter else None,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=self._misfire_grace_s,
            **first_run,
        )

    def start(self) -> None:
        self._scheduler.start()

    def run_soon(self, job_id: str) -> None:
        """Have a job run now rather than at its next time, without waiting for it."""
        if not self.running:
            return
        job = self._scheduler.get_job(job_id)
        if job is not None:
            job.modify(next_run_time=datetime.now(UTC))

    def guarded(self, name: str, func: Callable[[], Awaitable[Any]]) -> GuardedRun:
        """Wrap a run so :meth:`drain` can see it in flight and a failure is logged, never fatal."""

        async def run() -> None:
            if self._draining:
                return
            task = asyncio.current_task()
            if task is not None:
                self._inflight.add(task)
            try:
                await func()
            except asyncio.CancelledError:
                # Only shutdown cancels a job, and nothing awaits it but the scheduler, which
                # would report a cancelled job as a failure.
                log.info("job %s cancelled by shutdown", name)
            except Exception:  # one failing run must not stop the schedule
                log.exception("job %s failed", name)
            finally:
                if task is not None:
                    self._inflight.discard(task)

        run.__name__ = name
        return run

    async def drain(self, grace_s: float) -> None:
        """Start nothing more, let the runs in flight finish within ``grace_s``, cancel the rest."""
        self._draining = True
        if self._scheduler.running:
            self._scheduler.pause()  # no new runs; shutdown() would cancel in-flight ones at once
        inflight = {t for t in self._inflight if not t.done()}
        if inflight:
            log.info("waiting for %d in-flight job(s)", len(inflight))
            _, late = await asyncio.wait(inflight, timeout=grace_s)
            for task in late:
                task.cancel()
            if late:
                log.warning("cancelled %d job(s) still running after %gs", len(late), grace_s)
                await asyncio.gather(*late, return_exceptions=True)
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
