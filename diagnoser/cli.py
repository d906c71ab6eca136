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
from rich.console import Console
from rich.table import Table

from diagnoser.config import Settings, load_settings
from diagnoser.errors import ConfigError, DiagnoserError
from diagnoser.models import Diagnosis
from diagnoser.notify import render_json, render_markdown, render_table
from diagnoser.ruleset import RuleSet
from diagnoser.runner import ProbeRunner, load_ruleset, run_diagnosis
from diagnoser.timeparse import parse_instant

__all__ = ["app", "main"]

app = typer.Typer(
    name="diagnose",
    help="Find why a service is slow or failing: the root cause, the evidence and a number to act on.",
    no_args_is_help=True,
    add_completion=False,
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
    if extra_dirs:
        settings = settings.model_copy(update={"rule_dirs": [*settings.rule_dirs, *extra_dirs]})
    ruleset = load_ruleset(settings)
    for problem in ruleset.problems:
        stderr.print("[yellow]rule error:[/yellow] ", end="")
        stderr.print(str(problem), markup=False, highlight=False, soft_wrap=True)
    return ruleset


@app.command()
def now(
    config: ConfigOption = None,
    prometheus_url: PrometheusOption = None,
    at: Annotated[
        str | None, typer.Option("--at", help="Evaluate as of this instant: RFC 3339 or unix seconds.")
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
        typer.Option("--namespace", "-n", help="Kubernetes namespace (repeatable; default all)."),
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
        bool, typer.Option("--verbose", "-v", help="Show every evidence row; log details.")
    ] = False,
) -> None:
    """Diagnose now (or --at a past instant): ranked causes, evidence, numbers, runbooks."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, stream=sys.stderr)
    overrides: dict[str, Any] = {}
    if prometheus_url:
        overrides.setdefault("prometheus", {})["url"] = prometheus_url
    if slo_p99_ms is not None:
        overrides.setdefault("slo", {})["p99_ms"] = slo_p99_ms
    if slo_error_ratio is not None:
        overrides.setdefault("slo", {})["error_ratio"] = slo_error_ratio
    if deadline is not None:
        overrides["deadline_s"] = deadline
    if kubeconfig or context or in_cluster or namespace:
        k8s: dict[str, Any] = overrides.setdefault("kubernetes", {})
        k8s["enabled"] = True
        if kubeconfig:
            k8s["kubeconfig"] = str(kubeconfig)
        if context:
            k8s["context"] = context
        if in_cluster:
            k8s["in_cluster"] = True
        if namespace:
            k8s["namespaces"] = namespace
    if elasticsearch_url:
        overrides.setdefault("elasticsearch", {})["urls"] = elasticsearch_url
    if slowlog:
        overrides.setdefault("elasticsearch", {})["slowlog_paths"] = [str(p) for p in slowlog]
    settings = _settings(config, overrides)
    try:
        instant = parse_instant(at) if at else datetime.now(UTC)
    except ValueError as exc:
        raise _fail(f"--at: {exc}") from exc
    ruleset = _rules(settings, rules_dir)
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
    diagnosis = asyncio.run(run_diagnosis(settings, rules=ruleset, at=instant, probe=probe_runner))
    _print_diagnosis(diagnosis, output, verbose)
    raise typer.Exit(diagnosis.exit_code)


def _probe_runner(target: str, rate: float, duration: float, settings: Settings) -> ProbeRunner:
    try:
        from diagnoser.probe.integration import probe_runner_for
    except ImportError as exc:  # pragma: no cover - the probe package ships with diagnoser
        raise _fail(f"the probe is not available: {exc}") from exc
    try:
        return probe_runner_for(target, rate=rate, duration_s=duration, settings=settings)
    except DiagnoserError as exc:
        raise _fail(str(exc)) from exc


def _print_diagnosis(diagnosis: Diagnosis, output: OutputFormat, verbose: bool) -> None:
    if output is OutputFormat.json:
        sys.stdout.write(render_json(diagnosis) + "\n")
    elif output is OutputFormat.markdown:
        sys.stdout.write(render_markdown(diagnosis) + "\n")
    else:
        stdout.print(render_table(diagnosis, verbose=verbose))


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
        table = Table("rule", "cause", "kind", "severity", "sources")
        for r in rows:
            table.add_row(r["id"], r["cause"], r["kind"], r["severity"], ", ".join(r["sources"]))
        stdout.print(table)
    raise typer.Exit(1 if ruleset.problems else 0)


@rules_app.command("lint")
def rules_lint(
    config: ConfigOption = None,
    prometheus_url: PrometheusOption = None,
    rules_dir: Annotated[list[Path] | None, typer.Option("--rules", help="Extra rule directory.")] = None,
) -> None:
    """Validate every rule file; with a Prometheus, also run each query to check it parses and evaluates."""
    from diagnoser.lint import lint_queries

    overrides: dict[str, Any] = {"prometheus": {"url": prometheus_url}} if prometheus_url else {}
    settings = _settings(config, overrides)
    ruleset = _rules(settings, rules_dir)
    problems = [str(p) for p in ruleset.problems]
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
