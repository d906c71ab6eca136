"""The Slack message for a ``diagnose capacity`` run, built from the same blocks as every other.

The table is monospaced text in a section (Block Kit has no table that every client shows);
rows that would pass Slack's section limit are dropped from the middle, never the knee.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from diagnoser.capacity.render import capacity_headline, step_cells
from diagnoser.capacity.report import CapacityReport
from diagnoser.notify.slack import (
    SECTION_MAX,
    SlackMessage,
    button_block,
    clip,
    escape,
    header_block,
    number,
    section_block,
    timestamp,
)

__all__ = ["render_capacity_report"]


def render_capacity_report(report: CapacityReport, *, at: datetime | None = None) -> SlackMessage:
    """One message for a ``diagnose capacity`` run: the step table, the knee, the bottleneck, its runbook.

    The table is monospaced text in a section (Block Kit has no table that every client shows);
    rows that would pass Slack's section limit are dropped from the middle, never the knee.
    """
    headline = capacity_headline(report)
    header = ("rate", "achieved", "p50", "p99", "errors", "held")
    rows = [header, *(tuple(cells[i] for i in (0, 1, 2, 4, 6, 7)) for cells in map(step_cells, report.steps))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    while len("\n".join(lines)) > SECTION_MAX - 20 and len(lines) > 3:
        lines.pop(len(lines) // 2)
    blocks: list[dict[str, Any]] = [
        header_block(f"Capacity of {report.target}"),
        section_block(f"*{escape(headline)}*"),
        section_block("```" + "\n".join(lines) + "```"),
    ]
    bottleneck = report.bottleneck
    if bottleneck is not None:
        line = (
            f":red_circle: *Bottleneck: {escape(bottleneck.cause)}* (first seen at "
            f"{number(bottleneck.first_seen_at_rate)} req/s)\n{escape(bottleneck.summary)}"
        )
        if bottleneck.recommendation:
            line += f"\n_What to do:_ {escape(bottleneck.recommendation)}"
        blocks.append(section_block(line))
        if bottleneck.runbook_url and bottleneck.runbook_url.startswith(("http://", "https://")):
            blocks.append(button_block(bottleneck.runbook_url))
    for note in report.notes:
        blocks.append(section_block(f":information_source: {escape(note)}"))
    when = at or (report.steps[-1].ended_at if report.steps else datetime.now(UTC))
    slo = f"SLO p99 {number(report.slo.p99_ms)} ms, errors {report.slo.error_ratio:.2%}"
    context = f"{slo} · {timestamp(when)}"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    text = headline + (f"; bottleneck {bottleneck.cause}" if bottleneck else "")
    return SlackMessage(clip(text, SECTION_MAX), blocks[:50])
