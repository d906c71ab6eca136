"""The Prometheus 3 beds (``tests/fixtures/prom3/beds/*-3``: native histograms, UTF-8 names, 3.x's
normalised ``quantile`` values) replayed as recorded and under the variations, diagnosed through
the real CLI.

Each bed is written into one Prometheus 3.5 by remote write, as its own tests replay it (promtool
backfills no native histogram), once per variation under a job of its own
(``<job>--<variation>``), shifted so that every copy's fault starts at :data:`INCIDENT_AT`. The
variations are those of :mod:`tests.fixtures.variations`, on the series' own form
(:mod:`tests.fixtures.prom3.variations`): the native histograms grow, reset and lose scrapes
bucket by bucket. As in ``test_variations.py``, the answer as recorded is the reference: the same
top finding (a cause, or the symptom where the bed's answer is a symptom) for the same subject, its
first number within :data:`TOLERANCE`, and nothing at warning or above at the healthy instant.

Ten-minute history is every one of these beds as recorded (six minutes before the fault: checked
below), and a remote-written Prometheus has no metadata (checked below): neither needs a copy.

Cost (2 cores, little else running): 3 beds x 6 copies, about 0.3 M float samples and 10 k
native histograms written, and six diagnoses (two SLOs x three instants); about 25 s of set-up.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import yaml

from diagnoser.engine import evaluate
from diagnoser.testing.prometheus import LocalPrometheus
from diagnoser.testing.remote_write import HistogramSeries
from tests.conftest import run_cli_here, shared_bed
from tests.fixtures.prom3 import variations as v
from tests.fixtures.prom3.beds import BEDS, bed_info, bed_series
from tests.fixtures.variations import SEPARATOR, findings_about, first_number, shape, top_cause

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

#: Where every copy's fault starts.
INCIDENT_AT = 1_700_010_000
#: How far a variation's first number may stray from the recording's: a p99 read from native
#: buckets 9 % wide, over 5 samples of 60 s scrapes instead of 20 of 15 s (as test_variations.py).
TOLERANCE = 0.35
#: The SLO a bed is diagnosed with unless its ``bed.yaml`` says (as test_prometheus3_beds.py).
DEFAULT_CONFIG: dict[str, Any] = {"slo": {"p99_ms": 100}}
LONG_INCIDENT_S = 7200


@dataclass(frozen=True)
class Bed:
    path: Path
    info: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def job(self) -> str:
        """The service's job: the subject of the bed's answer, whose process restarts and whose
        scrapes fail."""
        return str(self.info["expect"]["subject"]["service"])

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.info.get("config", DEFAULT_CONFIG))

    @property
    def fault_s(self) -> float:
        return float(self.info["fix_s"] - self.info["onset_s"])


BEDS3 = [Bed(p, bed_info(p)) for p in sorted(BEDS.glob("*-3"))]

Transform = Callable[[list[v.Series], Bed], list[v.Series]]


def _recorded_s(bed: Bed) -> float:
    return float(bed.info["scrape_interval_s"])


#: Each variation on a bed already moved so that its fault starts at INCIDENT_AT.
VARIATIONS: dict[str, Transform] = {
    "recorded": lambda s, b: s,
    "2h-incident": lambda s, b: v.long_incident(s, INCIDENT_AT, INCIDENT_AT + b.fault_s, LONG_INCIDENT_S),
    "30s-scrapes": lambda s, b: v.downsampled(s, _recorded_s(b), 30),
    "60s-scrapes": lambda s, b: v.downsampled(s, _recorded_s(b), 60),
    # Two minutes before the incident's diagnosis: inside every rule's 5m window.
    "counter-reset": lambda s, b: v.counter_reset(s, INCIDENT_AT + b.fault_s - 120, b.job),
    "1-in-5-scrapes-missing": lambda s, b: v.missing_scrapes(s, _recorded_s(b), b.job),
}


def _job(bed: Bed, job: str, variation: str) -> str:
    """A copy's name for one of the bed's jobs: two beds here both name their service ``checkout``."""
    return f"{job}.{bed.name}{SEPARATOR}{variation}"


@functools.cache
def _recorded(path: Path) -> tuple[v.Series, ...]:
    return tuple(bed_series(path))


def _jobs(bed: Bed) -> set[str]:
    return {s.labels["job"] for s in _recorded(bed.path)}


def _copies(bed: Bed) -> Iterator[v.Series]:
    recorded = _recorded(bed.path)
    shift = INCIDENT_AT - bed.info["onset_s"]
    for name, transform in VARIATIONS.items():
        copy = [
            one
            for job in sorted(_jobs(bed))
            for one in v.moved(
                [s for s in recorded if s.labels["job"] == job], shift, job=_job(bed, job, name)
            )
        ]
        yield from transform(copy, _renamed(bed, name))


def _renamed(bed: Bed, variation: str) -> Bed:
    """The bed as its copy names its service's job."""
    subject = {"service": _job(bed, bed.job, variation)}
    return Bed(bed.path, {**bed.info, "expect": {**bed.info["expect"], "subject": subject}})


def _instant(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _diagnose(url: str, config: Path, at_s: float) -> list[dict[str, Any]]:
    # Every copy is in this one diagnosis: the cap on findings per rule (a report's length, not a
    # judgement) is lifted, as in test_variations.py.
    with mock.patch.object(evaluate, "MAX_FINDINGS_PER_RULE", 100_000):
        result = run_cli_here(
            "now",
            "--config",
            str(config),
            "--prometheus-url",
            url,
            "--at",
            _instant(at_s),
            "--format",
            "json",
        )
    assert result.code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == [], report["errors"]
    return list(report["findings"])


@dataclass(frozen=True)
class Replay:
    url: str
    #: Per bed name: the findings at the healthy instant, the incident's, the two-hour incident's.
    healthy: dict[str, list[dict[str, Any]]]
    incident: dict[str, list[dict[str, Any]]]
    long_incident: dict[str, list[dict[str, Any]]]


def _healthy_at(bed: Bed) -> float:
    return float(INCIDENT_AT + bed.info["healthy_at"][0] - bed.info["onset_s"])


def _incident_at(bed: Bed) -> float:
    return float(INCIDENT_AT + bed.info["incident_at"][0] - bed.info["onset_s"])


def _long_at(bed: Bed) -> float:
    cycles = int(LONG_INCIDENT_S // bed.fault_s)
    return _incident_at(bed) + (cycles - 1) * bed.fault_s


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    series = [s for bed in BEDS3 for s in _copies(bed)]
    by_config: dict[str, list[Bed]] = {}
    for bed in BEDS3:
        by_config.setdefault(json.dumps(bed.config, sort_keys=True), []).append(bed)
    with LocalPrometheus(major="3", series=series) as prometheus:
        del series
        healthy, incident, long_incident = {}, {}, {}
        for index, (config, beds) in enumerate(by_config.items()):
            path = tmp_path_factory.mktemp("config") / f"config-{index}.yaml"
            path.write_text(yaml.safe_dump(json.loads(config)), encoding="utf-8")
            # The beds of one SLO share their instants (each bed's relative to its fault's start).
            instants = {(_healthy_at(b), _incident_at(b), _long_at(b)) for b in beds}
            assert len(instants) == 1, instants
            at_healthy, at_incident, at_long = instants.pop()
            found = [_diagnose(prometheus.url, path, at) for at in (at_healthy, at_incident, at_long)]
            for bed in beds:
                healthy[bed.name], incident[bed.name], long_incident[bed.name] = found
        yield Replay(prometheus.url, healthy, incident, long_incident)


def _own(findings: list[dict[str, Any]], bed: Bed, variation: str) -> list[dict[str, Any]]:
    return findings_about(findings, {_job(bed, job, variation) for job in _jobs(bed)})


def _top(findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The bed's answer: its top cause, or its top symptom where no cause is named (a service
    whose fault is inside its own handler)."""
    return top_cause(findings) or top_cause(findings, kinds=("symptom",))


def _bed(name: str) -> Bed:
    return next(b for b in BEDS3 if b.name == name)


def test_every_prometheus_3_bed_is_replayed() -> None:
    assert {b.name for b in BEDS3} == {p.name for p in BEDS.glob("*-3")} and len(BEDS3) >= 3


def test_ten_minutes_of_history_is_the_recording() -> None:
    # The 10m-history variation would cut nothing: each bed has less before its fault.
    for bed in BEDS3:
        assert bed.info["onset_s"] - bed.info["start_s"] <= 600, bed.name


def test_a_remote_written_prometheus_has_no_metadata(replay: Replay) -> None:
    metadata = httpx.get(f"{replay.url}/api/v1/metadata", timeout=10).json()
    assert metadata["status"] == "success" and metadata["data"] == {}


def test_the_native_histograms_are_varied_too() -> None:
    # The go-native bed's answer is read from native histograms only: the variations must reach them.
    bed = _bed("go-native-3")
    varied = list(_copies(bed))
    natives = [s for s in varied if isinstance(s, HistogramSeries)]
    counts = {s.labels["job"]: len(s.samples) for s in natives if s.labels["code"] == "200"}
    recorded = counts[_job(bed, "checkout", "recorded")]
    assert counts[_job(bed, "checkout", "60s-scrapes")] == pytest.approx(recorded / 4, abs=1)
    assert counts[_job(bed, "checkout", "1-in-5-scrapes-missing")] == pytest.approx(recorded * 4 / 5, abs=1)
    assert counts[_job(bed, "checkout", "2h-incident")] > 8 * recorded
    reset = next(
        s
        for s in natives
        if s.labels["job"] == _job(bed, "checkout", "counter-reset") and s.labels["code"] == "200"
    )
    counts_over_time = [h.count for _, h in reset.samples]
    assert min(b - a for a, b in itertools.pairwise(counts_over_time)) < 0


def test_the_recordings_give_their_answers(replay: Replay) -> None:
    # The reference must be worth comparing with: each bed's own expected answer, as recorded.
    for bed in BEDS3:
        mine = _own(replay.incident[bed.name], bed, "recorded")
        wanted = {bed.info["expect"]["cause"], *bed.info["expect"].get("also", [])}
        assert wanted <= {f["cause"] for f in mine if f["severity"] in ("warning", "critical")}, (
            bed.name,
            mine,
        )
        assert _top(mine) is not None, bed.name


CASES = [(b.name, name) for b in BEDS3 for name in VARIATIONS if name != "recorded"]


@pytest.mark.parametrize(("bed_name", "variation"), CASES, ids=[f"{b}-{n}" for b, n in CASES])
def test_the_top_finding_holds_under_the_variation(bed_name: str, variation: str, replay: Replay) -> None:
    bed = _bed(bed_name)
    expected = _top(_own(replay.incident[bed.name], bed, "recorded"))
    source = replay.long_incident if variation == "2h-incident" else replay.incident
    mine = _own(source[bed.name], bed, variation)
    found = _top(mine)
    assert shape(found, variation) == shape(expected, "recorded"), (
        None if found is None else found["summary"],
        None if expected is None else expected["summary"],
    )
    also = set(bed.info["expect"].get("also", []))
    assert also <= {f["cause"] for f in mine if f["severity"] in ("warning", "critical")}, [
        f["summary"] for f in mine
    ]
    if expected is not None and found is not None:
        compared = first_number(expected, found)
        assert compared is not None, (expected["evidence"], found["evidence"])
        name, want, got = compared
        assert abs(got - want) <= TOLERANCE * abs(want) + 1e-9, (name, got, want, found["summary"])


HEALTHY = [(b.name, name) for b in BEDS3 for name in VARIATIONS]


@pytest.mark.parametrize(("bed_name", "variation"), HEALTHY, ids=[f"{b}-{n}" for b, n in HEALTHY])
def test_the_healthy_instant_stays_quiet(bed_name: str, variation: str, replay: Replay) -> None:
    bed = _bed(bed_name)
    findings = _own(replay.healthy[bed.name], bed, variation)
    assert [f["summary"] for f in findings if f["severity"] in ("warning", "critical")] == []
