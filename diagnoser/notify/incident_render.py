"""Slack Block Kit for incidents: the one message (cause first, symptoms as lines), its replies, digests.

Pure functions of the typed payloads (:mod:`diagnoser.notify.payloads`). The incident's message
is posted once and edited in place after: its header names the cause
(``CRITICAL: connection_pool_exhaustion: Pool orders-db saturated``), or the symptom while none
is known (``CRITICAL: p99 over SLO on checkout: no cause found yet``); the symptoms it explains
are lines under it; the context line says when it opened and how long it must stay clear before
it is resolved. ::

    message = render_incident(view, at=datetime.now(UTC))
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from diagnoser.models import Finding
from diagnoser.notify.payloads import DigestPayload, IncidentPayload, IncidentView
from diagnoser.notify.slack import (
    SECTION_MAX,
    SlackMessage,
    button_block,
    clip,
    escape,
    evidence_lines,
    header_block,
    section_block,
    severity_mark,
    timestamp,
)
from diagnoser.numbers import format_number

__all__ = [
    "capacity_line",
    "duration_text",
    "incident_header",
    "link",
    "render_digest",
    "render_incident",
    "render_incident_reply",
]

_EXPLAINED_SHOWN = 8
_DIGEST_ROWS = 40
_CONTEXT_KEYS = ("cluster", "namespace", "service", "job")


def duration_text(seconds: float) -> str:
    """``45 s``, ``3 min``, ``1.5 h``."""
    if seconds >= 3600:
        return f"{format_number(seconds / 3600)} h"
    if seconds >= 60:
        return f"{format_number(seconds / 60)} min"
    return f"{format_number(seconds)} s"


def _where(finding: Finding) -> str:
    return finding.service or finding.labels.get("namespace", "")


def incident_header(view: IncidentView) -> str:
    """The header line: the cause first, or the symptom and "no cause found yet"."""
    lead = view.lead
    if view.state == "resolved":
        prefix = "RESOLVED"
    elif view.state == "merged":
        prefix = "MERGED"
    else:
        prefix = view.severity.value.upper()
    if view.has_cause:
        return f"{prefix}: {lead.cause}: {lead.title}"
    where = _where(lead)
    on = f" on {where}" if where and where not in lead.title else ""
    if view.earlier_cause is not None:  # the cause's rule no longer holds: never named as current
        return f"{prefix}: {lead.title}{on}: {view.earlier_cause.cause} not seen now"
    return f"{prefix}: {lead.title}{on}: no cause found yet"


def _earlier_cause_line(view: IncidentView) -> list[str]:
    """What the message says of a cause whose rule no longer holds while symptoms last."""
    earlier = view.earlier_cause
    if earlier is None:
        return []
    line = f"_{escape(earlier.cause)} ({escape(earlier.title)}) is not seen now: its rule no longer holds"
    if view.state == "open" and view.cause_cleared_at is not None:
        line += f"; this incident resolves once it stays clear for {duration_text(view.resolve_after_s)}"
    return [line + "._", *_earlier_now_lines(view)]


def _earlier_now_lines(view: IncidentView) -> list[str]:
    """What the earlier cause's own evidence reads now (never its old numbers)."""
    earlier = view.earlier_cause
    if earlier is None or not view.earlier_now:
        return []
    lines = [f"_{escape(earlier.cause)} now:_"]
    said = ""
    for row in view.earlier_now:
        line = row.line(earlier.labels, said, source=False)
        said += "\n" + line  # each detail and caveat once
        lines.append(escape("• " + line))
    return lines


def capacity_line(view: IncidentView) -> str | None:
    """The load now against the capacity on record of its service (plain text), while it is open:
    ``checkout at 410 req/s now; capacity 520 req/s at p99 <= 300 ms, measured ...; headroom 21 %``."""
    reading = view.capacity
    if reading is None or view.state != "open":
        return None
    return f"{reading.service} {reading.text()}"


def _explained(view: IncidentView) -> list[dict[str, Any]]:
    if not view.explained:
        return []
    lines = []
    for finding in view.explained[:_EXPLAINED_SHOWN]:
        kind = "symptom" if finding.kind == "symptom" else "also"
        mark = severity_mark(finding.severity.value)
        line = f"{mark} _{kind}_ *{escape(finding.cause)}*: {escape(finding.summary)}"
        shown = evidence_lines(finding, limit=1)
        lines.append(line + ("\n      " + shown[0] if shown else ""))
    more = len(view.explained) - _EXPLAINED_SHOWN
    if more > 0:
        lines.append(f"_and {more} more_")
    title = "*What it explains*" if view.has_cause else "*Also seen*"
    return [section_block(title + "\n" + "\n".join(lines))]


def _context(view: IncidentView, at: datetime) -> dict[str, Any]:
    lead = view.lead
    parts = [f"{key}: *{escape(lead.labels[key])}*" for key in _CONTEXT_KEYS if lead.labels.get(key)]
    parts.append(f"rule `{escape(lead.rule_id)}`")
    parts.append("opened " + timestamp(datetime.fromtimestamp(view.opened_at, UTC)))
    if view.state == "resolved" and view.resolved_at is not None:
        parts.append(
            f"resolved {timestamp(datetime.fromtimestamp(view.resolved_at, UTC))}"
            f" after {duration_text(view.resolve_after_s)} clear"
        )
    elif view.state == "open":
        parts.append(f"resolves once clear for {duration_text(view.resolve_after_s)}")
    if view.reopened:
        parts.append(f"reopened {view.reopened}×")
    if at.timestamp() != view.opened_at:
        parts.append("updated " + timestamp(at))
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(" · ".join(parts), SECTION_MAX)}]}


def link(url: str, text: str) -> str:
    """Slack's mrkdwn link, ``<url|text>`` (the text escaped; ``|`` and ``>`` cannot be in the URL)."""
    return f"<{url.replace('|', '%7C').replace('>', '%3E')}|{escape(text)}>"


def render_incident(view: IncidentView, *, at: datetime, joined_url: str | None = None) -> SlackMessage:
    """The incident's message, as posted first and as edited after each material change
    (``joined_url``: merged, the message of the incident its findings joined)."""
    lead = view.lead
    mark = ":white_check_mark:" if view.state == "resolved" else severity_mark(view.severity.value)
    header = incident_header(view)
    summary = [f"{mark} {escape(lead.summary)}", *evidence_lines(lead), *_earlier_cause_line(view)]
    load = capacity_line(view)
    over = load is not None and view.capacity is not None and view.capacity.over
    if over:  # over its capacity, the load is the first thing the on-call engineer reads
        summary.insert(0, f"*{escape(load or '')}*")
    elif load is not None:
        summary.append(escape(load))
    if view.state == "merged" and joined_url:
        summary.append("_Followed in " + link(joined_url, "the incident it joined") + "._")
    if not view.has_cause and view.earlier_cause is None and view.state == "open":
        summary.append("_No cause found yet: this message is edited when a rule names one._")
    blocks: list[dict[str, Any]] = [
        header_block(header),
        section_block("\n".join(summary)),
        *_explained(view),
    ]
    if lead.recommendation and view.has_cause:
        blocks.append(section_block(f"*What to do*\n{escape(lead.recommendation)}"))
    if lead.runbook_url.startswith(("http://", "https://")):
        blocks.append(button_block(lead.runbook_url))
    blocks.append(_context(view, at))
    text = f"{mark} {header}: {load}; {lead.summary}" if over else f"{mark} {header}: {lead.summary}"
    return SlackMessage(clip(text, SECTION_MAX), blocks[:50])


def render_incident_reply(kind: str, payload: IncidentPayload, *, at: datetime) -> SlackMessage:
    """A reply in the incident's thread: what changed (resolved, reopened, severity, cause, reminder)."""
    view, lead = payload.view, payload.view.lead
    note = payload.note or kind
    if kind == "verified" and payload.confirmation is not None:
        return _confirmation_reply(payload, at=at)
    if kind == "resolved":
        line = f":white_check_mark: *Resolved*: {escape(lead.cause)}: {escape(lead.title)}"
        body = f"{line}\n_was:_ {escape(lead.summary)}\n_clear for {duration_text(view.resolve_after_s)}_"
        if payload.note and payload.note != "Resolved":
            body += f"\n{escape(payload.note.removeprefix('Resolved: '))}"
        text = f"Resolved: {lead.cause}: {lead.title}"
    else:
        said = link(payload.joined_url, note) if payload.joined_url else escape(note)
        body = f"{severity_mark(view.severity.value)} *{said}*\n{escape(lead.summary)}"
        if kind == "reopened" and view.earlier_now:  # what the cause reads now, not what it read
            body += "\n" + "\n".join(_earlier_now_lines(view))
        text = f"{note}: {incident_header(view)}"
    context = {"type": "context", "elements": [{"type": "mrkdwn", "text": timestamp(at)}]}
    return SlackMessage(clip(text, SECTION_MAX), [section_block(body), context])


def _confirmation_reply(payload: IncidentPayload, *, at: datetime) -> SlackMessage:
    """The confirm probe's verdict in the thread: the line, then what was sent and judged."""
    found = payload.confirmation
    assert found is not None
    line = payload.note or found.text()
    mark = ":white_check_mark:" if found.confirmed else ":warning:"
    errors = format_number(found.error_ratio * 100)
    detail = (
        f"_confirm probe of {found.target}: {found.sent} requests over {format_number(found.duration_s)} s,"
        f" errors {errors} %; SLO p99 {format_number(found.slo_p99_ms)} ms,"
        f" errors {format_number(found.slo_error_ratio * 100)} %_"
    )
    body = f"{mark} *{escape(line)}*\n{escape(detail)}"
    context = {"type": "context", "elements": [{"type": "mrkdwn", "text": timestamp(at)}]}
    text = f"{line}: {incident_header(payload.view)}"
    return SlackMessage(clip(text, SECTION_MAX), [section_block(body), context])


def render_digest(payload: DigestPayload, *, at: datetime) -> SlackMessage:
    """Many incidents at once: one table, a row each (service, cause, headline number, runbook)."""
    count = len(payload.rows)
    lines = []
    for row in payload.rows[:_DIGEST_ROWS]:
        runbook = (
            f" · <{row.runbook_url}|runbook>" if row.runbook_url.startswith(("http://", "https://")) else ""
        )
        lines.append(
            f"{severity_mark(row.severity.value)} *{escape(row.service)}* · `{escape(row.cause)}` ·"
            f" {escape(row.headline)}{runbook}"
        )
    if count > _DIGEST_ROWS:
        lines.append(f"_and {count - _DIGEST_ROWS} more_")
    blocks: list[dict[str, Any]] = [header_block(f"{count} incidents opened at once")]
    # 3000 characters per section: the rows are split over as many sections as they need.
    chunk: list[str] = []
    for line in lines:
        if sum(len(x) + 1 for x in chunk) + len(line) > SECTION_MAX - 10:
            blocks.append(section_block("\n".join(chunk)))
            chunk = []
        chunk.append(line)
    if chunk:
        blocks.append(section_block("\n".join(chunk)))
    blocks.append(
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": f"details in the thread · {timestamp(at)}"}],
        }
    )
    services = sorted({row.service for row in payload.rows})
    text = f"{count} incidents opened at once: " + ", ".join(services)
    return SlackMessage(clip(text, SECTION_MAX), blocks[:50])
