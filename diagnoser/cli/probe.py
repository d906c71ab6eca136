"""``diagnose probe``: run one open-loop probe from the command line and print its report.

::

    diagnose probe http://127.0.0.1:8080/health --rate 50 --duration 30
    diagnose probe probes/example.yaml --format json > run.json
    diagnose probe https://api.internal/v1/items --rate 200 --duration 120 --ramp 30

A URL typed here is the user's explicit intent and needs no allowlist entry; a probe file's
host must be in ``probe.allowed_hosts``. Above 1,000 req/s (the probe's ceiling) the run is a
load test: ``--load-test`` holds it to ``capacity.max_rate`` instead, and ``--workers N`` (by
default one per usable core, no more than the rate needs) sends it from N processes whose
histograms are merged exactly. While it runs, a progress line shows the achieved
rate, the p99 of the last half second and the failures; Ctrl-C stops it cleanly and prints the
partial report. Exit codes: 0 all answers good, 1 failures or an abort, 2 usage, configuration
or safety refusal, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from diagnoser.cli.app import (
    ConfigOption,
    GrpcFlags,
    TableOrJson,
    TableOrJsonOption,
    app,
    fail,
    finite,
    grouped,
    load_cli_settings,
    run_loop,
    stderr,
    stdout,
)
from diagnoser.errors import DiagnoserError, ProbeWorkerError
from diagnoser.probe.caps import capacity_caps
from diagnoser.probe.entry import PreparedProbe, build_spec
from diagnoser.probe.open_loop import INTERRUPTED
from diagnoser.probe.report import render_report
from diagnoser.probe.result import ProbeResult

__all__ = ["INTERRUPTED_EXIT", "exit_code_for", "probe_command"]


#: Exit code after Ctrl-C, as shells report a process ended by SIGINT (128 + 2).
INTERRUPTED_EXIT = 130


def exit_code_for(result: ProbeResult) -> int:
    """0 when every answer was good; 1 on failures or a safety abort; 130 after Ctrl-C."""
    if result.aborted and result.abort_reason == INTERRUPTED:
        return INTERRUPTED_EXIT
    if result.failures.total or result.aborted:
        return 1
    return 0


async def _run_with_progress(probe: PreparedProbe, console: Console, show_progress: bool) -> ProbeResult:
    task = asyncio.get_running_loop().create_task(probe())
    if not show_progress:
        return await task
    progress = Progress(
        TextColumn("[bold]probe[/bold]"),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
        transient=True,
    )
    with progress:
        bar = progress.add_task("probe", total=probe.spec.duration_s, stats="starting")
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            live = probe.live()
            p99 = "-" if live.recent_p99_ms is None else f"{live.recent_p99_ms:.1f} ms"
            progress.update(
                bar,
                completed=min(live.elapsed_s, live.planned_s),
                stats=(
                    f"{live.achieved_rate:7.1f} req/s  p99 {p99}  errors {live.failures}  "
                    f"in flight {live.in_flight}  sent {live.sent}"
                ),
            )
    return await task


@app.command("probe")
@grouped
def probe_command(
    target: Annotated[
        str,
        typer.Argument(help="A URL (http(s)://, grpc(s)://host:port/pkg.Svc/Method) or a probes/*.yaml."),
    ],
    *,
    rate: Annotated[
        float | None,
        typer.Option("--rate", "-r", parser=finite, help="Requests per second (default 10 for a URL)."),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option("--duration", "-d", parser=finite, help="Seconds to run (default 10 for a URL)."),
    ] = None,
    ramp: Annotated[
        float | None,
        typer.Option(
            "--ramp", parser=finite, help="Seconds to ramp up from 1 req/s to --rate before holding it."
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", "-w", min=1, max=256,
                     help="Processes sending the load (default: one per core, no more than the rate needs)."),
    ] = None,
    load_test: Annotated[
        bool,
        typer.Option("--load-test", help="An explicit load test: capacity.* caps (up to 100,000 req/s) "
                     "instead of the probe's (up to 1,000)."),
    ] = False,
    output: TableOrJsonOption = TableOrJson.table,
    config: ConfigOption = None,
    grpc_flags: GrpcFlags,
) -> None:
    """Send a steady open-loop load and report latency percentiles, errors and bad answers."""
    settings = load_cli_settings(config)
    caps = capacity_caps(settings.capacity) if load_test else None
    try:
        grpc = grpc_flags.request()
        spec, explicit = build_spec(target, rate=rate, duration_s=duration, ramp_s=ramp, grpc=grpc)
        count = workers or settings.capacity.workers
        probe = PreparedProbe(spec, settings.probe, explicit_target=explicit, caps=caps, workers=count)
        progress = _run_with_progress(probe, stderr, show_progress=stderr.is_terminal)
        result = run_loop(progress, on_interrupt=probe.stop)
    except ProbeWorkerError as exc:  # a worker died mid-run: the run failed, no silently lower rate
        raise fail(str(exc), code=1) from exc
    except DiagnoserError as exc:  # a bad target, a safety refusal, the resolved address refused
        raise fail(str(exc)) from exc
    if output is TableOrJson.json:
        sys.stdout.write(json.dumps(result.model_dump(mode="json")) + "\n")
    else:
        stdout.print(render_report(result))
    raise typer.Exit(exit_code_for(result))

