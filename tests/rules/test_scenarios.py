"""Every scenario case of the rule pack, evaluated on one real, backfilled Prometheus."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.testing.prometheus import default_major
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


#: Cases whose outcome Prometheus 3's left-open ranges change: at 30 s scrapes a 2m window holds 4
#: samples, not 5 (a 5m window 10, not 11), so a quantile over the window tolerates one scrape
#: fewer between two requests and interpolates the boundary differently. Kept failing on 3.x
#: (strict) until the pool rules count their tolerance from the samples a window holds there.
LEFT_OPEN_RANGES = {
    "pools.yaml 'otel pool at its max, one scrape caught a connection between two requests' pools/pool-exhaustion @ 14m",
    "pools.yaml 'sqlalchemy pool pinned at 5, one scrape caught a connection between two requests'"
    " pools/pool-exhaustion-inferred @ 19m",
}


@pytest.mark.parametrize("case", _case_ids())
def test_scenario(case: str, results: dict[str, CaseResult]) -> None:
    result = results[case]
    if case in LEFT_OPEN_RANGES and default_major() == "3":
        if result.passed:
            pytest.fail("passes on Prometheus 3 now: take it out of LEFT_OPEN_RANGES")
        pytest.xfail("Prometheus 3's left-open ranges: " + "; ".join(result.problems))
    assert result.passed, "\n".join(result.problems)
