"""``diagnose worker``: one probe worker of a coordinator's run (a pod of ``--on-cluster``).

::

    DIAGNOSER_WORKER_TOKEN=... diagnose worker --coordinator 10.0.0.5:7070 --index 3 \\
        --allow-target checkout.shop.svc

It connects to the coordinator, checks that the coordinator holds the run's token and proves
that it does too (the token never crosses the wire), waits at the barrier with the others, and
sends its share of every step it is given until the coordinator says exit or goes away
(:mod:`diagnoser.probe.worker`). What it sends is bounded by its own limits, whatever it is told:
``capacity.max_rate`` and ``capacity.max_duration_s`` of its own configuration (``--config``,
``DIAGNOSER_*``), ``probe.allowed_hosts``, and the hosts ``--allow-target`` names, which count as
a URL typed on its command line. In an Indexed Job the index comes from ``JOB_COMPLETION_INDEX``.
Exit codes: 0 after the coordinator's exit, 1 when it cannot be reached or does not prove it
holds the token, 2 for a usage or configuration error (a token under 128 bits among them).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from diagnoser.cli.app import ConfigOption, app, fail
from diagnoser.errors import ConfigError
from diagnoser.probe.worker import WorkerLimits, parse_address, run_worker, worker_token

__all__ = ["worker_command"]


@app.command("worker")
def worker_command(
    coordinator: Annotated[str, typer.Option("--coordinator", help="host:port the coordinator listens on.")],
    index: Annotated[
        int | None, typer.Option("--index", min=0, help="Index (default: $JOB_COMPLETION_INDEX).")
    ] = None,
    allow_target: Annotated[
        list[str] | None,
        typer.Option("--allow-target", help="A host this worker may probe, as if typed here (repeatable)."),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Run the probe's share a capacity coordinator gives this worker (local process or pod)."""
    try:
        parse_address(coordinator)
    except ValueError as exc:
        raise fail(f"--coordinator: {exc}") from exc
    try:
        worker_token()
        limits = WorkerLimits.load(config, allow_target or [])
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    if index is None:
        index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    raise typer.Exit(run_worker(coordinator, index, limits))
