"""``diagnose capacity``: the highest rate that holds the SLO, and what gives way first.

::

    diagnose capacity http://127.0.0.1:8080/v1/features?user=42 --slo-p99-ms 50 \\
        --prometheus-url http://127.0.0.1:9090 --step-s 30 --plot knee.svg
    diagnose capacity probes/checkout.yaml --slo-p99-ms 200 --steps 1000,2000,3000 --format markdown
    diagnose capacity URL --slo-p99-ms 50 --expect-rps 400 --format json     # a CI gate

A URL typed here needs no allowlist entry; a probe file's host must be in
``probe.allowed_hosts``; no step is ever sent above ``probe.max_rate`` or longer than
``probe.max_duration_s``. Ctrl-C stops the running step and prints the partial table. Exit
codes: 0 the capacity meets ``--expect-rps`` (when given) or every step up to the maximum rate
held, 1 otherwise (including an interrupted run), 2 usage, configuration or safety refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console

from diagnoser.capacity.cluster import (
    DEFAULT_IMAGE,
    ClusterPlan,
    check_cluster_plan,
    create_objects,
    delete_objects,
    render_worker_job,
)
from diagnoser.capacity.plot import check_plot_path, write_plot
from diagnoser.capacity.render import render_capacity_markdown, render_capacity_table
from diagnoser.capacity.report import CapacityReport, CapacityStep
from diagnoser.capacity.run import CapacityOptions, CapacityRun
from diagnoser.capacity.step import StepPlan
from diagnoser.cli.app import (
    ConfigOption,
    FormatOption,
    GrpcDataOption,
    GrpcImportPathOption,
    GrpcMetadataOption,
    GrpcProtoOption,
    OutputFormat,
    app,
    fail,
    grpc_request,
    load_cli_settings,
    run_loop,
    stderr,
    stdout,
)
from diagnoser.config import Settings
from diagnoser.errors import DiagnoserError, ProbeWorkerError, SlackSendError
from diagnoser.probe import LiveStats, build_spec, enforce_safety
from diagnoser.probe.caps import capacity_caps
from diagnoser.probe.entry import GrpcRequest, resolve_target
from diagnoser.probe.running import InProcess, Launcher, default_workers
from diagnoser.probe.spec import check_resolved_addresses
from diagnoser.probe.worker import TOKEN_ENV, parse_address
from diagnoser.probe.workers import WorkerPool

__all__ = ["capacity_command"]


def _parse_steps(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise DiagnoserError(
            f"--steps {text!r}: give rates separated by commas, e.g. 1000,2000,3000"
        ) from exc
    if not rates or any(r <= 0 for r in rates) or rates != sorted(rates):
        raise DiagnoserError(f"--steps {text!r}: give positive rates in increasing order")
    return rates


def _options(settings: Settings, args: dict[str, Any]) -> CapacityOptions:
    caps = capacity_caps(settings.capacity)
    cap = caps.max_rate
    max_rate = args["max_rate"] if args["max_rate"] is not None else cap
    fixed = _parse_steps(args["steps"])
    if max_rate > cap or (fixed and fixed[-1] > cap):
        raise DiagnoserError(
            f"--max-rate/--steps above capacity.max_rate of {cap:g} req/s, the aggregate of every worker "
            f"(raise it in the config, up to {caps.rate_ceiling:g})"
        )
    if fixed:
        max_rate = fixed[-1]
    start = args["start_rate"] if args["start_rate"] is not None else max(1.0, max_rate / 10)
    if start > max_rate:
        raise DiagnoserError(f"--start-rate {start:g} is above --max-rate {max_rate:g}")
    if not 1 < args["growth"] <= 10 or not 0.01 <= args["precision"] < 1:
        raise DiagnoserError("--growth must be in (1, 10] and --precision in [0.01, 1)")
    return CapacityOptions(
        start_rate=start,
        max_rate=max_rate,
        growth=args["growth"],
        precision=args["precision"],
        fixed_steps=fixed,
        pause_s=args["pause_s"],
        warmup_s=args["warmup_s"],
        scout=args["scout"],
        max_steps=args["max_steps"],
        expect_rps=args["expect_rps"],
    )


def _plan(
    target: str,
    settings: Settings,
    step_s: float,
    slo_p99_ms: float,
    max_error_ratio: float,
    grpc: GrpcRequest | None = None,
) -> StepPlan:
    spec, explicit = build_spec(target, rate=1.0, duration_s=step_s, grpc=grpc)
    # The allowlist and the step's duration, up front.
    enforce_safety(spec, settings.probe, explicit_target=explicit, caps=capacity_caps(settings.capacity))
    # A gRPC target's message types, once for every step (and a bad method refused before any).
    spec = resolve_target(spec, settings.probe, explicit_target=explicit)
    return StepPlan(
        spec=spec,
        explicit_target=explicit,
        step_s=step_s,
        min_step_s=min(step_s, max(3.0, step_s / 3)),
        slo_p99_ms=slo_p99_ms,
        max_error_ratio=max_error_ratio,
    )


def _progress_printers(err: Console) -> tuple[Any, Any]:
    def on_progress(rate: float, live: LiveStats) -> None:
        p99 = "-" if live.recent_p99_ms is None else f"{live.recent_p99_ms:.1f} ms"
        err.print(
            f"\r  {rate:g} req/s  {live.elapsed_s:4.1f}/{live.planned_s:g} s  sent {live.sent}  "
            f"p99 {p99}  errors {live.failures}  in flight {live.in_flight}   ",
            end="",
            highlight=False,
            markup=False,
        )

    def on_step(step: CapacityStep) -> None:
        verdict = "held" if step.held else f"failed ({step.failed_on or 'interrupted'})"
        err.print(
            f"\r{step.rate:>8g} req/s: p99 {step.latency_ms.p99} ms, errors {step.error_ratio:.2%}, "
            f"{verdict}" + " " * 30,
            highlight=False,
            markup=False,
        )

    return on_progress, on_step


Target = Annotated[
    str, typer.Argument(help="A URL (http(s)://, grpc(s)://host:port/pkg.Svc/Method) or a probes/*.yaml.")
]
SloP99 = Annotated[float, typer.Option("--slo-p99-ms", help="p99 latency SLO in ms a step must hold.")]
ErrorRatio = Annotated[float, typer.Option("--max-error-ratio", help="Error ratio a step may have.")]
StartRate = Annotated[float | None, typer.Option("--start-rate", help="First step's req/s (default max/10).")]
MaxRate = Annotated[
    float | None, typer.Option("--max-rate", help="Highest req/s (default and cap: probe.max_rate).")
]
StepSeconds = Annotated[float, typer.Option("--step-s", help="Seconds per step.")]
FixedSteps = Annotated[
    str | None, typer.Option("--steps", help="Fixed steps instead of a search: 1000,2000,3000.")
]
Growth = Annotated[float, typer.Option("--growth", help="Each climbing step is this times the last.")]
Precision = Annotated[float, typer.Option("--precision", help="Narrow the knee to this share of it.")]
PauseSeconds = Annotated[float, typer.Option("--pause-s", help="Quiet seconds between steps.")]
WarmupSeconds = Annotated[
    float, typer.Option("--warmup-s", help="Unjudged seconds at the start rate before the first step.")
]
MaxSteps = Annotated[int, typer.Option("--max-steps", help="Never more steps than this.", min=1, max=50)]
ExpectRps = Annotated[
    float | None, typer.Option("--expect-rps", help="Exit 1 unless the capacity reaches this.")
]
PrometheusUrl = Annotated[
    str | None, typer.Option("--prometheus-url", help="Evaluate the rules at each step.")
]
PlotPath = Annotated[
    Path | None, typer.Option("--plot", help="Write p99/p50 against rate to FILE (.svg or .png).")
]
Scout = Annotated[
    bool, typer.Option("--scout/--no-scout", help="Cut climbing steps short once they clearly hold.")
]
PostToSlack = Annotated[bool, typer.Option("--slack", help="Post the report to the configured Slack once.")]
Workers = Annotated[
    int | None,
    typer.Option("--workers", "-w", min=1, max=256,
                 help="Local worker processes (default: one per core, no more than --max-rate needs)."),
]  # fmt: skip
RemoteWorkers = Annotated[
    int | None,
    typer.Option("--remote-workers", min=1, max=1000,
                 help="Wait for N workers started elsewhere (diagnose worker) instead of local ones."),
]  # fmt: skip
OnCluster = Annotated[
    int | None,
    typer.Option("--on-cluster", min=1, max=1000,
                 help="Run N worker pods as a Kubernetes Indexed Job (see --advertise, --image)."),
]  # fmt: skip
Listen = Annotated[
    str | None, typer.Option("--listen", help="host:port the coordinator waits for workers on.")
]
Advertise = Annotated[
    str | None, typer.Option("--advertise", help="host:port the worker pods reach this coordinator at.")
]
Image = Annotated[str | None, typer.Option("--image", help="The worker pods' image (diagnoser's).")]
Namespace = Annotated[str, typer.Option("--namespace", help="Namespace of the worker Job.")]
RenderJob = Annotated[
    Path | None,
    typer.Option("--render-job", help="Write the worker Job to FILE (or -) instead of creating it."),
]


@app.command("capacity")
def capacity_command(
    target: Target,
    slo_p99_ms: SloP99,
    max_error_ratio: ErrorRatio = 0.001,
    start_rate: StartRate = None,
    max_rate: MaxRate = None,
    step_s: StepSeconds = 30.0,
    steps: FixedSteps = None,
    growth: Growth = 2.0,
    precision: Precision = 0.1,
    pause_s: PauseSeconds = 1.0,
    warmup_s: WarmupSeconds = 2.0,
    scout: Scout = True,
    max_steps: MaxSteps = 16,
    expect_rps: ExpectRps = None,
    prometheus_url: PrometheusUrl = None,
    config: ConfigOption = None,
    output: FormatOption = OutputFormat.table,
    plot: PlotPath = None,
    slack: PostToSlack = False,
    workers: Workers = None,
    remote_workers: RemoteWorkers = None,
    on_cluster: OnCluster = None,
    listen: Listen = None,
    advertise: Advertise = None,
    image: Image = None,
    namespace: Namespace = "diagnoser",
    render_job: RenderJob = None,
    data: GrpcDataOption = None,
    proto: GrpcProtoOption = None,
    import_path: GrpcImportPathOption = None,
    metadata: GrpcMetadataOption = None,
) -> None:
    """Step open-loop load up to the SLO's knee; name the cause that appears there."""
    err = stderr
    settings = load_cli_settings(config, _overrides(slo_p99_ms, max_error_ratio, prometheus_url))
    try:
        options = _options(
            settings,
            dict(start_rate=start_rate, max_rate=max_rate, steps=steps, growth=growth, precision=precision,
                 pause_s=pause_s, warmup_s=warmup_s, scout=scout, max_steps=max_steps, expect_rps=expect_rps),
        )  # fmt: skip
        grpc = grpc_request(data, proto, import_path, metadata)
        plan = _plan(target, settings, step_s, slo_p99_ms, max_error_ratio, grpc)
        if plot is not None:
            check_plot_path(plot)
        sender = _slack_sender(settings) if slack else None
        choice = _workers(settings, options, dict(
            workers=workers, remote_workers=remote_workers, on_cluster=on_cluster, listen=listen,
            advertise=advertise, image=image, namespace=namespace, render_job=render_job))  # fmt: skip
    except DiagnoserError as exc:
        raise fail(str(exc)) from exc
    on_progress, on_step = _progress_printers(err) if err.is_terminal else (None, None)
    run = CapacityRun(
        plan, settings, options, on_progress=on_progress, on_step=on_step, launcher=choice.launcher
    )
    report = _measure(run, choice)
    _print(report, output)
    _write_and_post(report, plot, sender, err)
    raise typer.Exit(report.exit_code)


def _write_and_post(report: CapacityReport, plot: Path | None, sender: Any, err: Console) -> None:
    """The plot file and the Slack post, when asked for."""
    if plot is not None:
        write_plot(report, plot)
    if sender is not None:
        _post_to_slack(sender, report, err)


def _overrides(slo_p99_ms: float, max_error_ratio: float, prometheus_url: str | None) -> dict[str, Any]:
    overrides: dict[str, Any] = {"slo": {"p99_ms": slo_p99_ms, "error_ratio": max_error_ratio}}
    if prometheus_url:
        overrides["prometheus"] = {"url": prometheus_url}
    return overrides


def _measure(run: CapacityRun, choice: _WorkerChoice) -> CapacityReport:
    """The run on the one event loop; a failure before any step is one line and an exit."""
    # Ctrl-C stops the running step through the run's own stop(): its answers settle and the
    # partial table is printed instead of a traceback.
    try:
        return run_loop(_with_workers(run, choice), on_interrupt=run.stop)
    except ProbeWorkerError as exc:  # the workers did not all come: nothing was measured
        raise fail(str(exc), code=1) from exc
    except DiagnoserError as exc:  # the target's resolved address refused, the Job not created
        raise fail(str(exc)) from exc


@dataclass
class _WorkerChoice:
    launcher: Launcher
    pool: WorkerPool | None = None
    cluster: ClusterPlan | None = None
    render_to: Path | None = None


def _workers(settings: Settings, options: CapacityOptions, args: dict[str, Any]) -> _WorkerChoice:
    """Who sends the steps: this process, local worker processes, workers elsewhere, or pods."""
    if sum(1 for key in ("workers", "remote_workers", "on_cluster") if args[key] is not None) > 1:
        raise DiagnoserError("give only one of --workers, --remote-workers, --on-cluster")
    if args["on_cluster"] is not None or args["remote_workers"] is not None:
        listen = _address("--listen", args["listen"] or ("0.0.0.0:7070" if args["on_cluster"] else None))
        token = os.environ.get(TOKEN_ENV) or (secrets.token_hex(16) if args["on_cluster"] else "")
        if not token:
            raise DiagnoserError(f"--remote-workers: set {TOKEN_ENV} for the coordinator and its workers")
        count = args["on_cluster"] or args["remote_workers"]
        pool = WorkerPool(count, spawn=False, listen=listen, token=token, startup_s=300.0)
        cluster = None
        if args["on_cluster"] is not None:
            if not args["advertise"]:
                raise DiagnoserError("--on-cluster needs --advertise HOST:PORT (where the pods reach this)")
            image = args["image"] or DEFAULT_IMAGE
            cluster = ClusterPlan(count, args["advertise"], token, image=image, namespace=args["namespace"])
            check_cluster_plan(cluster)
        return _WorkerChoice(pool, pool, cluster, args["render_job"])
    if args["listen"] or args["advertise"] or args["render_job"]:
        raise DiagnoserError("--listen, --advertise, --render-job go with --remote-workers or --on-cluster")
    count = args["workers"] or settings.capacity.workers or default_workers(options.max_rate)
    if count == 1:
        return _WorkerChoice(InProcess())
    pool = WorkerPool(count)
    return _WorkerChoice(pool, pool)


def _address(flag: str, text: str | None) -> tuple[str, int]:
    if text is None:
        raise DiagnoserError(f"{flag} HOST:PORT is needed with --remote-workers")
    try:
        return parse_address(text)
    except ValueError as exc:
        raise DiagnoserError(f"{flag}: {exc}") from exc


async def _with_workers(run: CapacityRun, choice: _WorkerChoice) -> CapacityReport:
    """The run, with its workers started first (through the barrier) and stopped after."""
    plan = run.plan
    # Refused before any worker or pod starts, as before the first request.
    await check_resolved_addresses(plan.spec, run.settings.probe, explicit_target=plan.explicit_target)
    pool = choice.pool
    if pool is None:
        return await run.run()
    objects = render_worker_job(choice.cluster) if choice.cluster is not None else None
    created = False
    try:
        await pool.open()
        if objects is not None and choice.render_to is not None:
            _write_manifest(objects, choice.render_to)
        elif objects is not None:
            await create_objects(objects, run.settings.kubernetes)
            created = True
        await _barrier(pool, run)
        return await run.run()
    finally:
        await pool.aclose()
        if created and objects is not None:
            try:
                await delete_objects(objects, run.settings.kubernetes)
            except DiagnoserError as exc:  # the report still prints; say what was left behind
                stderr.print(f"warning: {exc}", markup=False, highlight=False)


async def _barrier(pool: WorkerPool, run: CapacityRun) -> None:
    """Wait for every worker; Ctrl-C meanwhile ends the wait (a cluster may take minutes)."""
    waiting = asyncio.ensure_future(pool.wait_for_workers())
    stopped = asyncio.ensure_future(run.stopped.wait())
    try:
        await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not waiting.done():
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        here = f"{len(pool.members())} of {pool.workers}"
        raise ProbeWorkerError(f"interrupted while waiting for the workers ({here} connected)")
    waiting.result()


def _write_manifest(objects: list[dict[str, Any]], path: Path) -> None:
    text = yaml.safe_dump_all(objects, sort_keys=False)
    if str(path) == "-":
        sys.stdout.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    stderr.print(f"worker Job written to {path}: apply it; waiting for its pods", markup=False)


def _print(report: CapacityReport, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    elif output is OutputFormat.markdown:
        sys.stdout.write(render_capacity_markdown(report))
    else:
        stdout.print(render_capacity_table(report))


def _slack_sender(settings: Settings) -> Any:
    from diagnoser.notify.slack_sender import SlackSender

    sender = SlackSender.from_settings(settings.slack)
    if sender is None:
        raise DiagnoserError(
            "--slack: no Slack configured (slack.webhook_url, or slack.token and slack.channel)"
        )
    return sender


def _post_to_slack(sender: Any, report: CapacityReport, err: Console) -> None:
    from diagnoser.capacity.slack import render_capacity_report

    try:
        run_loop(sender.post(render_capacity_report(report)))
    except SlackSendError as exc:
        err.print("[red]slack:[/red] ", end="")
        err.print(f"the report was not posted: {exc}", markup=False, highlight=False, soft_wrap=True)
