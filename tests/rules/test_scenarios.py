"""Every scenario case of the rule pack, evaluated on one real, backfilled Prometheus."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.testing.rules import CaseResult, load_test_file, run_rule_tests
from tests.conftest import shared_bed

pytestmark = shared_bed(__name__)

SCENARIO_DIR = Path(__file__).parent / "scenarios"
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
FILES = sorted(SCENARIO_DIR.glob("*.yaml")) + sorted(EXAMPLES.glob("*.yaml"))


def _case_ids() -> list[str]:
    ids = []
    for path in FILES:
        for group in load_test_file(path).tests:
            for test in group.finding_tests:
                ids.append(f"{path.name} {group.name!r} {test.rule} @ {test.eval_time}")
    return ids


@pytest.fixture(scope="module")
def results() -> dict[str, CaseResult]:
    return {
        f"{Path(r.file).name} {r.group!r} {r.rule} @ {r.eval_time}": r for r in run_rule_tests(FILES)
    }


@pytest.mark.parametrize("case", _case_ids())
def test_scenario(case: str, results: dict[str, CaseResult]) -> None:
    result = results[case]
    assert result.passed, "\n".join(result.problems)
