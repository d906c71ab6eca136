"""``diagnose signals``: what the rules will find on a Prometheus, per service, and what they will not.

    diagnose signals --prometheus-url http://prometheus:9090
    diagnose signals --prometheus-url URL --at 2026-11-29T20:00:00Z --format json

Per service: each signal (``pool.used``, ``http.server.duration``...) and resource with a limit,
the convention that answers it or ``inferred (...)`` saying from what, the metric, the unit it is
read in and the labels; then what looks like a duration, a pool or a limit but was not
recognised, and why. Exit 0, or 2 for a usage error; a Prometheus that cannot be read is printed
as an error and exits 1.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from diagnoser.cli.app import (
    ConfigOption,
    FormatOption,
    OutputFormat,
    PrometheusOption,
    app,
    check_format,
    fail,
    load_cli_settings,
    run_loop,
    stdout,
)
from diagnoser.cli.timeparse import parse_instant
from diagnoser.promql import duration_seconds
from diagnoser.signals import load_catalogue
from diagnoser.signals.inventory import Inventory, inventory
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["signals"]

At = Annotated[
    str | None,
    typer.Option(
        "--at", help="As of this instant: RFC 3339 with a zone, unix seconds, or a time ago (-30m)."
    ),
]


@app.command("signals")
def signals(
    config: ConfigOption = None,
    prometheus_url: PrometheusOption = None,
    at: At = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """What was recognised on a Prometheus, per service, and what looks like a signal but was not."""
    check_format(output, (OutputFormat.table, OutputFormat.json))
    overrides: dict[str, Any] = {"prometheus": {"url": prometheus_url}} if prometheus_url else {}
    settings = load_cli_settings(config, overrides)
    if not settings.prometheus.url:
        raise fail("no Prometheus: give --prometheus-url or prometheus.url in the config")
    try:
        instant = parse_instant(at) if at else datetime.now(UTC)
    except ValueError as exc:
        raise fail(f"--at: {exc}") from exc
    catalogue = load_catalogue(tuple(settings.signal_files))
    lookback = max(300.0, duration_seconds(settings.window))

    async def read() -> Inventory:
        source = PrometheusSource(settings.prometheus, metric_overrides=settings.metrics)
        try:
            return await inventory(source, catalogue, instant, lookback)
        finally:
            await source.aclose()

    found = run_loop(read())
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(as_json(found, instant), indent=2) + "\n")
    else:
        _print_table(found, instant)
    raise typer.Exit(1 if found.errors else 0)


def as_json(found: Inventory, at: datetime) -> dict[str, Any]:
    """``{"evaluated_at", "services": [{"service", "signals": [...], "unrecognised": [...],
    "rejected": [...]}], "errors"}``."""
    services = [
        {
            "service": service,
            "signals": [asdict(r) for r in found.recognised if r.service == service],
            "unrecognised": [asdict(u) for u in found.unrecognised if u.service == service],
            "rejected": [
                {"entry": r.entry, "metric": r.metric, "reason": r.reason}
                for r in found.rejected
                if r.service == service
            ],
        }
        for service in found.services()
    ]
    return {
        "evaluated_at": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "services": services,
        "errors": [{"source": e.source, "message": e.message} for e in found.errors],
    }


def _print_table(found: Inventory, at: datetime) -> None:
    stdout.print(f"signals at {at:%Y-%m-%d %H:%M:%SZ}", highlight=False)
    for service in found.services():
        stdout.print(f"\n[bold]{service}[/bold]", highlight=False)
        rows = [r for r in found.recognised if r.service == service]
        if rows:
            table = Table(box=box.SIMPLE, pad_edge=False)
            for column in ("signal", "convention", "metric", "unit", "labels"):
                table.add_column(column, overflow="fold")
            for r in rows:
                labels = ", ".join(f"{k}={v}" for k, v in r.labels.items())
                table.add_row(r.signal, r.convention, r.metric, r.unit, labels)
            stdout.print(table)
        for u in (u for u in found.unrecognised if u.service == service):
            stdout.print(
                f"  not recognised: {u.metric} (looks like a {u.looks_like}): {u.reason}",
                markup=False,
                highlight=False,
            )
        for rejected in (r for r in found.rejected if r.service == service):
            stdout.print(f"  rejected: {rejected.entry}: {rejected.reason}", markup=False, highlight=False)
    for error in found.errors:
        stdout.print(f"[red]error[/red] {error.source}: ", end="")
        stdout.print(error.message, markup=False, highlight=False)
