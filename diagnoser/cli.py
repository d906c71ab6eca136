"""The ``diagnose`` command line.

    diagnose now --prometheus-url http://prometheus:9090            # what is wrong right now
    diagnose now --at 2026-11-29T20:00:00Z --format markdown         # post-incident, as of then
    diagnose rules list | lint | test FILE...                        # the rule pack
    diagnose probe URL --rate 50 --duration 30                       # an open-loop probe
    diagnose capacity URL --slo-p99-ms 50 --prometheus-url URL       # the rate that holds the SLO
    diagnose serve --config diagnoser.yaml                           # the always-on daemon

Exit codes (``now``): 0 nothing at warning or above, 1 something is, 2 usage or configuration error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from diagnoser.config import Settings, check_inputs, configured_sources, load_settings
from diagnoser.deadline import remaining_deadline
from diagnoser.errors import ConfigError, DiagnoserError
from diagnoser.models import Diagnosis
from diagnoser.notify import render_json, render_markdown, render_table
from diagnoser.ruleset import RuleSet
from diagnoser.runner import ProbeRunner, load_ruleset, run_diagnosis
from diagnoser.scope import ReportScope
from diagnoser.timeparse import parse_instant

__all__ = ["app", "main"]

app = typer.Typer(
    name="diagnose",
    help="Find why a service is slow or failing: the root cause, the evidence and a number to act on.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
rules_app = typer.Typer(help="List, lint and test rules.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")

stdout = Console(soft_wrap=False)
stderr = Console(stderr=True)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    markdown = "markdown"


def _print_version(value: bool) -> None:
    if value:
        from diagnoser import __version__

        sys.stdout.write(f"diagnose {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _global_options(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Find why a service is slow or failing: the root cause, the evidence and a number to act on."""


def _fail(message: str, code: int = 2) -> typer.Exit:
    stderr.print("[red]error:[/red] ", end="")
    stderr.print(message, markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config file (DIAGNOSER_* variables override it).")
]
PrometheusOption = Annotated[
    str | None, typer.Option("--prometheus-url", help="PromQL API base URL (Prometheus, Thanos, Mimir...).")
]


def _settings(config: Path | None, overrides: dict[str, Any]) -> Settings:
    try:
        return load_settings(config, overrides=overrides)
    except ConfigError as exc:
        raise _fail(str(exc)) from exc


def _rules(settings: Settings, extra_dirs: list[Path] | None = None) -> RuleSet:
    for directory in extra_dirs or []:
        if not directory.exists():
            raise _fail(f"--rules: {directory} does not exist")
    if extra_dirs:
        settings = settings.model_copy(update={"rule_dirs": [*settings.rule_dirs, *extra_dirs]})
    try:
        ruleset = load_ruleset(settings)
    except ConfigError as exc:
        raise _fail(str(exc)) from exc
    for problem in ruleset.problems:
        stderr.print("[yellow]rule error:[/yellow] ", end="")
        stderr.print(str(problem), markup=False, highlight=False, soft_wrap=True)
    return ruleset


@app.command()
def now(
    config: ConfigOption = None,
    prometheus_url: PrometheusOption = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="Evaluate as of this instant: RFC 3339 with a zone, unix seconds, or a time ago (-30m, 2h).",
        ),
    ] = None,
    slo_p99_ms: Annotated[float | None, typer.Option("--slo-p99-ms", help="p99 latency SLO in ms.")] = None,
    slo_error_ratio: Annotated[
        float | None, typer.Option("--slo-error-ratio", help="Error ratio SLO, e.g. 0.01.")
    ] = None,
    output: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="Output format.")
    ] = OutputFormat.table,
    rules_dir: Annotated[
        list[Path] | None, typer.Option("--rules", help="Extra rule directory (repeatable).")
    ] = None,
    deadline: Annotated[
        float | None, typer.Option("--deadline", help="Overall deadline in seconds for all rules.")
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="Read Kubernetes with this kubeconfig.")
    ] = None,
    context: Annotated[str | None, typer.Option("--context", help="kubeconfig context.")] = None,
    in_cluster: Annotated[
        bool, typer.Option("--in-cluster", help="Read Kubernetes with the pod's service account.")
    ] = False,
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Only this namespace (repeatable): Kubernetes reads, and findings by their namespace label.",
        ),
    ] = None,
    severity: Annotated[
        str | None,
        typer.Option("--severity", help="Only rules and findings at this severity or above (e.g. warning)."),
    ] = None,
    cause: Annotated[
        list[str] | None, typer.Option("--cause", help="Only rules of this cause (repeatable).")
    ] = None,
    rule: Annotated[
        list[str] | None, typer.Option("--rule", help="Only this rule id or glob, 'pools/*' (repeatable).")
    ] = None,
    elasticsearch_url: Annotated[
        list[str] | None, typer.Option("--elasticsearch-url", help="Elasticsearch URL (repeatable).")
    ] = None,
    slowlog: Annotated[
        list[Path] | None,
        typer.Option("--slowlog", help="Elasticsearch slow log file or directory (repeatable)."),
    ] = None,
    probe: Annotated[
        str | None, typer.Option("--probe", help="Probe first: a probes/*.yaml file or a URL.")
    ] = None,
    probe_rate: Annotated[float, typer.Option("--probe-rate", help="Requests/s for --probe URL.")] = 10.0,
    probe_duration: Annotated[
        float, typer.Option("--probe-duration", help="Seconds for --probe URL.")
    ] = 10.0,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose", "-v", count=True, help="-v: all evidence rows, diagnoser's log; -vv: libraries' too."
        ),
    ] = 0,
) -> None:
    """Diagnose now (or --at a past instant): ranked causes, evidence, numbers, runbooks."""
    _configure_logging(verbose)
    overrides: dict[str, Any] = {}
    if prometheus_url:
        overrides.setdefault("prometheus", {})["url"] = prometheus_url
    if slo_p99_ms is not None:
        overrides.setdefault("slo", {})["p99_ms"] = slo_p99_ms
    if slo_error_ratio is not None:
        overrides.setdefault("slo", {})["error_ratio"] = slo_error_ratio
    if deadline is not None:
        overrides["deadline_s"] = deadline
    if namespace:
        # Scopes Kubernetes when it is configured; on its own it does not turn Kubernetes on.
        overrides.setdefault("kubernetes", {})["namespaces"] = namespace
    if kubeconfig or context or in_cluster:
        k8s: dict[str, Any] = overrides.setdefault("kubernetes", {})
        k8s["enabled"] = True
        if kubeconfig:
            k8s["kubeconfig"] = str(kubeconfig)
        if context:
            k8s["context"] = context
        if in_cluster:
            k8s["in_cluster"] = True
    if elasticsearch_url:
        overrides.setdefault("elasticsearch", {})["urls"] = elasticsearch_url
    if slowlog:
        overrides.setdefault("elasticsearch", {})["slowlog_paths"] = [str(p) for p in slowlog]
    settings = _settings(config, overrides)
    _check_inputs(settings)
    try:
        instant = parse_instant(at) if at else datetime.now(UTC)
    except ValueError as exc:
        raise _fail(f"--at: {exc}") from exc
    try:
        scope = ReportScope.from_flags(
            severity=severity, causes=cause or [], rules=rule or [], namespaces=namespace or []
        )
        ruleset = scope.select(_rules(settings, rules_dir))
    except ConfigError as exc:
        raise _fail(str(exc)) from exc
    probe_runner = _probe_runner(probe, probe_rate, probe_duration, settings) if probe else None
    if (
        settings.prometheus.url is None
        and not settings.kubernetes.enabled
        and not settings.elasticsearch.urls
        and not settings.elasticsearch.slowlog_paths
        and probe_runner is None
    ):
        raise _fail(
            "no source configured: give --prometheus-url, --kubeconfig, --elasticsearch-url, "
            "--slowlog or --probe (or set them in --config)"
        )
    # The deadline counts from the command's start: start-up and rule loading spend it too.
    settings = settings.model_copy(update={"deadline_s": remaining_deadline(settings.deadline_s)})
    diagnosis = scope.apply(_diagnose_with_spinner(settings, ruleset, instant, probe_runner))
    _print_diagnosis(diagnosis, output, verbose > 0)
    raise typer.Exit(diagnosis.exit_code)


#: Client libraries whose INFO/WARNING chatter (urllib3 retries, elastic_transport node
#: failures, httpx requests) repeats what the report already says; shown from -vv on.
_LIBRARY_LOGGERS = (
    "urllib3", "elastic_transport", "elasticsearch", "httpx", "httpcore", "kubernetes", "asyncio",
    "aiohttp", "apscheduler", "py.warnings",
)  # fmt: skip


def _configure_logging(verbosity: int) -> None:
    """Warnings of diagnoser's own by default; its debug log with -v; every library's with -vv."""
    logging.basicConfig(
        level=logging.DEBUG if verbosity >= 2 else logging.WARNING,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.captureWarnings(True)  # library warnings.warn() calls go through logging too
    if verbosity >= 1:
        logging.getLogger("diagnoser").setLevel(logging.DEBUG)
    if verbosity < 2:
        for name in _LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


def _diagnose_with_spinner(
    settings: Settings, ruleset: RuleSet, instant: datetime, probe_runner: ProbeRunner | None
) -> Diagnosis:
    """Run the diagnosis; on a terminal, with a spinner on stderr naming the current phase."""
    if not stderr.is_terminal:
        return asyncio.run(run_diagnosis(settings, rules=ruleset, at=instant, probe=probe_runner))
    sources = [name for name in configured_sources(settings) if name != "probe"]
    if probe_runner is not None:
        sources.append("probe")
    evaluating = f"evaluating {len(ruleset)} rules against {', '.join(sources)}"
    with stderr.status(evaluating if probe_runner is None else "probing the target") as status:
        probe: ProbeRunner | None = None
        if probe_runner is not None:
            runner = probe_runner

            async def probe() -> Any:
                try:
                    return await runner()
                finally:
                    status.update(evaluating)

        return asyncio.run(run_diagnosis(settings, rules=ruleset, at=instant, probe=probe))


def _check_inputs(settings: Settings) -> None:
    """Exit 2 on inputs that cannot work: missing paths, a kubeconfig that does not load."""
    try:
        check_inputs(settings)
    except ConfigError as exc:
        raise _fail(str(exc)) from exc


def _probe_runner(target: str, rate: float, duration: float, settings: Settings) -> ProbeRunner:
    try:
        from diagnoser.probe.entry import prepare_probe
    except ImportError as exc:  # pragma: no cover - the probe package ships with diagnoser
        raise _fail(f"the probe is not available: {exc}") from exc
    try:
        return prepare_probe(target, rate=rate, duration_s=duration, settings=settings.probe)
    except DiagnoserError as exc:
        raise _fail(str(exc)) from exc


def _print_diagnosis(diagnosis: Diagnosis, output: OutputFormat, verbose: bool) -> None:
    if output is OutputFormat.json:
        sys.stdout.write(render_json(diagnosis) + "\n")
    elif output is OutputFormat.markdown:
        sys.stdout.write(render_markdown(diagnosis) + "\n")
    else:
        stdout.print(render_table(diagnosis, verbose=verbose, width=stdout.width, links=stdout.is_terminal))


@rules_app.command("list")
def rules_list(
    config: ConfigOption = None,
    rules_dir: Annotated[list[Path] | None, typer.Option("--rules", help="Extra rule directory.")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """List every rule: id, cause, severity, sources, runbook."""
    settings = _settings(config, {})
    ruleset = _rules(settings, rules_dir)
    rows = [
        {
            "id": rule.id,
            "cause": rule.cause,
            "kind": rule.kind,
            "severity": rule.severity.value,
            "sources": list(rule.sources),
            "title": rule.title,
            "runbook_url": rule.runbook_url(settings.runbook_base_url),
        }
        for rule in sorted(ruleset, key=lambda r: r.id)
    ]
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    elif output is OutputFormat.markdown:
        lines = ["| rule | cause | severity | sources | runbook |", "|---|---|---|---|---|"]
        lines += [
            f"| `{r['id']}` | `{r['cause']}` | {r['severity']} | {', '.join(r['sources'])} "
            f"| [runbook]({r['runbook_url']}) |"
            for r in rows
        ]
        sys.stdout.write("\n".join(lines) + "\n")
    else:
        # The id is what users copy into --rule, rule_params and tests: never cut it; the other
        # columns wrap instead.
        widest = max((len(r["id"]) for r in rows), default=4)
        causes = [r["cause"] + (" (symptom)" if r["kind"] == "symptom" else "") for r in rows]
        if stdout.width >= widest + max((len(c) for c in causes), default=5) + 36:
            table = Table(box=box.SIMPLE, pad_edge=False)
            table.add_column("rule", no_wrap=True)
            table.add_column("cause", no_wrap=True)
            table.add_column("severity", no_wrap=True)
            table.add_column("sources", overflow="fold")
            for r, cause in zip(rows, causes, strict=True):
                table.add_row(r["id"], cause, r["severity"], ", ".join(r["sources"]))
            stdout.print(table)
        else:  # narrow: the id on a line of its own, the rest below it
            for r, cause in zip(rows, causes, strict=True):
                stdout.print(r["id"], style="bold", no_wrap=True, overflow="ignore", highlight=False)
                stdout.print(f"    {cause} · {r['severity']} · {', '.join(r['sources'])}", highlight=False)
    raise typer.Exit(1 if ruleset.problems else 0)


@rules_app.command("lint")
def rules_lint(
    config: ConfigOption = None,
    prometheus_url: PrometheusOption = None,
    rules_dir: Annotated[list[Path] | None, typer.Option("--rules", help="Extra rule directory.")] = None,
) -> None:
    """Validate every rule file; with a Prometheus, also run each query to check it parses and evaluates."""
    from diagnoser.lint import lint_queries, lint_static

    overrides: dict[str, Any] = {"prometheus": {"url": prometheus_url}} if prometheus_url else {}
    settings = _settings(config, overrides)
    ruleset = _rules(settings, rules_dir)
    problems = [str(p) for p in ruleset.problems]
    for line in lint_static(ruleset, settings):
        stderr.print("[yellow]rule problem:[/yellow] ", end="")
        stderr.print(line, markup=False, highlight=False, soft_wrap=True)
        problems.append(line)
    if settings.prometheus.url:
        problems += asyncio.run(lint_queries(ruleset, settings))
        for line in problems[len(ruleset.problems) :]:
            stderr.print("[yellow]query error:[/yellow] ", end="")
            stderr.print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        stderr.print("no Prometheus given: queries were not checked (use --prometheus-url)")
    stdout.print(f"{len(ruleset)} rules, {len(problems)} problems")
    raise typer.Exit(1 if problems else 0)


@rules_app.command("test")
def rules_test(
    files: Annotated[list[Path], typer.Argument(help="Rule test files (promtool-style input_series).")],
    config: ConfigOption = None,
) -> None:
    """Run rule unit tests on a real, backfilled local Prometheus (needs the prometheus package)."""
    from diagnoser.local_prometheus import LocalPrometheusError
    from diagnoser.rulestest import run_rule_tests

    settings = _settings(config, {})
    try:
        results = run_rule_tests(files, base_settings=settings)
    except (ConfigError, LocalPrometheusError) as exc:
        raise _fail(str(exc)) from exc
    failed = [r for r in results if not r.passed]
    for result in results:
        mark = "[green]PASS[/green]" if result.passed else "[red]FAIL[/red]"
        stdout.print(f"{mark} ", end="", highlight=False)
        stdout.print(result.name, markup=False, highlight=False, soft_wrap=True)
        for problem in result.problems:
            stdout.print(f"     {problem}", markup=False, highlight=False, soft_wrap=True)
    stdout.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    raise typer.Exit(1 if failed else 0)


def _mount_probe_command() -> None:
    try:
        from diagnoser.probe.cli import probe_command
    except ImportError:
        return
    app.command("probe")(probe_command)


def _mount_serve_command() -> None:
    try:
        from diagnoser.serve_cli import serve_command
    except ImportError:
        return
    app.command("serve")(serve_command)


def _mount_capacity_command() -> None:
    try:
        from diagnoser.capacity.cli import capacity_command
    except ImportError:
        return
    app.command("capacity")(capacity_command)


_mount_probe_command()
_mount_serve_command()
_mount_capacity_command()


def main() -> None:
    """Console-script entry point."""
    app()
