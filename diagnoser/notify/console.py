"""The terminal view: what a tired engineer reads first at 3 a.m.

One row per finding, most important first: severity, cause, a one-line summary carrying the
measured value and threshold, what to do, and the runbook link. Source errors follow, so an
incomplete diagnosis never looks like a clean one, and one coverage line says what was evaluated,
what had no data and what was skipped.
"""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from diagnoser.models import Diagnosis, Finding, Severity

__all__ = ["render_table"]

_STYLE = {Severity.critical: "bold red", Severity.warning: "yellow", Severity.info: "cyan"}


def render_table(diagnosis: Diagnosis, *, verbose: bool = False) -> RenderableType:
    """A rich renderable of ``diagnosis``; ``verbose`` adds every evidence row."""
    parts: list[RenderableType] = []
    when = diagnosis.evaluated_at.strftime("%Y-%m-%d %H:%M:%SZ")
    if not diagnosis.findings:
        parts.append(Text(f"No findings at {when}.", style="green"))
    else:
        table = Table(
            title=f"diagnosis at {when}",
            box=box.SIMPLE_HEAVY,
            show_lines=True,
            expand=True,
            title_justify="left",
        )
        table.add_column("#", justify="right", no_wrap=True)
        table.add_column("severity", no_wrap=True)
        table.add_column("cause", no_wrap=True)
        table.add_column("what was measured", ratio=3, overflow="fold")
        table.add_column("what to do", ratio=3, overflow="fold")
        for index, finding in enumerate(diagnosis.findings, 1):
            table.add_row(
                str(index),
                Text(finding.severity.value, style=_STYLE[finding.severity]),
                Text(finding.cause + (" (symptom)" if finding.kind == "symptom" else ""), style="bold"),
                _measured(finding, verbose),
                _todo(finding),
            )
        parts.append(table)
    if diagnosis.errors:
        errors = Table(title="sources that could not answer", box=box.SIMPLE, title_justify="left")
        errors.add_column("source", no_wrap=True)
        errors.add_column("error")
        for error in diagnosis.errors:
            errors.add_row(Text(error.source, style="red"), error.message)
        parts.append(errors)
    if diagnosis.coverage is not None:
        # "No findings" is only worth as much as what was looked at: always say what that was.
        parts.append(Text(f"coverage: {diagnosis.coverage.summary}", style="dim"))
    return Group(*parts)


def _measured(finding: Finding, verbose: bool) -> Text:
    text = Text(finding.summary)
    rows = finding.evidence if verbose else finding.evidence[:1]
    for row in rows:
        measured = ""
        if row.value is not None:
            measured = f"{row.value:.4g}"
            if row.threshold is not None:
                measured += f" vs {row.threshold:.4g}"
        where = ", ".join(f"{k}={v}" for k, v in sorted(row.labels.items()))
        line = " ".join(part for part in (f"[{row.source}]", where, measured, row.detail or "") if part)
        text.append("\n" + line, style="dim")
    return text


def _todo(finding: Finding) -> Text:
    text = Text(finding.recommendation)
    if finding.runbook_url:
        text.append("\nrunbook: ", style="dim")
        text.append(finding.runbook_url, style=f"link {finding.runbook_url} underline")
    return text
