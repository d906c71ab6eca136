"""The documentation pages and the examples in them, as the doc tests read them.

Every fenced block of README.md and docs/*.md is preceded by a marker, ``<!-- example: KIND -->``,
that says which test runs it (``config``, ``rule``, ``commands``, ``json diagnosis``...); a block
without one fails ``test_every_example_is_run``, so a new example cannot go untested.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO, CliResult

DOCS = REPO / "docs"
README = REPO / "README.md"
PAGES = (README, *sorted(DOCS.glob("*.md")))

_MARKER = re.compile(r"<!-- example: ([a-z-]+(?: [a-z-]+)?) -->")
_FENCE = re.compile(r"^```(\w*)$")


@dataclass(frozen=True)
class Example:
    """One fenced block: where it is, the kind its marker names (``None`` without one), its text."""

    page: Path
    line: int
    kind: str | None
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The fenced blocks of ``page``, in order, each with the marker on the line before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i] == "```")
        marker = _MARKER.fullmatch(lines[index - 1].strip()) if index else None
        text = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Example(page, index + 1, marker.group(1) if marker else None, opening.group(1), text))
        index = end + 1
    return found


def all_examples() -> list[Example]:
    return [example for page in PAGES for example in examples(page)]


def of_kind(kind: str) -> list[Example]:
    """Every example marked ``kind``, on every page; a kind nobody uses any more is a test bug."""
    found = [example for example in all_examples() if example.kind == kind]
    assert found, f"no example is marked {kind!r}"
    return found


def only(kind: str) -> Example:
    [example] = of_kind(kind)
    return example


def section(page: Path, start: str, end: str) -> str:
    """The text between two marker comments of ``page`` (``<!-- metrics:start -->``...)."""
    text = page.read_text(encoding="utf-8")
    return text.split(f"<!-- {start} -->", 1)[1].split(f"<!-- {end} -->", 1)[0]


def run_in(directory: Path, argv: Sequence[str], timeout: float = 120) -> CliResult:
    """Run a documented command line in ``directory``, where its relative paths are, as a user would.

    ``tests.conftest.run_cli`` runs in the repository; a page's example names files of its own
    (``diagnoser.yaml``, ``my-rules-test.yaml``), which the test writes into ``directory``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    env.update({"COLUMNS": "200", "PYTHONPATH": str(REPO)})
    program = [sys.executable, "-m", "diagnoser"] if argv[0] == "diagnose" else [argv[0]]
    done = subprocess.run(
        [*program, *argv[1:]], cwd=directory, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def write_rule_examples(directory: Path) -> Path:
    """docs/rules.md's rule and its test, at the paths their first comment lines name; the test file."""
    for kind in ("rule", "rule-test"):
        text = only(kind).text
        first = text.splitlines()[0]
        assert first.startswith("# "), first
        path = directory / first.removeprefix("# ").split()[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return directory / "my-rules-test.yaml"
