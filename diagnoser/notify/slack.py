"""Slack Block Kit for a finding, its updates and its resolution: pure functions, no I/O.

Each function returns a :class:`SlackMessage`: ``text`` is the notification and fallback line
(all that Slack-compatible receivers without Block Kit, such as Mattermost webhooks, show) and
``blocks`` the layout: a header with severity and cause, the summary with the measured value
against its threshold, the top evidence, the recommendation, a "Runbook" button and a context
line (cluster, namespace, time). ::

    message = render_finding(finding, at=datetime.now(UTC))
    client.chat_postMessage(channel="#oncall", text=message.text, blocks=message.blocks)

Slack's limits are respected here (header 150 characters, section text 3000, 50 blocks), so a
long recommendation or odd label can never make Slack refuse the whole message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from diagnoser.models import Diagnosis, Evidence, Finding

if TYPE_CHECKING:
    from diagnoser.capacity.report import CapacityReport

__all__ = [
    "SlackMessage",
    "render_alert_report",
    "render_capacity_report",
    "render_finding",
    "render_repeat",
    "render_resolved",
    "render_severity_change",
]

_HEADER_MAX = 150
_SECTION_MAX = 3000
_EVIDENCE_SHOWN = 3
_SEVERITY_MARK = {
    "critical": ":red_circle:",
    "warning": ":large_orange_circle:",
    "info": ":large_blue_circle:",
}
_CONTEXT_KEYS = ("cluster", "namespace", "job", "service")


@dataclass(frozen=True)
class SlackMessage:
    """What to post: fallback/notification ``text`` and Block Kit ``blocks``."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def payload(self) -> dict[str, Any]:
        return {"text": self.text, "blocks": self.blocks}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _escape(text: str) -> str:
    # Slack mrkdwn treats &, < and > as control characters (links, mentions).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _number(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:,.4g}" if abs(value) >= 1000 else f"{value:.4g}"


def _timestamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": _clip(text, _HEADER_MAX), "emoji": True}}


def _section(markdown: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _clip(markdown, _SECTION_MAX)}}


def _context(finding: Finding, at: datetime, extra: str | None = None) -> dict[str, Any]:
    parts = [f"{key}: *{_escape(finding.labels[key])}*" for key in _CONTEXT_KEYS if finding.labels.get(key)]
    parts.append(f"rule `{_escape(finding.rule_id)}`")
    parts.append(_timestamp(at))
    if extra:
        parts.append(extra)
    return {
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": _clip(" · ".join(parts), _SECTION_MAX)}],
    }


def _measured(finding: Finding) -> str:
    top = finding.evidence[0] if finding.evidence else None
    if top is None or top.value is None:
        return ""
    if top.threshold is None:
        return f"Measured *{_number(top.value)}*"
    return f"Measured *{_number(top.value)}* against a threshold of *{_number(top.threshold)}*"


def _evidence_line(row: Evidence) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in sorted(row.labels.items()))
    parts = [f"{row.source}: {labels}" if labels else row.source]
    if row.value is not None:
        parts.append(f"= {_number(row.value)}")
    if row.threshold is not None:
        parts.append(f"(threshold {_number(row.threshold)})")
    if row.annotation:
        parts.append(row.annotation)
    return _escape("• " + " ".join(parts))


def _evidence(finding: Finding) -> list[dict[str, Any]]:
    if not finding.evidence:
        return []
    lines = [_evidence_line(row) for row in finding.evidence[:_EVIDENCE_SHOWN]]
    more = len(finding.evidence) - _EVIDENCE_SHOWN
    if more > 0:
        lines.append(f"_and {more} more_")
    return [_section("*Evidence*\n" + "\n".join(lines))]


def _runbook_button(finding: Finding) -> list[dict[str, Any]]:
    if not finding.runbook_url.startswith(("http://", "https://")):
        return []
    return [
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Runbook", "emoji": False},
                    "url": _clip(finding.runbook_url, 3000),
                    "action_id": "runbook",
                }
            ],
        }
    ]


def _title_line(finding: Finding) -> str:
    kind = " (symptom)" if finding.kind == "symptom" else ""
    return f"{finding.severity.value.upper()}: {finding.cause}{kind}"


def render_finding(finding: Finding, *, at: datetime) -> SlackMessage:
    """A new finding: everything needed to act, the runbook one click away."""
    mark = _SEVERITY_MARK.get(finding.severity.value, "")
    blocks: list[dict[str, Any]] = [
        _header(f"{_title_line(finding)}: {finding.title}"),
        _section("\n".join(p for p in (f"{mark} {_escape(finding.summary)}", _measured(finding)) if p)),
        *_evidence(finding),
    ]
    if finding.recommendation:
        blocks.append(_section(f"*What to do*\n{_escape(finding.recommendation)}"))
    blocks += _runbook_button(finding)
    blocks.append(_context(finding, at))
    text = f"{mark} {_title_line(finding)}: {finding.summary}"
    return SlackMessage(_clip(text, _SECTION_MAX), blocks)


def render_repeat(finding: Finding, *, at: datetime, since: datetime | None = None) -> SlackMessage:
    """The finding is still there after the cooldown: a short reminder with today's numbers."""
    still = f"Still {finding.severity.value}" + (f" since {_timestamp(since)}" if since else "")
    lines = [f":repeat: {still}: {_escape(finding.summary)}", _measured(finding)]
    blocks = [_section("\n".join(p for p in lines if p)), _context(finding, at)]
    return SlackMessage(
        _clip(f"Still firing: {_title_line(finding)}: {finding.summary}", _SECTION_MAX), blocks
    )


def render_severity_change(finding: Finding, *, previous: str, at: datetime) -> SlackMessage:
    """The same finding at a new severity: a full message, the header saying what changed."""
    message = render_finding(finding, at=at)
    change = f"{previous} → {finding.severity.value}"
    blocks = [_header(f"Severity {change}: {finding.cause}"), *message.blocks[1:]]
    return SlackMessage(_clip(f"Severity {change}: {message.text}", _SECTION_MAX), blocks)


def render_resolved(finding: Finding, *, at: datetime) -> SlackMessage:
    """The finding is gone: say so, with what it was, so the thread reads as a whole story."""
    line = f":white_check_mark: *Resolved*: {_escape(finding.cause)}: {_escape(finding.title)}"
    blocks = [
        _section(f"{line}\n_was:_ {_escape(finding.summary)}"),
        _context(finding, at),
    ]
    return SlackMessage(_clip(f"Resolved: {finding.cause}: {finding.title}", _SECTION_MAX), blocks)


def render_alert_report(
    diagnosis: Diagnosis, *, alert: str, scope: dict[str, str], max_findings: int = 5
) -> SlackMessage:
    """The answer to an Alertmanager alert: the findings within its labels, most important first."""
    where = ", ".join(f"{k}={v}" for k, v in sorted(scope.items())) or "the whole cluster"
    blocks: list[dict[str, Any]] = [_header(f"Diagnosis for {alert}"), _section(f"Scope: {_escape(where)}")]
    if not diagnosis.findings:
        blocks.append(_section("No cause found within this scope."))
    for finding in diagnosis.findings[:max_findings]:
        mark = _SEVERITY_MARK.get(finding.severity.value, "")
        line = f"{mark} *{_escape(_title_line(finding))}*: {_escape(finding.summary)}"
        if finding.recommendation:
            line += f"\n_What to do:_ {_escape(finding.recommendation)}"
        if finding.runbook_url.startswith(("http://", "https://")):
            line += f"\n<{finding.runbook_url}|Runbook>"
        blocks.append(_section(line))
    more = len(diagnosis.findings) - max_findings
    if more > 0:
        blocks.append(_section(f"_and {more} more findings_"))
    if diagnosis.errors:
        failed = ", ".join(sorted({e.source for e in diagnosis.errors}))
        blocks.append(_section(f":warning: Sources that could not answer: {_escape(failed)}"))
    blocks.append(
        {"type": "context", "elements": [{"type": "mrkdwn", "text": _timestamp(diagnosis.evaluated_at)}]}
    )
    top = diagnosis.findings[0] if diagnosis.findings else None
    text = f"Diagnosis for {alert}: " + (f"{_title_line(top)}: {top.summary}" if top else "no cause found")
    return SlackMessage(_clip(text, _SECTION_MAX), blocks[:50])


def _button(url: str, text: str = "Runbook") -> dict[str, Any]:
    return {
        "type": "actions",
        "elements": [
            {
                "type": "button",
                "text": {"type": "plain_text", "text": text, "emoji": False},
                "url": _clip(url, 3000),
                "action_id": "runbook",
            }
        ],
    }


def render_capacity_report(report: CapacityReport, *, at: datetime | None = None) -> SlackMessage:
    """One message for a ``diagnose capacity`` run: the step table, the knee, the bottleneck, its runbook.

    The table is monospaced text in a section (Block Kit has no table that every client shows);
    rows that would pass Slack's section limit are dropped from the middle, never the knee.
    """
    from diagnoser.capacity.render import capacity_headline, step_cells

    headline = capacity_headline(report)
    header = ("rate", "achieved", "p50", "p99", "errors", "held")
    rows = [header, *(tuple(cells[i] for i in (0, 1, 2, 4, 6, 7)) for cells in map(step_cells, report.steps))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    while len("\n".join(lines)) > _SECTION_MAX - 20 and len(lines) > 3:
        lines.pop(len(lines) // 2)
    blocks: list[dict[str, Any]] = [
        _header(f"Capacity of {report.target}"),
        _section(f"*{_escape(headline)}*"),
        _section("```" + "\n".join(lines) + "```"),
    ]
    bottleneck = report.bottleneck
    if bottleneck is not None:
        line = (
            f":red_circle: *Bottleneck: {_escape(bottleneck.cause)}* (first seen at "
            f"{_number(bottleneck.first_seen_at_rate)} req/s)\n{_escape(bottleneck.summary)}"
        )
        if bottleneck.recommendation:
            line += f"\n_What to do:_ {_escape(bottleneck.recommendation)}"
        blocks.append(_section(line))
        if bottleneck.runbook_url.startswith(("http://", "https://")):
            blocks.append(_button(bottleneck.runbook_url))
    for note in report.notes:
        blocks.append(_section(f":information_source: {_escape(note)}"))
    when = at or (report.steps[-1].ended_at if report.steps else datetime.now(UTC))
    slo = f"SLO p99 {_number(report.slo.p99_ms)} ms, errors {report.slo.error_ratio:.2%}"
    context = f"{slo} · {_timestamp(when)}"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    text = headline + (f"; bottleneck {bottleneck.cause}" if bottleneck else "")
    return SlackMessage(_clip(text, _SECTION_MAX), blocks[:50])
