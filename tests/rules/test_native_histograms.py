"""Rule tests over native histograms (promtool's notation), on a Prometheus 3 written by remote write."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.testing.prometheus import binaries
from diagnoser.testing.rules import run_rule_tests
from tests.conftest import shared_bed

pytestmark = shared_bed(__name__)

NATIVE = Path(__file__).parent / "native"


@pytest.mark.skipif(binaries("3") is None, reason="Prometheus 3 is not installed (make setup installs it)")
def test_native_histogram_scenarios_pass() -> None:
    results = run_rule_tests(sorted(NATIVE.glob("*.yaml")))
    assert len(results) == 3
    assert [r.problems for r in results if not r.passed] == []


@pytest.mark.skipif(binaries("3") is None, reason="Prometheus 3 is not installed (make setup installs it)")
def test_a_wrong_expectation_over_native_histograms_fails(tmp_path: Path) -> None:
    # The same series with the p99 the classic default buckets would have given (0.47 s): the
    # native buckets read 0.3 s, so the expectation must fail and say what was found.
    text = (NATIVE / "native-histograms.yaml").read_text(encoding="utf-8")
    assert '"p99 0.3"' in text
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(text.replace('"p99 0.3"', '"p99 0.47"'), encoding="utf-8")
    results = run_rule_tests([wrong])
    failed = [r for r in results if not r.passed]
    assert len(failed) == 1 and "p99 0.3" in "\n".join(failed[0].problems), [r.problems for r in results]
