"""``diagnose now``: what is wrong right now (or ``--at`` a past instant), ranked, with evidence.

Exit codes: 0 nothing at warning or above, 1 something is, 2 usage or configuration error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from diagnoser.cli.app import (
    ConfigOption,
    FormatOption,
    GrpcFlags,
    OutputFormat,
    PrometheusOption,
    app,
    check_inputs_or_exit,
    configure_logging,
    configured_sources,
    fail,
    finite,
    grouped,
    load_cli_rules,
    load_cli_settings,
    run_loop,
    stderr,
    stdout,
    write_out,
)
from diagnoser.cli.timeparse import parse_instant
from diagnoser.config import Settings
from diagnoser.engine import DiagnosisConfig, run_diagnosis
from diagnoser.engine.deadline import Deadline
from diagnoser.engine.run import ProbeSupplier
from diagnoser.engine.scope import ReportScope
from diagnoser.errors import ConfigError, DiagnoserError
from diagnoser.models import Diagnosis
from diagnoser.notify import render_json, render_markdown, render_table
from diagnoser.probe.entry import GrpcRequest, PreparedProbe, prepare_probe
from diagnoser.probe.result import ProbeResult
from diagnoser.ruleset import RuleSet

if TYPE_CHECKING:
    from diagnoser.sources.kubernetes.credentials import Credentials

__all__ = ["now"]

At = Annotated[
    str | None,
    typer.Option(
        "--at",
        help="Evaluate as of this instant: RFC 3339 with a zone, unix seconds, or a time ago (-30m, 2h).",
    ),
]
SloP99 = Annotated[float | None, typer.Option("--slo-p99-ms", parser=finite, help="p99 latency SLO in ms.")]
SloErrors = Annotated[
    float | None, typer.Option("--slo-error-ratio", parser=finite, help="Error ratio SLO, e.g. 0.01.")
]
RuleDirs = Annotated[list[Path] | None, typer.Option("--rules", help="Extra rule directory (repeatable).")]
DeadlineSeconds = Annotated[
    float | None, typer.Option("--deadline", parser=finite, help="Overall deadline in seconds for all rules.")
]
Kubeconfig = Annotated[
    Path | None, typer.Option("--kubeconfig", help="Read Kubernetes with this kubeconfig.")
]
Context = Annotated[str | None, typer.Option("--context", help="kubeconfig context.")]
InCluster = Annotated[
    bool, typer.Option("--in-cluster", help="Read Kubernetes with the pod's service account.")
]
Namespaces = Annotated[
    list[str] | None,
    typer.Option(
        "--namespace",
        "-n",
        help="Only this namespace (repeatable): Kubernetes reads, and findings by their namespace label "
        "(the report's scope; capacity's --job-namespace is where its worker Job goes).",
    ),
]
MinSeverity = Annotated[
    str | None,
    typer.Option("--severity", help="Only rules and findings at this severity or above (e.g. warning)."),
]
Causes = Annotated[list[str] | None, typer.Option("--cause", help="Only rules of this cause (repeatable).")]
RuleIds = Annotated[
    list[str] | None, typer.Option("--rule", help="Only this rule id or glob, 'pools/*' (repeatable).")
]
EsUrls = Annotated[
    list[str] | None, typer.Option("--elasticsearch-url", help="Elasticsearch URL (repeatable).")
]
Slowlogs = Annotated[
    list[Path] | None,
    typer.Option("--slowlog", help="Elasticsearch slow log file or directory (repeatable)."),
]
Probe = Annotated[str | None, typer.Option("--probe", help="Probe first: a probes/*.yaml file or a URL.")]
ProbeRate = Annotated[float, typer.Option("--probe-rate", parser=finite, help="Requests/s for --probe URL.")]
ProbeDuration = Annotated[
    float, typer.Option("--probe-duration", parser=finite, help="Seconds for --probe URL.")
]
UseRecorded = Annotated[
    bool,
    typer.Option(
        "--use-recorded",
        help="Read the diag:* recordings of conditions (rules export --recording) where a ruler writes them.",
    ),
]
Verbose = Annotated[
    int,
    typer.Option(
        "--verbose", "-v", count=True, help="-v: all evidence rows, diagnoser's log; -vv: libraries' too."
    ),
]


@dataclass(frozen=True)
class _SourceFlags:
    """The flags that configure sources; each one overrides its setting from the config file."""

    prometheus_url: str | None
    kubeconfig: Path | None
    context: str | None
    in_cluster: bool
    namespaces: list[str]
    elasticsearch_urls: list[str]
    slowlogs: list[Path]

    def overrides(self) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        if self.prometheus_url:
            overrides["prometheus"] = {"url": self.prometheus_url}
        k8s: dict[str, Any] = {}
        if self.namespaces:
            # Scopes Kubernetes when it is configured; on its own it does not turn Kubernetes on.
            k8s["namespaces"] = self.namespaces
        if self.kubeconfig or self.context or self.in_cluster:
            k8s["enabled"] = True
            k8s.update({"kubeconfig": str(self.kubeconfig)} if self.kubeconfig else {})
            k8s.update({"context": self.context} if self.context else {})
            k8s.update({"in_cluster": True} if self.in_cluster else {})
        if k8s:
            overrides["kubernetes"] = k8s
        es: dict[str, Any] = {}
        if self.elasticsearch_urls:
            es["urls"] = self.elasticsearch_urls
        if self.slowlogs:
            es["slowlog_paths"] = [str(p) for p in self.slowlogs]
        if es:
            overrides["elasticsearch"] = es
        return overrides


@app.command()
@grouped
def now(
    *,
    config: ConfigOption = None,
    prometheus_url: PrometheusOption = None,
    at: At = None,
    slo_p99_ms: SloP99 = None,
    slo_error_ratio: SloErrors = None,
    output: FormatOption = OutputFormat.table,
    rules_dir: RuleDirs = None,
    deadline: DeadlineSeconds = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    in_cluster: InCluster = False,
    namespace: Namespaces = None,
    severity: MinSeverity = None,
    cause: Causes = None,
    rule: RuleIds = None,
    elasticsearch_url: EsUrls = None,
    slowlog: Slowlogs = None,
    probe: Probe = None,
    probe_rate: ProbeRate = 10.0,
    probe_duration: ProbeDuration = 10.0,
    grpc_flags: GrpcFlags,
    verbose: Verbose = 0,
    use_recorded: UseRecorded = False,
) -> None:
    """Diagnose now (or --at a past instant): ranked causes, evidence, numbers, runbooks."""
    configure_logging(verbose)
    flags = _SourceFlags(
        prometheus_url,
        kubeconfig,
        context,
        in_cluster,
        namespace or [],
        elasticsearch_url or [],
        slowlog or [],
    )
    overrides = flags.overrides()
    slo = {"p99_ms": slo_p99_ms, "error_ratio": slo_error_ratio}
    if any(v is not None for v in slo.values()):
        overrides["slo"] = {k: v for k, v in slo.items() if v is not None}
    if deadline is not None:
        overrides["deadline_s"] = deadline
    if use_recorded:
        overrides.setdefault("prometheus", {})["use_recorded"] = True
    settings = load_cli_settings(config, overrides)
    configure_logging(verbose, settings)  # again, now that its secrets are known: they are masked
    credentials = check_inputs_or_exit(settings)
    try:
        instant = parse_instant(at) if at else datetime.now(UTC)
    except ValueError as exc:
        raise fail(f"--at: {exc}") from exc
    scope, ruleset = _selected_rules(settings, rules_dir, severity, cause or [], rule or [], namespace or [])
    grpc = grpc_flags.request()
    if grpc.given and not probe:
        raise fail("--data, --proto, --import-path and --metadata go with --probe grpc://...")
    prepared_probe = _prepare_probe(probe, probe_rate, probe_duration, settings, grpc) if probe else None
    if not [name for name in configured_sources(settings) if name != "probe"] and prepared_probe is None:
        raise fail(
            "no source configured: give --prometheus-url, --kubeconfig, --elasticsearch-url, "
            "--slowlog or --probe (or set them in --config)"
        )
    run = _Run(settings, ruleset, instant, credentials)
    diagnosis = scope.apply(_diagnose_with_spinner(run, prepared_probe))
    _print_diagnosis(diagnosis, output, verbose > 0)
    raise typer.Exit(diagnosis.exit_code)


def _selected_rules(
    settings: Settings,
    rules_dir: list[Path] | None,
    severity: str | None,
    causes: list[str],
    rule_ids: list[str],
    namespaces: list[str],
) -> tuple[ReportScope, RuleSet]:
    """The report's scope from the filter flags, and the rules it selects."""
    try:
        scope = ReportScope.from_flags(
            severity=severity, causes=causes, rules=rule_ids, namespaces=namespaces
        )
        return scope, scope.select(load_cli_rules(settings, rules_dir))
    except ConfigError as exc:
        raise fail(str(exc)) from exc


@dataclass(frozen=True)
class _Run:
    """What one ``diagnose now`` evaluates, as checked: the credentials are loaded already."""

    settings: Settings
    rules: RuleSet
    instant: datetime
    credentials: Credentials | None

    def diagnose(self, probe: ProbeSupplier | None) -> Diagnosis:
        # The deadline counts from the process's start: start-up, rule loading and the probe
        # spend it too (run_diagnosis owns it from here).
        deadline = Deadline.of_process(self.settings.deadline_s)
        return run_loop(
            run_diagnosis(
                DiagnosisConfig.from_settings(self.settings),
                rules=self.rules,
                at=self.instant,
                probe=probe,
                credentials=self.credentials,
                deadline=deadline,
            )
        )


def _diagnose_with_spinner(run: _Run, prepared_probe: ProbeSupplier | None) -> Diagnosis:
    """Run the diagnosis; on a terminal, with a spinner on stderr naming the current phase."""
    if not stderr.is_terminal:
        return run.diagnose(prepared_probe)
    sources = [name for name in configured_sources(run.settings) if name != "probe"]
    if prepared_probe is not None:
        sources.append("probe")
    evaluating = f"evaluating {len(run.rules)} rules against {', '.join(sources)}"
    with stderr.status(evaluating if prepared_probe is None else "probing the target") as status:
        probe: ProbeSupplier | None = None
        if prepared_probe is not None:
            prepared = prepared_probe

            async def probe() -> ProbeResult | None:
                try:
                    return await prepared()
                finally:
                    status.update(evaluating)

        return run.diagnose(probe)


def _prepare_probe(
    target: str, rate: float, duration: float, settings: Settings, grpc: GrpcRequest
) -> PreparedProbe:
    # A gRPC target's types are resolved now, within the run's deadline (it counts from the
    # process's start, as the rules' does).
    left = Deadline.of_process(settings.deadline_s).left_s()
    try:
        return prepare_probe(
            target, rate=rate, duration_s=duration, settings=settings.probe, grpc=grpc, within_s=left
        )
    except DiagnoserError as exc:
        raise fail(str(exc)) from exc


def _print_diagnosis(diagnosis: Diagnosis, output: OutputFormat, verbose: bool) -> None:
    if output is OutputFormat.json:
        write_out(render_json(diagnosis) + "\n")
    elif output is OutputFormat.markdown:
        write_out(render_markdown(diagnosis) + "\n")
    else:
        stdout.print(render_table(diagnosis, verbose=verbose, width=stdout.width, links=stdout.is_terminal))
