"""A rule directory can add a cause to the vocabulary: ``new_cause:`` says what it means, and
``rules list`` shows it; an undeclared unknown cause is still an error that says how to declare it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from diagnoser.cli.app import app
from diagnoser.ruleset import load_rules

RULE = """
cause: {cause}
{declare}severity: warning
title: t
summary: s
when:
  - promql: {{query: up == 0}}
"""


def _write(root: Path, cause: str, declare: str = "") -> Path:
    path = root / "team" / "batch-stuck.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RULE.format(cause=cause, declare=declare), encoding="utf-8")
    return root


def test_a_rule_directory_declares_a_new_cause(tmp_path: Path) -> None:
    root = _write(tmp_path, "batch_window_overrun", "new_cause: the nightly batch ran into business hours\n")
    ruleset = load_rules([root], include_builtin=False)
    assert ruleset.problems == []
    [rule] = ruleset
    assert (rule.cause, rule.new_cause) == ("batch_window_overrun", "the nightly batch ran into business hours")
    result = CliRunner().invoke(app, ["rules", "list", "--rules", str(root), "--format", "json"])
    [row] = [r for r in json.loads(result.stdout) if r["id"] == "team/batch-stuck"]
    assert row["cause"] == "batch_window_overrun" and row["new_cause"].startswith("the nightly batch")


def test_an_unknown_cause_not_declared_says_how_to_declare_it(tmp_path: Path) -> None:
    [problem] = load_rules([_write(tmp_path, "batch_window_overrun")], include_builtin=False).problems
    assert "unknown cause 'batch_window_overrun' (or declare it: new_cause: <what it means>)" in str(problem)


def test_declaring_a_cause_the_vocabulary_has_is_refused(tmp_path: Path) -> None:
    root = _write(tmp_path, "queue_backlog", "new_cause: again\n")
    [problem] = load_rules([root], include_builtin=False).problems
    assert "new_cause" in str(problem) and "already in the vocabulary" in str(problem)
