"""The terminal view: what a tired engineer reads first at 3 a.m.

One block per finding, most important first: number, severity and cause on the first line, then
the summary (the measured value and threshold), the evidence as readable lines (``waiting: 30
requests waiting for a connection (threshold 0)``, units formatted), what to do, and the runbook.
Blocks wrap to the terminal's width (80 columns included) with a hanging
indent, and a URL is never folded: on a terminal the runbook is a short OSC-8 hyperlink; elsewhere
it has a line of its own, and one too long for the width is given as the rule id with the
runbook base printed once below. Source errors follow, then one coverage line, so an incomplete
diagnosis never looks like a clean one.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from diagnoser.models import Diagnosis, Evidence, Finding, Severity

__all__ = ["render_table"]

_STYLE = {Severity.critical: "bold red", Severity.warning: "yellow", Severity.info: "cyan"}
#: Characters of an evidence detail shown without ``-v``.
_DETAIL_CHARS = 160
#: Width assumed when none is given (the classic terminal).
_DEFAULT_WIDTH = 80
_INDENT = 4
#: Width of the block's label column ("evidence", "do").
_LABEL_WIDTH = len("evidence")


def render_table(
    diagnosis: Diagnosis, *, verbose: bool = False, width: int | None = None, links: bool = False
) -> RenderableType:
    """A rich renderable of ``diagnosis`` for ``width`` columns.

    ``verbose`` adds every evidence row with its labels and full details; ``links`` renders
    runbooks as OSC-8 hyperlinks (for terminals that show them).
    """
    width = width or _DEFAULT_WIDTH
    parts: list[RenderableType] = []
    when = diagnosis.evaluated_at.strftime("%Y-%m-%d %H:%M:%SZ")
    long_links: list[str] = []
    if not diagnosis.findings:
        parts.append(Text(f"No findings at {when}.", style="green"))
    else:
        parts.append(Text(f"diagnosis at {when}", style="bold"))
        for index, finding in enumerate(diagnosis.findings, 1):
            parts.append(Text(""))
            parts.append(_block(index, finding, verbose, width, links, long_links))
    for base in dict.fromkeys(_split_runbook(url)[0] for url in long_links):
        parts.append(Text(""))
        parts.append(Text(f"runbooks: {base}<runbook>", style="dim", no_wrap=True, overflow="ignore"))
    if diagnosis.errors:
        parts.append(Text(""))
        parts.append(Text("sources that could not answer", style="bold"))
        errors = Table.grid(padding=(0, 1))
        errors.add_column(no_wrap=True, style="red")
        errors.add_column(overflow="fold")
        not_run = diagnosis.rules_not_run
        for error in diagnosis.errors:
            errors.add_row(f"{error.source}:", error.message)
            stopped = [r for r in error.rules if r in not_run]
            weakened = [r for r in error.rules if r not in not_run]
            if stopped:
                errors.add_row("", Text(f"could not run: {_listed(stopped)}", style="dim"))
            if weakened:
                errors.add_row("", Text(f"evidence incomplete: {_listed(weakened)}", style="dim"))
        parts.append(Padding(errors, (0, 0, 0, 2)))
    if diagnosis.coverage is not None:
        # "No findings" is only worth as much as what was looked at: always say what that was.
        parts.append(Text(""))
        parts.append(Text(f"coverage: {diagnosis.coverage.summary}", style="dim"))
    return Group(*parts)


#: Rule ids named per source error in the table; the JSON lists them all.
_RULES_LISTED = 8


def _listed(rules: list[str]) -> str:
    shown = ", ".join(rules[:_RULES_LISTED])
    more = len(rules) - _RULES_LISTED
    return shown + (f" and {more} more (--format json lists them)" if more > 0 else "")


def _block(
    index: int, finding: Finding, verbose: bool, width: int, links: bool, long_links: list[str]
) -> RenderableType:
    head = Text()
    head.append(f"{index:>2}  ")
    head.append(finding.severity.value, style=_STYLE[finding.severity])
    head.append("  ")
    head.append(finding.cause, style="bold")
    if finding.kind == "symptom":
        head.append(" (symptom)")
    body = Table.grid(padding=(0, 1))
    body.add_column(no_wrap=True, style="dim", min_width=_LABEL_WIDTH)
    body.add_column(overflow="fold")
    body.add_row("", Text(finding.summary))
    lines = _evidence_lines(finding.evidence, verbose, finding.summary)
    if lines and not verbose:
        # Short measurements read best as one wrapped sentence: value=1 (0.95), pending=30 (0).
        lines = [Text(", ").join(lines)]
    for number, line in enumerate(lines):
        body.add_row("" if number else "evidence", line)
    if finding.recommendation:
        body.add_row("do", Text(finding.recommendation))
    rows: list[RenderableType] = [head, Padding(body, (0, 0, 0, _INDENT - 1))]
    if finding.runbook_url:
        rows.append(_runbook(finding, width, links, long_links))
    return Group(*rows)


def _runbook(finding: Finding, width: int, links: bool, long_links: list[str]) -> Text:
    url = finding.runbook_url
    # Aligned with the block's labelled rows: indent, label column, one space.
    label = " " * (_INDENT - 1) + "runbook".ljust(_LABEL_WIDTH + 1)
    text = Text(label, style="dim", no_wrap=True, overflow="ignore")
    _, tail = _split_runbook(url)
    if links:
        # A terminal shows the short path and opens the full URL: nothing to wrap.
        text.append(tail, style=f"link {url} underline")
        return text
    if len(text) + len(url) <= width:
        text.append(url)
        return text
    # Too long for a line of its own at this width: never folded; the path under the runbook
    # base here, the base once below the findings.
    long_links.append(url)
    text.append(tail)
    return text


def _split_runbook(url: str) -> tuple[str, str]:
    """``(base, path)`` of a runbook URL: the path under its ``rules/`` directory, else its file."""
    cut = url.rfind("/rules/")
    cut = cut + len("/rules/") if cut >= 0 else url.rfind("/") + 1
    return url[:cut], url[cut:]


def _evidence_lines(evidence: list[Evidence], verbose: bool, summary: str = "") -> list[Text]:
    """One readable line per evidence row (what it measures, its value with units, the threshold);
    without ``verbose``, the first row per name, no labels and no detail the summary already says."""
    lines: list[Text] = []
    seen: set[str] = set()
    said = summary  # what the finding says already: each detail and caveat once
    for row in evidence:
        name = row.reads or "value"
        if not verbose and name in seen:
            continue
        seen.add(name)
        if verbose:
            line = row.line(said=said.removeprefix(summary))
            said += "\n" + line
            text = Text(line)
        else:
            line = row.short(said=said)
            said += "\n" + line
            if len(line) > _DETAIL_CHARS:
                line = line[: _DETAIL_CHARS - 3] + "..."
            text = Text(line)
        if len(text):
            lines.append(text)
    return lines
