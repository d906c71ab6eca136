"""docs/rules.md's "Writing a rule" and "Testing a rule" examples, run verbatim through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.docs.examples import write_rule_examples

pytestmark = pytest.mark.integration  # rules test starts a real Prometheus


@pytest.fixture
def rule_example(tmp_path: Path) -> Path:
    return write_rule_examples(tmp_path)


def test_the_rule_test_example_passes_verbatim(rule_example: Path) -> None:
    result = run_cli("rules", "test", str(rule_example))
    assert result.code == 0, result.stdout + result.stderr
    assert "2 passed, 0 failed" in result.stdout


def test_a_failing_rule_test_names_the_field_and_the_loaded_ids(rule_example: Path) -> None:
    text = rule_example.read_text(encoding="utf-8")
    rule_example.write_text(
        text.replace('"from 10 to 20"', '"from 10 to 99"').replace("rule: pools/orders-pool\n        exp_findings: []",
                                                                   "rule: orders-pool\n        exp_findings: []"),
        encoding="utf-8",
    )
    result = run_cli("rules", "test", str(rule_example))
    assert result.code == 1
    out = " ".join(result.stdout.split())
    assert "exp_recommendation_contains: 'from 10 to 99' not in recommendation 'Raise the pool from 10 to 20.'" in out
    assert "no rule 'orders-pool' in the rules under test (loaded: pools/orders-pool)" in out


def test_a_rule_file_has_the_same_id_named_alone_or_through_its_directory(rule_example: Path) -> None:
    rules = rule_example.parent / "rules"
    ids = []
    for given in (rules, rules / "pools" / "orders-pool.yaml"):
        result = run_cli("rules", "list", "--rules", str(given), "--format", "json")
        assert result.code == 0, result.stderr
        ids.append({row["id"] for row in json.loads(result.stdout)} - {r for r in _builtin_ids()})
    assert ids == [{"pools/orders-pool"}, {"pools/orders-pool"}]


def _builtin_ids() -> set[str]:
    return {row["id"] for row in json.loads(run_cli("rules", "list", "--format", "json").stdout)}
