"""Regenerate the rule table of docs/rules.md from the shipped rule pack.

python scripts/rules_table.py          # rewrite docs/rules.md in place
python scripts/rules_table.py --check  # exit 1 if docs/rules.md is out of date (used by the tests)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diagnoser.ruleset import load_rules

REPO = Path(__file__).resolve().parent.parent
RULES_PAGE = REPO / "docs" / "rules.md"
START, END = "<!-- rules-table:start -->", "<!-- rules-table:end -->"


def rules_table() -> str:
    ruleset = load_rules([], include_builtin=True)
    lines = ["| rule (runbook) | cause | severity | source | what it finds |", "|---|---|---|---|---|"]
    for rule in sorted(ruleset, key=lambda r: r.id):
        kind = " (symptom)" if rule.kind == "symptom" else ""
        title = " ".join(rule.description.split()) if rule.description else _first_comment(rule.path)
        lines.append(
            f"| [`{rule.id}`](../rules/{rule.id}.md) | `{rule.cause}`{kind} | {rule.severity.value} "
            f"| {', '.join(rule.sources)} | {title} |"
        )
    return "\n".join(lines)


def _first_comment(path: Path) -> str:
    """The rule file's leading comment: one or two sentences on what it detects."""
    comment = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    return " ".join(comment).replace("|", "\\|")


def render(page: str) -> str:
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{rules_table()}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    current = RULES_PAGE.read_text(encoding="utf-8")
    wanted = render(current)
    if args.check:
        if current != wanted:
            print("docs/rules.md's rule table is out of date: run python scripts/rules_table.py",
                  file=sys.stderr)
            return 1
        return 0
    RULES_PAGE.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
