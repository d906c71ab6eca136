"""Rule loading: every problem reported on one line with file, rule and field; good rules survive."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.ruleset import load_rules

GOOD = """
cause: connection_pool_exhaustion
severity: critical
title: t
summary: s
when:
  - promql: {query: up == 0}
"""


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("cause: [unclosed\n", "", "not valid YAML (line 2, column 1)"),
        (GOOD.replace("promql:", "promqll:"), "field when[0].promqll", "unknown check kind 'promqll'"),
        (GOOD.replace("severity: critical\n", ""), "field severity", "field required"),
        (GOOD.replace("{query: up == 0}", "{query: up, op: '>'}"), "field when[0].promql", "op and threshold go together"),
        (GOOD.replace("{query: up == 0}", "{query: up, op: '~', threshold: 1}"), "field when[0].promql.op", "Input should be"),
        (GOOD.replace("connection_pool_exhaustion", "pool_is_sad"), "field cause", "unknown cause 'pool_is_sad'"),
        (GOOD + "colour: red\n", "field colour", "unknown field"),
        (GOOD + "compute:\n  n: __import__('os')\n", "field compute", "only these functions"),
        (GOOD + "explains: [sadness]\n", "field explains", "unknown symptom"),
    ],
)
def test_bad_rule_is_one_line_naming_file_rule_and_field(tmp_path: Path, text: str, field: str, message: str) -> None:
    write(tmp_path, "team/good.yaml", GOOD)
    bad = write(tmp_path, "team/bad.yaml", text)
    ruleset = load_rules([tmp_path], include_builtin=False)
    assert list(ruleset.rules) == ["team/good"], "the good rule must still load"
    assert len(ruleset.problems) >= 1
    line = str(ruleset.problems[0])
    assert "\n" not in line
    assert line.startswith(f"{bad}: rule team/bad:")
    assert field in line
    assert message in line


def test_placeholder_params_validate_with_their_defaults(tmp_path: Path) -> None:
    write(
        tmp_path,
        "x/threshold.yaml",
        GOOD.replace("{query: up == 0}", "{query: up, op: '>', threshold: '${params.limit}'}") + "params: {limit: oops}\n",
    )
    ruleset = load_rules([tmp_path], include_builtin=False)
    assert not ruleset.rules
    assert "field when[0].promql.threshold" in str(ruleset.problems[0])


def test_unset_signal_is_not_a_load_error(tmp_path: Path) -> None:
    write(tmp_path, "q/backlog.yaml", GOOD.replace("{query: up == 0}", "{query: 'sum(${signals.queue_length})'}"))
    ruleset = load_rules([tmp_path], include_builtin=False)
    assert list(ruleset.rules) == ["q/backlog"]


def test_user_rule_replaces_builtin_with_same_id(tmp_path: Path) -> None:
    write(tmp_path, "pools/pool-exhaustion.yaml", GOOD.replace("title: t", "title: mine"))
    ruleset = load_rules([tmp_path])
    assert ruleset.rules["pools/pool-exhaustion"].title == "mine"
    assert "http/latency-slo-breach" in ruleset.rules


def test_missing_directory_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    ruleset = load_rules([tmp_path / "nope"], include_builtin=False)
    assert "rule directory does not exist" in str(ruleset.problems[0])
