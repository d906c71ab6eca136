"""``diagnose worker``: one probe worker of a coordinator's run (a pod of ``--on-cluster``).

::

    DIAGNOSER_WORKER_TOKEN=... diagnose worker --coordinator 10.0.0.5:7070 --index 3

It connects to the coordinator, waits at the barrier with the others, and sends its share of
every step it is given until the coordinator says exit or goes away (:mod:`diagnoser.probe.worker`).
In an Indexed Job the index comes from ``JOB_COMPLETION_INDEX``. Exit codes: 0 after the
coordinator's exit, 1 when it cannot be reached.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from diagnoser.cli.app import app, fail
from diagnoser.probe.worker import parse_address, run_worker

__all__ = ["worker_command"]


@app.command("worker")
def worker_command(
    coordinator: Annotated[str, typer.Option("--coordinator", help="host:port the coordinator listens on.")],
    index: Annotated[
        int | None, typer.Option("--index", min=0, help="Index (default: $JOB_COMPLETION_INDEX).")
    ] = None,
) -> None:
    """Run the probe's share a capacity coordinator gives this worker (local process or pod)."""
    try:
        parse_address(coordinator)
    except ValueError as exc:
        raise fail(f"--coordinator: {exc}") from exc
    if index is None:
        index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    raise typer.Exit(run_worker(coordinator, index))
