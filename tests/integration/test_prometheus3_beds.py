"""The Prometheus 3 beds: one real service recorded through Prometheus 2.42 (classic histograms)
and Prometheus 3.5 (native histograms on, or UTF-8 names) at once, replayed on the same major
each was recorded on, must give the same findings with numbers within 10 %, and nothing at its
healthy instants. The 2.42 half is the suite's smoke run on Prometheus 2."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import live_bed, run_cli_here
from tests.fixtures.prom3.beds import BEDS, bed_info, replayed

pytestmark = live_bed

PAIRS = sorted({p.name.rsplit("-", 1)[0] for p in BEDS.glob("*-[23]")})
#: Ratios and rates read from a histogram's counts agree across kinds to this (the beds agree
#: to about 1 %: the two servers scrape the same service a few ms apart).
TOLERANCE = 0.10
#: Quantiles do not: a classic p99 is interpolated inside a default bucket (0.25 s, 0.5 s], a
#: native one inside a bucket 9 % wide (factor 1.1). The go-native bed's requests at 280-320 ms
#: read 0.47 s classic, 0.33 s native: the native p99 must fall in the classic answer's bucket.
CLASSIC_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
QUANTILE_RULES = {"http/latency-slo-breach"}


def _bucket(value: float) -> tuple[float, float]:
    lower = max((b for b in CLASSIC_BOUNDS if b < value), default=0.0)
    upper = min((b for b in CLASSIC_BOUNDS if b >= value), default=float("inf"))
    return lower, upper


@contextlib.contextmanager
def _running(bed: Path) -> Iterator[str]:
    with replayed(bed) as prometheus:
        yield prometheus.url


def _diagnose(url: str, at: int, config: Path) -> dict[str, Any]:
    result = run_cli_here(
        "now", "--config", str(config), "--prometheus-url", url, "--at", str(at), "--format", "json"
    )
    assert result.code in (0, 1), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prom3") / "diagnoser.yaml"
    path.write_text("slo:\n  p99_ms: 100\n", encoding="utf-8")
    return path


def _findings(report: dict[str, Any]) -> dict[str, float]:
    return {
        f["rule_id"]: f["evidence"][0]["value"]
        for f in report["findings"]
        if f["severity"] in ("warning", "critical") and f["cause"] != "source_unavailable"
    }


@pytest.mark.parametrize("name", PAIRS)
def test_same_findings_on_both_majors(name: str, config: Path) -> None:
    found: dict[str, dict[str, float]] = {}
    for major in ("2", "3"):
        bed = BEDS / f"{name}-{major}"
        info = bed_info(bed)
        with _running(bed) as url:
            for at in info["healthy_at"]:
                assert _findings(_diagnose(url, at, config)) == {}, f"{bed.name} at healthy {at}"
            report = _diagnose(url, info["incident_at"][0], config)
        found[major] = _findings(report)
        causes = {f["cause"] for f in report["findings"]}
        assert info["expect"]["cause"] in causes, f"{bed.name}: {report['findings']}"
        for also in info["expect"].get("also", []):
            assert also in causes, f"{bed.name}: {also} missing from {sorted(causes)}"
    assert found["2"].keys() == found["3"].keys()
    for rule, classic in found["2"].items():
        if rule in QUANTILE_RULES:
            assert _bucket(found["3"][rule]) == _bucket(classic), f"{name} {rule}: {found}"
        else:
            assert found["3"][rule] == pytest.approx(classic, rel=TOLERANCE), f"{name} {rule}: {found}"
