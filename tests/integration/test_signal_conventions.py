"""Every rule at once against one Prometheus holding services that follow different conventions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from diagnoser.testing.prometheus import LocalPrometheus
from diagnoser.testing.rules import backfill_text, load_test_file, parse_duration
from tests.conftest import run_cli_here, shared_bed

POOLS = Path(__file__).resolve().parents[1] / "rules" / "scenarios" / "pools.yaml"

pytestmark = [pytest.mark.integration, shared_bed(__name__)]


GROUPS = (
    "go-redis service and HikariCP service both exhausted",
    "sqlalchemy pool without a max, pinned at 5 while the service breaks its latency SLO",
)


@pytest.fixture(scope="module")
def pools_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, float]]]:
    # Only the groups used here, so that their days on the timeline stay in the past.
    spec = load_test_file(POOLS)
    spec.tests = [group for group in spec.tests if group.name in GROUPS]
    path = tmp_path_factory.mktemp("scenarios") / "pools.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")), encoding="utf-8")
    text, starts = backfill_text(path)
    with LocalPrometheus(openmetrics=text) as prometheus:
        yield prometheus.url, dict(zip([group.name for group in spec.tests], starts, strict=True))


def _now(url: str, start: float, offset: str) -> list[dict[str, object]]:
    at = datetime.fromtimestamp(start + parse_duration(offset), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = run_cli_here("now", "--prometheus-url", url, "--at", at, "--format", "json")
    assert result.code == 1, result.stderr
    findings: list[dict[str, object]] = json.loads(result.stdout)["findings"]
    return findings


def test_two_services_with_different_conventions_give_one_finding_per_pool(
    pools_prometheus: tuple[str, dict[str, float]],
) -> None:
    url, starts = pools_prometheus
    findings = _now(url, starts["go-redis service and HikariCP service both exhausted"], "19m")
    pools = [f for f in findings if f["cause"] == "connection_pool_exhaustion"]
    assert sorted((f["labels"]["service"], f["labels"]["pool"]) for f in pools) == [  # type: ignore[index]
        ("feature", "redis:6379"),
        ("orders", "HikariPool-1"),
    ]
    conventions = {f["labels"]["service"]: f["evidence"][0]["convention"] for f in pools}  # type: ignore[index]
    assert conventions == {"feature": "go-redis-redisotel", "orders": "hikaricp-micrometer"}


def test_a_pool_without_a_maximum_is_found_once_with_its_size_inferred(
    pools_prometheus: tuple[str, dict[str, float]],
) -> None:
    url, starts = pools_prometheus
    name = "sqlalchemy pool without a max, pinned at 5 while the service breaks its latency SLO"
    findings = _now(url, starts[name], "19m")
    pools = [f for f in findings if f["cause"] == "connection_pool_exhaustion"]
    assert [f["rule_id"] for f in pools] == ["pools/pool-exhaustion-inferred"]
    text = json.dumps(findings)
    assert "?" not in " ".join(str(f[k]) for f in findings for k in ("title", "summary", "recommendation"))
    assert "unknown" not in pools[0]["summary"]  # type: ignore[operator]
    assert "orders-sqlalchemy" in text
