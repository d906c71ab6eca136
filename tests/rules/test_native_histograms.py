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
