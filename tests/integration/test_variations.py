"""Every recorded bed replayed under the ordinary ways real data varies, diagnosed through the real CLI.

A rule that names the cause in one recording and misses it when the same software has only ten
minutes of history, an incident that has lasted two hours, 30 s or 60 s scrapes, a process that
restarted inside the window, or an exporter that failed one scrape in five, is fitted to that
recording, not general. Each bed of ``tests/fixtures/expositions`` (a server and the service in
front of it replayed together where they were recorded together) is backfilled once per variation
of :mod:`tests.fixtures.variations`, each variation on a day of its own in one Prometheus. The
answer as recorded is the reference: under every variation the top cause must be the same, for
the same subject, its first number within :data:`TOLERANCE`, and the healthy instant must have
nothing at warning or above. No-metadata needs no variation of its own: a backfilled Prometheus
has no metadata, so every bed here is replayed without it (checked below).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here, shared_bed
from tests.fixtures.expositions.timeline import HERE, Timeline, incident_timeline
from tests.fixtures.variations import VARIATIONS, Variation

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

DAY = 86_400
START_S = 1_700_000_000
INCIDENT_S = 600
#: Lead-in of the slow-dependency beds: the "before" they were recorded to be compared with
#: (dependency-slow's baseline an hour back), as a service that has run for a while has it.
DEPENDENCY_LEAD_IN_S = 5_400
#: Lead-in of the others (their rules look back over the confirmation window only): 15 minutes,
#: as the beds' own tests replay them.
LEAD_IN_S = 900
#: The slow-dependency beds, replayed with the longer lead-in.
DEPENDENCY_BEDS = {
    "grpc-go-prometheus-client", "micrometer-spring-checkout", "otel-aiohttp-client-stable",
    "otel-httpx-client-old", "otel-httpx-client-stable", "otel-js-http-client", "otel-js-pg",
    "otel-requests-client-old",
}
#: How far a variation's first number (a peak, a share, a rise) may stray from the recording's:
#: 60 s scrapes see a gauge of churning connections at other instants, and a 5m rate over 5
#: samples is coarser than one over 20.
TOLERANCE = 0.35

#: Directories recorded together, replayed together: the server first (its exporter is the one
#: whose scrapes fail at the limit), the service in front of it second.
PAIRS = {
    "mysqld-exporter-max-connections": "mysql-max-connections-service",
    "postgres-exporter-max-connections": "postgres-max-connections-service",
}


@dataclass(frozen=True)
class Bed:
    directories: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.directories[0]


def _beds() -> list[Bed]:
    paired = set(PAIRS.values())
    return [
        Bed((path.name, *((PAIRS[path.name],) if path.name in PAIRS else ())))
        for path in sorted(HERE.iterdir())
        if (path / "incident-0.prom").exists() and path.name not in paired
    ]


BEDS = _beds()
import os
if os.environ.get('VB'):
    BEDS = [b for b in BEDS if b.name in os.environ['VB'].split(',')]


def _timelines(bed: Bed) -> list[Timeline]:
    lead_in = DEPENDENCY_LEAD_IN_S if bed.name in DEPENDENCY_BEDS else LEAD_IN_S
    return [
        incident_timeline(
            directory, start_s=START_S, lead_in_s=lead_in, incident_s=INCIDENT_S,
            scrape_labels={"job": directory, "instance": f"10.0.0.{index + 1}:9000"},
        )
        for index, directory in enumerate(bed.directories)
    ]


def _varied(timelines: list[Timeline], variation: Variation, day: int) -> list[Timeline]:
    shifted = [t.shifted(DAY * day) for t in timelines]
    if variation.name == "1-in-5-scrapes-missing":
        # Only the saturated exporter (the bed's first target) fails its scrapes.
        return [variation.transform(shifted[0]), *shifted[1:]]
    return [variation.transform(t) for t in shifted]


@dataclass(frozen=True)
class Day:
    """Where one bed under one variation sits in the shared Prometheus."""

    incident_at: float
    healthy_at: float


@pytest.fixture(scope="module")
def bed() -> Iterator[tuple[str, dict[tuple[str, str], Day]]]:
    days: dict[tuple[str, str], Day] = {}
    parts: list[str] = []
    index = 0
    for bed in BEDS:
        recorded = _timelines(bed)
        for variation in VARIATIONS:
            timelines = _varied(recorded, variation, index)
            index += 1
            first = timelines[0]
            days[(bed.name, variation.name)] = Day(
                incident_at=max(t.end_s for t in timelines) - 15, healthy_at=first.incident_start_s - 30
            )
            parts += [t.openmetrics().removesuffix("# EOF\n") for t in timelines]
    with LocalPrometheus(openmetrics="".join(parts) + "# EOF\n") as prometheus:
        yield prometheus.url, days


def _diagnose(url: str, at_s: float) -> list[dict[str, Any]]:
    at = datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = run_cli_here("now", "--prometheus-url", url, "--at", at, "--format", "json")
    assert result.code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == [], report["errors"]
    return list(report["findings"])


def _top_cause(findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    causes = [f for f in findings if f["kind"] == "cause" and f["severity"] in ("warning", "critical")]
    return causes[0] if causes else None


def _shape(finding: dict[str, Any] | None) -> tuple[str, dict[str, str]] | None:
    return None if finding is None else (str(finding["cause"]), dict(finding["labels"]))


@pytest.fixture(scope="module")
def recorded(bed: tuple[str, dict[tuple[str, str], Day]]) -> dict[str, dict[str, Any] | None]:
    url, days = bed
    return {b.name: _top_cause(_diagnose(url, days[(b.name, "recorded")].incident_at)) for b in BEDS}


def test_a_backfilled_prometheus_has_no_metadata(bed: tuple[str, dict[tuple[str, str], Day]]) -> None:
    url, _ = bed
    metadata = httpx.get(f"{url}/api/v1/metadata", timeout=10).json()
    assert metadata["status"] == "success" and metadata["data"] == {}


def test_most_beds_name_a_cause_as_recorded(recorded: dict[str, dict[str, Any] | None]) -> None:
    # The reference must be worth comparing with: a bed whose recording names nothing would pass
    # every variation by naming nothing.
    named = [name for name, finding in recorded.items() if finding is not None]
    assert len(named) >= len(BEDS) * 0.6, sorted(set(recorded) - set(named))


CASES = [(b.name, v.name) for b in BEDS for v in VARIATIONS if v.name != "recorded"]


@pytest.mark.parametrize(("bed_name", "variation"), CASES, ids=[f"{b}-{v}" for b, v in CASES])
def test_the_top_cause_holds_under_the_variation(
    bed_name: str, variation: str, bed: tuple[str, dict[tuple[str, str], Day]],
    recorded: dict[str, dict[str, Any] | None],
) -> None:
    url, days = bed
    expected = recorded[bed_name]
    found = _top_cause(_diagnose(url, days[(bed_name, variation)].incident_at))
    assert _shape(found) == _shape(expected), (
        None if found is None else found["summary"], None if expected is None else expected["summary"]
    )
    if expected is not None and found is not None:
        want, got = expected["evidence"][0]["value"], found["evidence"][0]["value"]
        assert abs(got - want) <= TOLERANCE * abs(want) + 1e-9, (got, want, found["summary"])


HEALTHY = [(b.name, v.name) for b in BEDS for v in VARIATIONS]


@pytest.mark.parametrize(("bed_name", "variation"), HEALTHY, ids=[f"{b}-{v}" for b, v in HEALTHY])
def test_the_healthy_instant_stays_quiet(
    bed_name: str, variation: str, bed: tuple[str, dict[tuple[str, str], Day]]
) -> None:
    url, days = bed
    findings = _diagnose(url, days[(bed_name, variation)].healthy_at)
    assert [f["summary"] for f in findings if f["severity"] in ("warning", "critical")] == []
