"""The README's "Writing a rule" and "Testing a rule" examples, run verbatim through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.integration  # rules test starts a real Prometheus


def _yaml_after(heading: str) -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split(heading, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def readme_example(tmp_path: Path) -> Path:
    rule = tmp_path / "rules" / "pools" / "orders-pool.yaml"
    rule.parent.mkdir(parents=True)
    rule.write_text(_yaml_after("### Writing a rule"), encoding="utf-8")
    test = tmp_path / "my-rules-test.yaml"
    test.write_text(_yaml_after("### Testing a rule"), encoding="utf-8")
    return test


def test_readme_rule_test_passes_verbatim(readme_example: Path) -> None:
    result = run_cli("rules", "test", str(readme_example))
    assert result.code == 0, result.stdout + result.stderr
    assert "2 passed, 0 failed" in result.stdout


def test_a_failing_rule_test_names_the_field_and_the_loaded_ids(readme_example: Path) -> None:
    text = readme_example.read_text(encoding="utf-8")
    readme_example.write_text(
        text.replace('"from 10 to 20"', '"from 10 to 99"').replace("rule: pools/orders-pool\n        exp_findings: []",
                                                                   "rule: orders-pool\n        exp_findings: []"),
        encoding="utf-8",
    )
    result = run_cli("rules", "test", str(readme_example))
    assert result.code == 1
    out = " ".join(result.stdout.split())
    assert "exp_recommendation_contains: 'from 10 to 99' not in recommendation 'Raise the pool from 10 to 20.'" in out
    assert "no rule 'orders-pool' in the rules under test (loaded: pools/orders-pool)" in out


def test_a_rule_file_has_the_same_id_named_alone_or_through_its_directory(readme_example: Path) -> None:
    rules = readme_example.parent / "rules"
    ids = []
    for given in (rules, rules / "pools" / "orders-pool.yaml"):
        result = run_cli("rules", "list", "--rules", str(given), "--format", "json")
        assert result.code == 0, result.stderr
        ids.append({row["id"] for row in json.loads(result.stdout)} - {r for r in _builtin_ids()})
    assert ids == [{"pools/orders-pool"}, {"pools/orders-pool"}]


def _builtin_ids() -> set[str]:
    return {row["id"] for row in json.loads(run_cli("rules", "list", "--format", "json").stdout)}
