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
from typing import Any

from diagnoser.models import Diagnosis, Finding
from diagnoser.numbers import format_number

__all__ = [
    "SECTION_MAX",
    "SlackMessage",
    "button_block",
    "clip",
    "escape",
    "evidence_lines",
    "header_block",
    "number",
    "render_alert_report",
    "render_finding",
    "render_repeat",
    "render_resolved",
    "render_severity_change",
    "section_block",
    "severity_mark",
    "timestamp",
]

_HEADER_MAX = 150
SECTION_MAX = 3000
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


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape(text: str) -> str:
    # Slack mrkdwn treats &, < and > as control characters (links, mentions).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def number(value: float | None) -> str:
    """A value as a person reads it (:func:`~diagnoser.numbers.format_number`); ``n/a`` for none."""
    return "n/a" if value is None else format_number(value, 4)


def timestamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def header_block(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": clip(text, _HEADER_MAX), "emoji": True}}


def section_block(markdown: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(markdown, SECTION_MAX)}}


def _context(finding: Finding, at: datetime, extra: str | None = None) -> dict[str, Any]:
    parts = [f"{key}: *{escape(finding.labels[key])}*" for key in _CONTEXT_KEYS if finding.labels.get(key)]
    parts.append(f"rule `{escape(finding.rule_id)}`")
    parts.append(timestamp(at))
    if extra:
        parts.append(extra)
    return {
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": clip(" · ".join(parts), SECTION_MAX)}],
    }


def _measured(finding: Finding) -> str:
    top = finding.evidence[0] if finding.evidence else None
    if top is None or top.value is None:
        return ""
    return f"Measured: *{escape(top.line(finding.labels, finding.summary))}*"


def severity_mark(severity: str) -> str:
    """The emoji Slack shows for a severity."""
    return _SEVERITY_MARK.get(severity, "")


def evidence_lines(finding: Finding, *, limit: int = _EVIDENCE_SHOWN) -> list[str]:
    """The finding's evidence as readable bullet lines (names, units; its own labels not repeated)."""
    lines: list[str] = []
    said = finding.summary
    for row in finding.evidence[:limit]:
        line = row.line(finding.labels, said)
        said += "\n" + line  # each detail and caveat once per finding
        lines.append(escape("• " + line))
    more = len(finding.evidence) - limit
    if more > 0 and limit > 1:
        lines.append(f"_and {more} more_")
    return lines


def _evidence(finding: Finding) -> list[dict[str, Any]]:
    if not finding.evidence:
        return []
    return [section_block("*Evidence*\n" + "\n".join(evidence_lines(finding)))]


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
                    "url": clip(finding.runbook_url, 3000),
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
        header_block(f"{_title_line(finding)}: {finding.title}"),
        section_block("\n".join(p for p in (f"{mark} {escape(finding.summary)}", _measured(finding)) if p)),
        *_evidence(finding),
    ]
    if finding.recommendation:
        blocks.append(section_block(f"*What to do*\n{escape(finding.recommendation)}"))
    blocks += _runbook_button(finding)
    blocks.append(_context(finding, at))
    text = f"{mark} {_title_line(finding)}: {finding.summary}"
    return SlackMessage(clip(text, SECTION_MAX), blocks)


def render_repeat(finding: Finding, *, at: datetime, since: datetime | None = None) -> SlackMessage:
    """The finding is still there after the cooldown: a short reminder with today's numbers."""
    still = f"Still {finding.severity.value}" + (f" since {timestamp(since)}" if since else "")
    lines = [f":repeat: {still}: {escape(finding.summary)}", _measured(finding)]
    blocks = [section_block("\n".join(p for p in lines if p)), _context(finding, at)]
    return SlackMessage(clip(f"Still firing: {_title_line(finding)}: {finding.summary}", SECTION_MAX), blocks)


def render_severity_change(finding: Finding, *, previous: str, at: datetime) -> SlackMessage:
    """The same finding at a new severity: a full message, the header saying what changed."""
    message = render_finding(finding, at=at)
    change = f"{previous} → {finding.severity.value}"
    blocks = [header_block(f"Severity {change}: {finding.cause}"), *message.blocks[1:]]
    return SlackMessage(clip(f"Severity {change}: {message.text}", SECTION_MAX), blocks)


def render_resolved(finding: Finding, *, at: datetime) -> SlackMessage:
    """The finding is gone: say so, with what it was, so the thread reads as a whole story."""
    line = f":white_check_mark: *Resolved*: {escape(finding.cause)}: {escape(finding.title)}"
    blocks = [
        section_block(f"{line}\n_was:_ {escape(finding.summary)}"),
        _context(finding, at),
    ]
    return SlackMessage(clip(f"Resolved: {finding.cause}: {finding.title}", SECTION_MAX), blocks)


def render_alert_report(
    diagnosis: Diagnosis, *, alert: str, scope: dict[str, str], max_findings: int = 5
) -> SlackMessage:
    """The answer to an Alertmanager alert: the findings within its labels, most important first."""
    where = ", ".join(f"{k}={v}" for k, v in sorted(scope.items())) or "the whole cluster"
    blocks: list[dict[str, Any]] = [
        header_block(f"Diagnosis for {alert}"),
        section_block(f"Scope: {escape(where)}"),
    ]
    if not diagnosis.findings:
        blocks.append(section_block("No cause found within this scope."))
    for finding in diagnosis.findings[:max_findings]:
        mark = _SEVERITY_MARK.get(finding.severity.value, "")
        line = f"{mark} *{escape(_title_line(finding))}*: {escape(finding.summary)}"
        if finding.recommendation:
            line += f"\n_What to do:_ {escape(finding.recommendation)}"
        if finding.runbook_url.startswith(("http://", "https://")):
            line += f"\n<{finding.runbook_url}|Runbook>"
        blocks.append(section_block(line))
    more = len(diagnosis.findings) - max_findings
    if more > 0:
        blocks.append(section_block(f"_and {more} more findings_"))
    if diagnosis.errors:
        failed = ", ".join(sorted({e.source for e in diagnosis.errors}))
        blocks.append(section_block(f":warning: Sources that could not answer: {escape(failed)}"))
    blocks.append(
        {"type": "context", "elements": [{"type": "mrkdwn", "text": timestamp(diagnosis.evaluated_at)}]}
    )
    top = diagnosis.findings[0] if diagnosis.findings else None
    text = f"Diagnosis for {alert}: " + (f"{_title_line(top)}: {top.summary}" if top else "no cause found")
    return SlackMessage(clip(text, SECTION_MAX), blocks[:50])


def button_block(url: str, text: str = "Runbook") -> dict[str, Any]:
    return {
        "type": "actions",
        "elements": [
            {
                "type": "button",
                "text": {"type": "plain_text", "text": text, "emoji": False},
                "url": clip(url, 3000),
                "action_id": "runbook",
            }
        ],
    }
