"""Peers named by a label nobody anticipated, chosen by which label's values split the slowdown.

The seen bed ``py-hand-dest-slow`` (prometheus_client by hand, ``dest_service``; ``payments`` went
from 5 to 200 ms while ``accounts`` and ``catalog`` stayed at 5 ms) is backfilled with one more
label on its outbound histogram, ``dest_pool``, that groups the three peers the way a deployment
might (``payments`` and ``accounts`` share a pool): two labels that are no known dimension, so
recognition must ask which one splits the slowdown. Grouped by the pool, the slow peer's rise is
diluted by its healthy neighbour's calls; grouped by ``dest_service`` it is the whole rise.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here, shared_bed

pytestmark = shared_bed(__name__)

BED = Path(__file__).resolve().parents[1] / "fixtures" / "unseen" / "py-hand-dest-slow"
POOLS = {"payments": "pool-a", "accounts": "pool-a", "catalog": "pool-b"}


def _with_pool_label(text: str) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        if line.startswith("outbound_request_duration_seconds") and 'dest_service="' in line:
            peer = line.split('dest_service="', 1)[1].split('"', 1)[0]
            line = line.replace('dest_service="', f'dest_pool="{POOLS[peer]}",dest_service="', 1)
        lines.append(line)
    return "".join(lines)


@pytest.fixture(scope="module")
def bed() -> Iterator[tuple[str, dict[str, Any]]]:
    import yaml

    spec = yaml.safe_load((BED / "bed.yaml").read_text())
    with gzip.open(BED / "series.om.gz", "rt", encoding="utf-8") as recorded:
        text = _with_pool_label(recorded.read())
    with LocalPrometheus(major="2", openmetrics=text) as prometheus:
        yield prometheus.url, spec


def _diagnose(url: str, at: int, tmp_path: Path, spec: dict[str, Any]) -> list[dict[str, Any]]:
    config = tmp_path / "config.yaml"
    # Deadlines a busy machine does not run into (the bed is small; its queries are not).
    config.write_text(json.dumps({**spec["config"], "deadline_s": 120, "prometheus": {"query_timeout_s": 60}}))
    result = run_cli_here(
        "now", "--prometheus-url", url, "--at", str(at), "--format", "json", "--config", str(config)
    )
    assert result.code in (0, 1), result.stderr
    findings: list[dict[str, Any]] = json.loads(result.stdout)["findings"]
    return [f for f in findings if f["severity"] in ("warning", "critical")]


def test_the_label_whose_values_split_the_slowdown_names_the_peer(
    bed: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, spec = bed
    findings = _diagnose(url, spec["incident_at"][-1], tmp_path, spec)
    slow = [f for f in findings if f["cause"] == "dependency_slow"]
    assert slow, [f["rule_id"] for f in findings]
    assert {f["labels"].get("peer") for f in slow} == {"payments"}
    assert "dest_service" in slow[0]["evidence"][0]["convention"]


def test_the_healthy_instant_stays_quiet(bed: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, spec = bed
    assert _diagnose(url, spec["healthy_at"][-1], tmp_path, spec) == []
