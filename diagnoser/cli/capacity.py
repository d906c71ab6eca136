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

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

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
from diagnoser.errors import DiagnoserError, SlackSendError
from diagnoser.probe import LiveStats, build_spec, enforce_safety
from diagnoser.probe.entry import GrpcRequest, resolve_target

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
    cap = settings.probe.max_rate
    max_rate = args["max_rate"] if args["max_rate"] is not None else cap
    fixed = _parse_steps(args["steps"])
    if max_rate > cap or (fixed and fixed[-1] > cap):
        raise DiagnoserError(
            f"--max-rate/--steps above the probe cap of {cap:g} req/s (raise probe.max_rate in the config)"
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
    enforce_safety(spec, settings.probe, explicit_target=explicit)  # allowlist and duration, up front
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
    data: GrpcDataOption = None,
    proto: GrpcProtoOption = None,
    import_path: GrpcImportPathOption = None,
    metadata: GrpcMetadataOption = None,
) -> None:
    """Step open-loop load up to the SLO's knee; name the cause that appears there."""
    err = stderr
    overrides: dict[str, Any] = {"slo": {"p99_ms": slo_p99_ms, "error_ratio": max_error_ratio}}
    if prometheus_url:
        overrides["prometheus"] = {"url": prometheus_url}
    settings = load_cli_settings(config, overrides)
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
    except DiagnoserError as exc:
        raise fail(str(exc)) from exc
    on_progress, on_step = _progress_printers(err) if err.is_terminal else (None, None)
    run = CapacityRun(plan, settings, options, on_progress=on_progress, on_step=on_step)
    # Ctrl-C stops the running step through the run's own stop(): its answers settle and the
    # partial table is printed instead of a traceback.
    report = run_loop(run.run(), on_interrupt=run.stop)
    _print(report, output)
    if plot is not None:
        write_plot(report, plot)
    if sender is not None:
        _post_to_slack(sender, report, err)
    raise typer.Exit(report.exit_code)


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
