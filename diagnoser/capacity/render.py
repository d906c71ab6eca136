"""The capacity report for people: a terminal table with a text chart, and Markdown.

Both read the same :class:`CapacityReport` fields as the JSON view and format numbers with the
same helpers, so the three views always carry the same figures: the step table (rate asked,
rate achieved, p50, p90, p99, max, error ratio, held or not, findings new at that step), the
capacity and its limit, the bottleneck with its runbook, and the first failing step's findings.
"""

from __future__ import annotations

from datetime import UTC

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from diagnoser.capacity.report import Bottleneck, CapacityReport, CapacityStep, Limit
from diagnoser.models import Diagnosis
from diagnoser.notify import render_markdown, render_table

__all__ = ["capacity_headline", "render_capacity_markdown", "render_capacity_table", "text_chart"]

_COLUMNS = ("rate", "achieved", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors", "held", "new findings")
_CHART_WIDTH = 40


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ratio(value: float) -> str:
    return f"{value:.2%}"


def step_cells(step: CapacityStep) -> list[str]:
    """One table row, as text; shared by the terminal and Markdown views."""
    verdict = "yes" if step.held else ("no: " + step.failed_on if step.failed_on else "interrupted")
    if not step.counted:
        verdict += " (run again)"
    elif step.stopped_early:
        verdict += " (scouted)" if step.held else " (stopped early)"
    return [
        f"{step.rate:g}",
        f"{step.achieved_rate:.1f}",
        ms(step.latency_ms.p50),
        ms(step.latency_ms.p90),
        step.unsustainable.text if step.unsustainable is not None else ms(step.latency_ms.p99),
        ms(step.latency_ms.max),
        ratio(step.error_ratio),
        verdict,
        ", ".join(step.new_findings) or "-",
    ]


def capacity_headline(report: CapacityReport) -> str:
    """``capacity 460 req/s at p99 <= 50 ms (limit: latency)``: the one line that matters."""
    slo = f"p99 <= {report.slo.p99_ms:g} ms, errors <= {report.slo.error_ratio:.2%}"
    if report.capacity_rps is None:
        first = report.steps[0].rate if report.steps else None
        figure = f"below {first:g} req/s (no step held)" if first is not None else "unknown (no step ran)"
    elif report.limit is Limit.max_rate:
        figure = f"at least {report.capacity_rps:g} req/s"
    else:
        figure = f"{report.capacity_rps:g} req/s"
    return f"capacity {figure} at {slo} (limit: {report.limit.value})"


def text_chart(report: CapacityReport) -> str:
    """p99 against the offered rate, one bar per step in rate order, ``|`` marking the SLO."""
    slo = report.slo.p99_ms
    scale = 2 * slo  # bars end at twice the SLO; longer ones are cut and marked
    slo_at = round(_CHART_WIDTH / 2)
    lines = []
    for step in sorted((s for s in report.steps if s.counted), key=lambda s: s.rate):
        p99 = step.latency_ms.p99
        width = 0 if p99 is None else min(_CHART_WIDTH, round(p99 / scale * _CHART_WIDTH))
        bar = ["#" if i < width else " " for i in range(_CHART_WIDTH)]
        bar[slo_at] = "|" if width <= slo_at else "#"
        tail = ">" if p99 is not None and p99 > scale else " "
        knee = "  <- capacity" if report.capacity_rps == step.rate else ""
        figure = step.unsustainable.text if step.unsustainable is not None else f"p99 {ms(p99)} ms"
        lines.append(f"{step.rate:>8g} req/s {''.join(bar)}{tail} {figure}{knee}")
    if lines:
        lines.insert(0, f"{'':>14}p99 (| = SLO {slo:g} ms)")
    return "\n".join(lines)


def _first_fail_diagnosis(report: CapacityReport) -> Diagnosis | None:
    first = report.first_failing_step
    if first is None or not report.evidence_checked:
        return None
    return Diagnosis(
        evaluated_at=first.ended_at.astimezone(UTC), findings=report.findings, errors=report.errors
    )


def render_capacity_table(report: CapacityReport) -> RenderableType:
    """The terminal view: headline, step table, chart, bottleneck, first failing step's findings."""
    table = Table(title=f"capacity of {report.target}", box=box.SIMPLE_HEAVY, title_justify="left")
    for column in _COLUMNS:
        if column in ("held", "new findings"):
            table.add_column(column, justify="left", overflow="fold", min_width=10)
        else:
            table.add_column(column, justify="right", no_wrap=True, min_width=len(column))
    for step in report.steps:
        style = "green" if step.held else "red"
        table.add_row(*step_cells(step), style=style)
    parts: list[RenderableType] = [
        table,
        Text(text_chart(report)),
        Text(""),
        Text(capacity_headline(report), style="bold"),
    ]
    if report.bottleneck is not None:
        b = report.bottleneck
        text = Text("bottleneck: ", style="bold")
        text.append(f"{_bottleneck_title(b)}\n", style="bold red")
        text.append(f"{b.summary}\nwhat to do: {b.recommendation}")
        if b.runbook_url:
            text.append("\nrunbook: ", style="dim")
            text.append(b.runbook_url, style=f"link {b.runbook_url} underline")
        parts.append(text)
    for note in report.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    diagnosis = _first_fail_diagnosis(report)
    if diagnosis is not None:
        parts += [Text("\nfindings at the first failing step:", style="bold"), render_table(diagnosis)]
    return Group(*parts)


def _bottleneck_title(b: Bottleneck) -> str:
    """``connection_pool_exhaustion (pools/pool-exhaustion), first seen at 180 req/s``."""
    if b.kind == "load_shedding":
        return f"{b.cause} (measured by the probe), first seen at {b.first_seen_at_rate:g} req/s"
    return f"{b.cause} ({b.rule_id}), first seen at {b.first_seen_at_rate:g} req/s"


def render_capacity_markdown(report: CapacityReport) -> str:
    """The same report as a Markdown document (tickets, pull requests, load-test write-ups)."""
    lines = [f"# Capacity of {report.target}", "", f"**{capacity_headline(report)}**", ""]
    lines += ["| " + " | ".join(_COLUMNS) + " |", "|" + "---:|" * 7 + "---|---|"]
    lines += [
        "| " + " | ".join(cell.replace("|", "\\|") for cell in step_cells(s)) + " |" for s in report.steps
    ]
    lines += ["", "```", text_chart(report), "```", ""]
    if report.bottleneck is not None:
        b = report.bottleneck
        source = f"Rule `{b.rule_id}`" if b.rule_id else "Measured by the probe"
        lines += [
            f"## Bottleneck: `{b.cause}`",
            "",
            f"{source}, first seen at {b.first_seen_at_rate:g} req/s.",
            "",
            b.summary,
            "",
            f"**What to do:** {b.recommendation}",
            "",
        ]
        if b.runbook_url:
            lines += [f"[Runbook]({b.runbook_url})", ""]
    lines += [f"> {note}" for note in report.notes]
    diagnosis = _first_fail_diagnosis(report)
    if diagnosis is not None:
        lines += ["", "## Findings at the first failing step", "", render_markdown(diagnosis)]
    return "\n".join(lines).rstrip() + "\n"
