"""``diagnose signals``: what the rules will find on a Prometheus, per service, and what they will not.

    diagnose signals --prometheus-url http://prometheus:9090
    diagnose signals --prometheus-url URL --at 2026-11-29T20:00:00Z --format json

Per service: each signal (``pool.used``, ``http.server.duration``...) and resource with a limit,
the convention that answers it or ``inferred (...)`` saying from what, the metric, the unit it is
read in and the labels; then what looks like a duration, a pool or a limit but was not
recognised, and why. A terminal wide enough for every column on one line gets a table per
service; a narrower one (80 columns) one block per signal, its fields one per line. Exit 0, or 2
for a usage error; a Prometheus that cannot be read is printed as an error and exits 1.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import typer
from rich import box
from rich.table import Table

from diagnoser.cli.app import (
    AtOption,
    ConfigOption,
    PrometheusOption,
    TableOrJson,
    TableOrJsonOption,
    app,
    fail,
    load_cli_settings,
    run_loop,
    stdout,
    write_out,
)
from diagnoser.cli.timeparse import parse_instant
from diagnoser.promql import duration_seconds
from diagnoser.signals import load_catalogue
from diagnoser.signals.inventory import Inventory, Recognised, inventory
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["signals"]

@app.command("signals")
def signals(
    config: ConfigOption = None,
    prometheus_url: PrometheusOption = None,
    at: AtOption = None,
    output: TableOrJsonOption = TableOrJson.table,
) -> None:
    """What was recognised on a Prometheus, per service, and what looks like a signal but was not."""
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
    if output is TableOrJson.json:
        write_out(json.dumps(as_json(found, instant), indent=2) + "\n")
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


_COLUMNS = ("signal", "convention", "metric", "kind", "unit", "labels")
_KEY_WIDTH = 12


def _cells(row: Recognised) -> tuple[str, str, str, str, str, str]:
    labels = ", ".join(f"{k}={v}" for k, v in row.labels.items())
    kind = f"{row.histogram} histogram" if row.histogram else ""
    return row.signal, row.convention, row.metric, kind, row.unit, labels


def _fits(rows: list[Recognised], width: int) -> bool:
    """Whether a table of ``rows`` fits ``width`` with every cell on one line."""
    widest = [max([len(name), *(len(_cells(r)[i]) for r in rows)]) for i, name in enumerate(_COLUMNS)]
    return sum(widest) + 2 * (len(_COLUMNS) - 1) <= width


def _table(rows: list[Recognised]) -> Table:
    table = Table(box=box.SIMPLE, pad_edge=False)
    for column in _COLUMNS:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*_cells(row))
    return table


def _blocks(rows: list[Recognised], width: int) -> str:
    """One block per signal: its name, then each field on a line of its own, long values folded under."""
    indent = " " * (2 + _KEY_WIDTH)
    blocks = []
    for row in rows:
        signal, convention, metric, kind, unit, labels = _cells(row)
        lines = [signal]
        for name, value in (("convention", convention), ("metric", metric), ("kind", kind), ("unit", unit),
                            ("labels", labels), ("caveat", row.caveat or "")):  # fmt: skip
            if value:
                lead = f"  {name:<{_KEY_WIDTH}}"
                lines += textwrap.wrap(value, max(20, width), initial_indent=lead, subsequent_indent=indent,
                                       break_on_hyphens=False)  # fmt: skip
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _print_table(found: Inventory, at: datetime) -> None:
    stdout.print(f"signals at {at:%Y-%m-%d %H:%M:%SZ}", highlight=False)
    for service in found.services():
        stdout.print(f"\n[bold]{service}[/bold]", highlight=False)
        rows = [r for r in found.recognised if r.service == service]
        if rows:
            if _fits(rows, stdout.width):
                stdout.print(_table(rows))
            else:
                stdout.print(_blocks(rows, stdout.width), markup=False, highlight=False, soft_wrap=True)
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
