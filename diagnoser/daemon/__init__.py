"""The always-on daemon behind ``diagnose serve``: scheduled diagnoses and probes, Slack once per problem.

:class:`Daemon` (:mod:`~diagnoser.daemon.service`) opens the SQLite state, builds the sources once,
serves ``/healthz``, ``/readyz``, ``/findings``, ``/metrics`` and the Alertmanager receiver
(:mod:`~diagnoser.daemon.http`), and runs its jobs (:mod:`~diagnoser.daemon.jobs`) on one event
loop; :func:`run_daemon` runs it until SIGTERM. The names are loaded on first use, so importing
this package (or :mod:`diagnoser.daemon.state`) does not load aiohttp or APScheduler. ::

    from diagnoser.daemon import run_daemon
    asyncio.run(run_daemon(settings))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagnoser.daemon.service import Daemon, run_daemon

__all__ = ["Daemon", "run_daemon"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from diagnoser.daemon import service

        return getattr(service, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
