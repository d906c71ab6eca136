"""``diagnose capacity``: the highest rate that holds the SLO, and what gives way first.

::

    diagnose capacity http://127.0.0.1:8080/v1/features?user=42 --slo-p99-ms 50 \\
        --prometheus-url http://127.0.0.1:9090 --step-s 30 --plot knee.svg
    diagnose capacity probes/checkout.yaml --slo-p99-ms 200 --steps 1000,2000,3000 --format markdown
    diagnose capacity URL --slo-p99-ms 50 --expect-rps 400 --format json     # a CI gate

A URL typed here needs no allowlist entry; a probe file's host must be in
``probe.allowed_hosts``; no step is ever sent above ``capacity.max_rate`` (all workers together)
or longer than ``capacity.max_duration_s``. Ctrl-C stops the running step and prints the partial
table. The flags come in groups (:class:`SloFlags`, :class:`SearchFlags`, :class:`WorkerFlags`,
:class:`ReportFlags` and the shared :class:`~diagnoser.cli.app.GrpcFlags`), each checked by its
own part of the command. Exit
codes: 0 the capacity meets ``--expect-rps`` (when given) or every step up to the maximum rate
held, 1 otherwise (including an interrupted run), 2 usage, configuration or safety refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console

from diagnoser.capacity.cluster import (
    DEFAULT_IMAGE,
    RUN_LABEL,
    ClusterPlan,
    check_cluster_plan,
    create_objects,
    delete_objects,
    render_worker_job,
)
from diagnoser.capacity.plot import check_plot_path, write_plot
from diagnoser.capacity.render import render_capacity_markdown, render_capacity_table
from diagnoser.capacity.report import CapacityReport, CapacityStep
from diagnoser.capacity.run import CapacityInputs, CapacityOptions, CapacityRun
from diagnoser.capacity.step import StepPlan
from diagnoser.cli.app import (
    ConfigOption,
    FlagGroup,
    FormatOption,
    GrpcFlags,
    OutputFormat,
    PrometheusOption,
    app,
    check_listen,
    deprecated,
    fail,
    finite,
    grouped,
    load_cli_settings,
    run_loop,
    stderr,
    stdout,
    write_out,
)
from diagnoser.cli.capacity_record import CapacityRecorder, RecordFlags
from diagnoser.config import Settings
from diagnoser.errors import ConfigError, DiagnoserError, ProbeWorkerError, SlackSendError
from diagnoser.probe import LiveStats, build_spec, enforce_safety
from diagnoser.probe.caps import capacity_caps
from diagnoser.probe.entry import GrpcRequest, resolve_target
from diagnoser.probe.running import InProcess, Launcher, default_workers
from diagnoser.probe.spec import check_resolved_addresses
from diagnoser.probe.wire import new_token
from diagnoser.probe.worker import TOKEN_ENV, WorkerLimits, parse_address, worker_token
from diagnoser.probe.workers import WorkerPool

__all__ = ["ReportFlags", "SearchFlags", "SloFlags", "WorkerFlags", "capacity_command"]

#: Without --slo-error-ratio or slo.error_ratio set in the config, a step holds at 0.1 % errors:
#: stricter than the rules' default SLO, since a load test looks for the first errors.
DEFAULT_STEP_ERROR_RATIO = 0.001


def _parse_steps(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        rates = [finite(part) for part in text.split(",") if part.strip()]
    except typer.BadParameter as exc:
        raise ConfigError(f"--steps {text!r}: give rates separated by commas, e.g. 1000,2000,3000") from exc
    if not rates or any(r <= 0 for r in rates) or rates != sorted(rates):
        raise ConfigError(f"--steps {text!r}: give positive rates in increasing order")
    return rates


def _positive(flag: str, value: float | None, *, zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not zero)):
        raise ConfigError(f"{flag} {value:g}: give a {'non-negative' if zero else 'positive'} number")


@dataclass(frozen=True)
class SloFlags(FlagGroup):
    """What each step is judged against: the rules' SLO settings, as ``diagnose now`` names them."""

    slo_p99_ms: Annotated[
        float, typer.Option("--slo-p99-ms", parser=finite, help="p99 latency SLO in ms a step must hold.")
    ]
    slo_error_ratio: Annotated[
        float | None,
        typer.Option("--slo-error-ratio", parser=finite,
                     help="Error ratio a step may have (default: slo.error_ratio if set, else 0.001)."),
    ] = None  # fmt: skip
    max_error_ratio: Annotated[
        float | None,
        typer.Option("--max-error-ratio", parser=finite, hidden=True, help="Old name of --slo-error-ratio."),
    ] = None

    def error_ratio(self, configured: float | None) -> float:
        """The step's error-ratio SLO: the flag, the old flag, the config's, or the load test's default."""
        if self.max_error_ratio is not None:
            deprecated("--max-error-ratio", "--slo-error-ratio")
            if self.slo_error_ratio is not None and self.slo_error_ratio != self.max_error_ratio:
                raise ConfigError("--max-error-ratio is the old name of --slo-error-ratio: give one of them")
        given = self.slo_error_ratio if self.slo_error_ratio is not None else self.max_error_ratio
        if given is not None:
            return given
        return configured if configured is not None else DEFAULT_STEP_ERROR_RATIO


@dataclass(frozen=True)
class SearchFlags(FlagGroup):
    """Which rates are tried, for how long, and when the search stops."""

    start_rate: Annotated[
        float | None, typer.Option("--start-rate", parser=finite, help="First step's req/s (default max/10).")
    ] = None
    max_rate: Annotated[
        float | None,
        typer.Option("--max-rate", parser=finite, help="Highest req/s (default and cap: capacity.max_rate)."),
    ] = None
    step_s: Annotated[float, typer.Option("--step-s", parser=finite, help="Seconds per step.")] = 30.0
    steps: Annotated[
        str | None, typer.Option("--steps", help="Fixed steps instead of a search: 1000,2000,3000.")
    ] = None
    growth: Annotated[
        float, typer.Option("--growth", parser=finite, help="Each climbing step is this times the last.")
    ] = 2.0
    precision: Annotated[
        float, typer.Option("--precision", parser=finite, help="Narrow the knee to this share of it.")
    ] = 0.1
    pause_s: Annotated[
        float, typer.Option("--pause-s", parser=finite, help="Quiet seconds between steps.")
    ] = 1.0
    warmup_s: Annotated[
        float,
        typer.Option(
            "--warmup-s", parser=finite, help="Unjudged seconds at the start rate before the first step."
        ),
    ] = 2.0
    scout: Annotated[
        bool, typer.Option("--scout/--no-scout", help="Cut climbing steps short once they clearly hold.")
    ] = True
    max_steps: Annotated[
        int, typer.Option("--max-steps", help="Never more steps than this.", min=1, max=50)
    ] = 16
    expect_rps: Annotated[
        float | None,
        typer.Option("--expect-rps", parser=finite, help="Exit 1 unless the capacity reaches this."),
    ] = None

    def options(self, settings: Settings) -> CapacityOptions:
        """The search, checked against the capacity caps (``ConfigError`` naming the flag)."""
        caps = capacity_caps(settings.capacity)
        cap = caps.max_rate
        for flag, value in (("--start-rate", self.start_rate), ("--max-rate", self.max_rate),
                            ("--step-s", self.step_s), ("--expect-rps", self.expect_rps)):  # fmt: skip
            _positive(flag, value)
        _positive("--pause-s", self.pause_s, zero=True)
        _positive("--warmup-s", self.warmup_s, zero=True)
        # A pause or a warm-up is part of the run: no longer than a step may be.
        for flag, value in (("--pause-s", self.pause_s), ("--warmup-s", self.warmup_s)):
            if value > caps.max_duration_s:
                raise ConfigError(
                    f"{flag} {value:g}: at most {caps.max_duration_s:g} s "
                    f"({caps.duration_setting}, the longest a step may be)"
                )
        max_rate = self.max_rate if self.max_rate is not None else cap
        fixed = _parse_steps(self.steps)
        if max_rate > cap or (fixed and fixed[-1] > cap):
            raise ConfigError(
                f"--max-rate/--steps above capacity.max_rate of {cap:g} req/s, the aggregate of every worker "
                f"(raise it in the config, up to {caps.rate_ceiling:g})"
            )
        if fixed:
            max_rate = fixed[-1]
        start = self.start_rate if self.start_rate is not None else max(1.0, max_rate / 10)
        if start > max_rate:
            raise ConfigError(f"--start-rate {start:g} is above --max-rate {max_rate:g}")
        if not 1 < self.growth <= 10 or not 0.01 <= self.precision < 1:
            raise ConfigError("--growth must be in (1, 10] and --precision in [0.01, 1)")
        return CapacityOptions(
            start_rate=start,
            max_rate=max_rate,
            growth=self.growth,
            precision=self.precision,
            fixed_steps=fixed,
            pause_s=self.pause_s,
            warmup_s=self.warmup_s,
            scout=self.scout,
            max_steps=self.max_steps,
            expect_rps=self.expect_rps,
        )


@dataclass(frozen=True)
class WorkerFlags(FlagGroup):
    """Who sends the steps: this process, local worker processes, workers elsewhere, or pods."""

    workers: Annotated[
        int | None,
        typer.Option("--workers", "-w", min=1, max=256,
                     help="Local worker processes (default: one per core, no more than --max-rate needs)."),
    ] = None  # fmt: skip
    remote_workers: Annotated[
        int | None,
        typer.Option("--remote-workers", min=1, max=1000,
                     help="Wait for N workers started elsewhere (diagnose worker) instead of local ones."),
    ] = None  # fmt: skip
    on_cluster: Annotated[
        int | None,
        typer.Option("--on-cluster", min=1, max=1000,
                     help="Run N worker pods as a Kubernetes Indexed Job (see --advertise, --image)."),
    ] = None  # fmt: skip
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen", help="host:port the coordinator waits for workers on (--on-cluster: --advertise's)."
        ),
    ] = None
    advertise: Annotated[
        str | None, typer.Option("--advertise", help="host:port the worker pods reach this coordinator at.")
    ] = None
    image: Annotated[str | None, typer.Option("--image", help="The worker pods' image (diagnoser's).")] = None
    job_namespace: Annotated[
        str | None, typer.Option("--job-namespace", help="Namespace of the worker Job [default: diagnoser].")
    ] = None
    namespace: Annotated[
        str | None, typer.Option("--namespace", hidden=True, help="Old name of --job-namespace.")
    ] = None
    render_job: Annotated[
        Path | None,
        typer.Option("--render-job", help="Write the worker Job to FILE (or -) instead of creating it."),
    ] = None

    def namespace_of_job(self) -> str:
        if self.namespace is not None:
            deprecated("--namespace", "--job-namespace")
            if self.job_namespace is not None and self.job_namespace != self.namespace:
                raise ConfigError("--namespace is the old name of --job-namespace: give one of them")
        return self.job_namespace or self.namespace or "diagnoser"


@dataclass(frozen=True)
class ReportFlags(FlagGroup):
    """What is printed, drawn and posted at the end."""

    output: FormatOption = OutputFormat.table
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write p99/p50 against rate to FILE (.svg or .png).")
    ] = None
    slack: Annotated[bool, typer.Option("--slack", help="Post the report to the configured Slack once.")] = (
        False
    )


def _plan(target: str, settings: Settings, step_s: float, grpc: GrpcRequest) -> StepPlan:
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
        slo_p99_ms=settings.slo.p99_ms,
        max_error_ratio=settings.slo.error_ratio,
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


@app.command("capacity")
@grouped
def capacity_command(
    target: Annotated[
        str, typer.Argument(help="A URL (http(s)://, grpc(s)://host:port/pkg.Svc/Method) or a probes/*.yaml.")
    ],
    slo: SloFlags,
    search: SearchFlags,
    workers: WorkerFlags,
    report: ReportFlags,
    grpc: GrpcFlags,
    record: RecordFlags,
    prometheus_url: Annotated[
        str | None, typer.Option("--prometheus-url", help="Evaluate the rules at each step.")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Step open-loop load up to the SLO's knee; name the cause that appears there."""
    err = stderr
    try:
        settings = _settings(config, slo, prometheus_url)
        options = search.options(settings)
        plan = _plan(target, settings, search.step_s, grpc.request())
        if report.plot is not None:
            check_plot_path(report.plot)
        sender = _slack_sender(settings) if report.slack else None
        choice = _workers(settings, options, plan, workers)
        recorder = CapacityRecorder(record, config, plan.spec)
    except DiagnoserError as exc:
        raise fail(str(exc)) from exc
    on_progress, on_step = _progress_printers(err) if err.is_terminal else (None, None)
    inputs = CapacityInputs.from_settings(settings)
    run = CapacityRun(
        plan, inputs, options, on_progress=on_progress, on_step=on_step, launcher=choice.launcher
    )
    result = _measure(run, choice)
    _print(result, report.output)
    recorder.record(result)
    _write_and_post(result, report.plot, sender, err)
    raise typer.Exit(result.exit_code)


def _settings(config: Path | None, slo: SloFlags, prometheus_url: PrometheusOption) -> Settings:
    """The settings with the SLO of this run over them (the rules judge each step by it too)."""
    overrides: dict[str, Any] = {"slo": {"p99_ms": slo.slo_p99_ms}}
    if prometheus_url:
        overrides["prometheus"] = {"url": prometheus_url}
    settings = load_cli_settings(config, overrides)
    configured = settings.slo.error_ratio if "error_ratio" in settings.slo.model_fields_set else None
    error_ratio = slo.error_ratio(configured)
    return load_cli_settings(
        config, {**overrides, "slo": {"p99_ms": slo.slo_p99_ms, "error_ratio": error_ratio}}
    )


def _write_and_post(report: CapacityReport, plot: Path | None, sender: Any, err: Console) -> None:
    """The plot file and the Slack post, when asked for."""
    if plot is not None:
        write_plot(report, plot)
    if sender is not None:
        _post_to_slack(sender, report, err)


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


def _workers(
    settings: Settings, options: CapacityOptions, plan: StepPlan, flags: WorkerFlags
) -> _WorkerChoice:
    """Who sends the steps: this process, local worker processes, workers elsewhere, or pods."""
    if sum(1 for n in (flags.workers, flags.remote_workers, flags.on_cluster) if n is not None) > 1:
        raise ConfigError("give only one of --workers, --remote-workers, --on-cluster")
    spec = plan.spec
    limits = WorkerLimits.of(settings.probe, capacity_caps(settings.capacity),
                             [spec.host] if plan.explicit_target else [])  # fmt: skip
    namespace = flags.namespace_of_job()
    if flags.on_cluster is not None or flags.remote_workers is not None:
        token = _token(generate=flags.on_cluster is not None)
        count = flags.on_cluster or flags.remote_workers or 1
        cluster = None
        if flags.on_cluster is not None:
            if not flags.advertise:
                raise ConfigError("--on-cluster needs --advertise HOST:PORT (where the pods reach this)")
            image = flags.image or DEFAULT_IMAGE
            cluster = ClusterPlan(
                count, flags.advertise, token, image=image, namespace=namespace, limits=limits
            )
            check_cluster_plan(cluster)
        listen = _listen(flags)
        check_listen("--listen", *listen)
        pool = WorkerPool(count, spawn=False, listen=listen, token=token, startup_s=300.0)
        if (
            flags.render_job is not None
            and str(flags.render_job) != "-"
            and not flags.render_job.parent.is_dir()
        ):
            raise ConfigError(
                f"--render-job {flags.render_job}: directory {flags.render_job.parent} does not exist"
            )
        return _WorkerChoice(pool, pool, cluster, flags.render_job)
    if flags.listen or flags.advertise or flags.render_job:
        raise ConfigError("--listen, --advertise, --render-job go with --remote-workers or --on-cluster")
    count = flags.workers or settings.capacity.workers or default_workers(options.max_rate)
    if count == 1:
        return _WorkerChoice(InProcess())
    pool = WorkerPool(count, limits=limits)
    return _WorkerChoice(pool, pool)


def _token(*, generate: bool) -> str:
    """``$DIAGNOSER_WORKER_TOKEN`` (checked), or a new token for the pods of ``--on-cluster``."""
    if generate and not os.environ.get(TOKEN_ENV):
        return new_token()
    return worker_token()


_WILDCARDS = ("0.0.0.0", "::", "")


def _listen(flags: WorkerFlags) -> tuple[str, int]:
    """Where the coordinator listens; for pods, one address of this machine, never all of them."""
    if flags.on_cluster is not None and flags.advertise is not None:
        text = flags.listen or flags.advertise
        host, port = _address("--listen" if flags.listen else "--advertise", text)
        if host in _WILDCARDS:
            raise ConfigError(
                f"--listen {text}: the workers' port is open to the pods only on the pod's own address; "
                "give it (the pod IP), not a wildcard"
            )
        if flags.listen is None and not _is_local(host):
            raise ConfigError(
                f"--advertise {flags.advertise} is not an address of this machine (a Service's, or NAT): "
                "give --listen POD_IP:PORT too"
            )
        return host, port
    if flags.listen is None:
        raise ConfigError("--listen HOST:PORT is needed with --remote-workers")
    return _address("--listen", flags.listen)


def _is_local(host: str) -> bool:
    """Whether ``host`` is an IP address this machine can listen on."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
    except OSError:
        return False
    return True


def _address(flag: str, text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


async def _with_workers(run: CapacityRun, choice: _WorkerChoice) -> CapacityReport:
    """The run, with its workers started first (through the barrier) and stopped after."""
    plan = run.plan
    # Refused before any worker or pod starts, as before the first request.
    await check_resolved_addresses(plan.spec, run.probe, explicit_target=plan.explicit_target)
    pool = choice.pool
    if pool is None:
        return await run.run()
    cluster = choice.cluster
    objects = render_worker_job(cluster, suspended=choice.render_to is None) if cluster is not None else None
    created = False
    try:
        await pool.open()
        if objects is not None and choice.render_to is not None:
            _write_manifest(objects, choice.render_to)
        elif objects is not None:
            await create_objects(objects, run.diagnosis.sources.kubernetes)
            created = True
        await _barrier(pool, run)
        return await run.run()
    finally:
        await pool.aclose()
        if created and objects is not None:
            try:
                await delete_objects(objects, run.diagnosis.sources.kubernetes)
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
    """The Job and its Secret as YAML: to stdout, or to a file only its owner can read (the token)."""
    text = yaml.safe_dump_all(objects, sort_keys=False)
    if str(path) == "-":
        write_out(text)
    else:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o600)  # a file that was there before keeps no wider mode
            out.write(text)
    run = objects[0]["metadata"]["labels"][RUN_LABEL]
    stderr.print(
        f"worker Job written to {path}: apply it (delete it after with kubectl delete -f, or "
        f"kubectl delete job,secret -l {RUN_LABEL}={run}); waiting for its pods",
        markup=False,
        highlight=False,
    )


def _print(report: CapacityReport, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        write_out(report.model_dump_json(indent=2) + "\n")
    elif output is OutputFormat.markdown:
        write_out(render_capacity_markdown(report))
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
