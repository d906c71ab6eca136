"""``diagnose rules list | lint | test | export``: the rule pack as users see, check, test and export it."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from diagnoser.cli.app import (
    AtOption,
    ConfigOption,
    FormatOption,
    OutputFormat,
    PrometheusOption,
    fail,
    load_cli_rules,
    load_cli_settings,
    rules_app,
    run_loop,
    stderr,
    stdout,
    write_out,
)
from diagnoser.cli.timeparse import parse_instant
from diagnoser.errors import ConfigError, LocalPrometheusError

if TYPE_CHECKING:
    from diagnoser.config import Settings
    from diagnoser.signals import Catalogue

__all__ = ["rules_export", "rules_lint", "rules_list", "rules_test"]


@rules_app.command("list")
def rules_list(
    config: ConfigOption = None,
    rules_dir: Annotated[list[Path] | None, typer.Option("--rules", help="Extra rule directory.")] = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """List every rule: id, cause, severity, sources, runbook."""
    settings = load_cli_settings(config)
    ruleset = load_cli_rules(settings, rules_dir)
    rows = [
        {
            "id": rule.id,
            "cause": rule.cause,
            "kind": rule.kind,
            "severity": rule.severity.value,
            "sources": list(rule.sources),
            "title": rule.title,
            "runbook_url": rule.runbook_url(settings.runbook_base_url),
            **({"new_cause": rule.new_cause} if rule.new_cause else {}),
        }
        for rule in sorted(ruleset, key=lambda r: r.id)
    ]
    if output is OutputFormat.json:
        write_out(json.dumps(rows, indent=2) + "\n")
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
        causes = [
            r["cause"] + (" (symptom)" if r["kind"] == "symptom" else " (new)" if r.get("new_cause") else "")
            for r in rows
        ]
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
    from diagnoser.ruleset.lint import LintInputs, lint_queries, lint_static

    overrides: dict[str, Any] = {"prometheus": {"url": prometheus_url}} if prometheus_url else {}
    settings = load_cli_settings(config, overrides)
    ruleset = load_cli_rules(settings, rules_dir)
    problems = [str(p) for p in ruleset.problems]
    inputs = LintInputs.from_settings(settings)
    for line in lint_static(ruleset, inputs):
        stderr.print("[yellow]rule problem:[/yellow] ", end="")
        stderr.print(line, markup=False, highlight=False, soft_wrap=True)
        problems.append(line)
    if settings.prometheus.url:
        problems += run_loop(lint_queries(ruleset, inputs))
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
    from diagnoser.testing.rules import run_rule_tests

    settings = load_cli_settings(config)
    try:
        results = run_rule_tests(files, base_config=settings.model_dump(mode="json"))
    except (ConfigError, LocalPrometheusError) as exc:
        raise fail(str(exc)) from exc
    failed = [r for r in results if not r.passed]
    for result in results:
        mark = "[green]PASS[/green]" if result.passed else "[red]FAIL[/red]"
        stdout.print(f"{mark} ", end="", highlight=False)
        stdout.print(result.name, markup=False, highlight=False, soft_wrap=True)
        for problem in result.problems:
            stdout.print(f"     {problem}", markup=False, highlight=False, soft_wrap=True)
    stdout.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    raise typer.Exit(1 if failed else 0)


@rules_app.command("export")
def rules_export(
    recording: Annotated[
        bool, typer.Option("--recording", help="The pack's recorded conditions as a diag:* rule group.")
    ] = False,
    config: ConfigOption = None,
    rules_dir: Annotated[list[Path] | None, typer.Option("--rules", help="Extra rule directory.")] = None,
    interval: Annotated[
        str | None, typer.Option("--interval", help="The group's evaluation interval (default: the ruler's).")
    ] = None,
    output_file: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the rule file here instead of stdout.")
    ] = None,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            "--prometheus-url",
            help="Also record the families this Prometheus holds that are recognised by their shape.",
        ),
    ] = None,
    at: AtOption = None,
) -> None:
    """Export the rule pack for another system: --recording writes a Prometheus rule file for a ruler."""
    import yaml

    from diagnoser.promql import duration_seconds
    from diagnoser.ruleset.lint import LintInputs
    from diagnoser.ruleset.recording import recorded_conditions, recording_group

    if not recording:
        raise fail("say what to export: --recording")
    if interval is not None:
        try:
            duration_seconds(interval)
        except ValueError as exc:
            raise fail(f"--interval: {exc}") from exc
    overrides: dict[str, Any] = {"prometheus": {"url": prometheus_url}} if prometheus_url else {}
    settings = load_cli_settings(config, overrides)
    ruleset = load_cli_rules(settings, rules_dir)
    inputs = LintInputs.from_settings(settings)
    catalogue = inputs.catalogue
    if prometheus_url:
        try:
            instant = parse_instant(at) if at else datetime.now(UTC)
        except ValueError as exc:
            raise fail(f"--at: {exc}") from exc
        catalogue = run_loop(with_recognised(settings, catalogue, instant))
    elif at is not None:
        raise fail("--at says when to recognise families: give --prometheus-url too")
    recorded = recorded_conditions(
        ruleset, inputs.variables, catalogue, signals=settings.signals, renames=inputs.renames
    )
    text = yaml.safe_dump(recording_group(recorded, interval=interval), sort_keys=False, width=1 << 16)
    if output_file is None:
        sys.stdout.write(text)
    else:
        output_file.write_text(text)
        stderr.print(f"{len(recorded)} recording rules written to {output_file}", highlight=False)
    raise typer.Exit(1 if ruleset.problems else 0)


async def with_recognised(settings: Settings, catalogue: Catalogue, at: datetime) -> Catalogue:
    """``catalogue`` with the conventions recognised by shape on the settings' Prometheus at ``at``
    (an unreachable server is a usage error: the export would silently lack them)."""
    from diagnoser.models import SourceError
    from diagnoser.promql import duration_seconds
    from diagnoser.signals import Catalogue
    from diagnoser.signals.recognition import recognition
    from diagnoser.sources.prometheus import PrometheusSource

    source = PrometheusSource(settings.prometheus, metric_overrides=settings.metrics)
    try:
        found = await recognition(source, catalogue, at, max(300.0, duration_seconds(settings.window)))
    finally:
        await source.aclose()
    if isinstance(found, SourceError):
        raise fail(f"cannot recognise families on {source.url}: {found.message}")
    return Catalogue(
        signals=catalogue.signals,
        conventions=[*catalogue.conventions, *found.conventions],
        expanded=catalogue.expanded,
    )
