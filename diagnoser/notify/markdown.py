"""Markdown for tickets, post-incident reviews and chat tools that render it."""

from __future__ import annotations

from diagnoser.models import Diagnosis, Finding, evidence_unit, format_measure
from diagnoser.redact import scrub_text

__all__ = ["render_markdown"]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    """Inline code in a table cell: pipes escaped, backticks fenced by longer runs."""
    flat = _cell(text)
    fence = "``" if "`" in flat else "`"
    return f"{fence}{flat}{fence}"


def render_markdown(diagnosis: Diagnosis) -> str:
    """The diagnosis as a Markdown document: findings in rank order, evidence, source errors."""
    when = diagnosis.evaluated_at.strftime("%Y-%m-%d %H:%M:%SZ")
    lines = [f"# Diagnosis at {when}", ""]
    if not diagnosis.findings:
        lines += ["No findings.", ""]
    for index, finding in enumerate(diagnosis.findings, 1):
        lines += _finding(index, finding)
    if diagnosis.errors:
        lines += ["## Sources that could not answer", "", "| source | error |", "|---|---|"]
        lines += [f"| {_cell(e.source)} | {_cell(e.message)} |" for e in diagnosis.errors]
        lines.append("")
    if diagnosis.coverage is not None:
        lines += [f"Coverage: {_cell(diagnosis.coverage.summary)}", ""]
    return scrub_text("\n".join(lines))


def _finding(index: int, finding: Finding) -> list[str]:
    kind = " (symptom)" if finding.kind == "symptom" else ""
    lines = [
        f"## {index}. {finding.severity.value.upper()}: `{finding.cause}`{kind}: {_cell(finding.title)}",
        "",
        _cell(finding.summary),
        "",
    ]
    if finding.recommendation:
        lines += [f"**What to do:** {_cell(finding.recommendation)}", ""]
    if finding.runbook_url:
        lines += [f"Runbook: [{finding.rule_id}]({finding.runbook_url})", ""]
    if finding.evidence:
        lines += [
            "| evidence | value | threshold | labels | source and query | detail |",
            "|---|---|---|---|---|---|",
        ]
        caveats: set[str] = set()
        for row in finding.evidence:
            # Each caveat once per finding: a row repeating an earlier row's leaves it out.
            annotation = (
                row.annotation
                if row.caveat not in caveats
                else row.model_copy(update={"caveat": None}).annotation
            )
            caveats.add(row.caveat or "")
            labels = ", ".join(f"{k}={v}" for k, v in sorted(row.labels.items()))
            unit = evidence_unit(row)
            value = "" if row.value is None else format_measure(row.value, unit)
            threshold = "" if row.threshold is None else format_measure(row.threshold, unit)
            query = f"{row.source}: {_code(row.query)}" if row.query else row.source
            lines.append(
                f"| {_cell(row.name or 'value')} | {value} | {threshold} | {_cell(labels)} | {query} "
                f"| {_cell(annotation)} |"
            )
        lines.append("")
    return lines
