"""The variation transforms: each changes one thing about a timeline and nothing else."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from diagnoser.testing.series import SeriesSpec
from tests.fixtures.expositions.timeline import Timeline, incident_timeline
from tests.fixtures.variations import (
    VARIATIONS,
    counter_reset,
    downsampled,
    long_incident,
    missing_scrapes,
    relabelled,
    short_history,
)

COUNTER = SeriesSpec("requests_total", (("job", "a"),))
GAUGE = SeriesSpec("connections", (("job", "a"),))
OTHER = SeriesSpec("connections", (("job", "b"),))


def _timeline() -> Timeline:
    """20 healthy scrapes then 10 of incident, 15 s apart: the counter grows 1/s then 10/s, the
    gauge is 1 then 5."""
    samples = []
    for step in range(30):
        at = 1000.0 + 15 * step
        counter = 15.0 * step if step < 20 else 15.0 * 19 + 150.0 * (step - 19)
        samples += [(COUNTER, at, counter), (GAUGE, at, 1.0 if step < 20 else 5.0), (OTHER, at, 2.0)]
    return Timeline(
        samples=tuple(samples), cumulative=frozenset({COUNTER}), start_s=1000.0,
        incident_start_s=1300.0, end_s=1435.0, interval_s=15.0,
    )


def _series(timeline: Timeline, spec: SeriesSpec) -> list[tuple[float, float]]:
    return sorted((at, value) for s, at, value in timeline.samples if s == spec)


def test_short_history_keeps_only_the_last_minutes_before_the_incident() -> None:
    varied = short_history(_timeline(), keep_s=150)
    assert _series(varied, GAUGE)[0] == (1150.0, 1.0)
    assert len(_series(varied, GAUGE)) == 20
    assert _series(varied, COUNTER)[-1] == _series(_timeline(), COUNTER)[-1]
    assert varied.start_s == 1150.0 and varied.incident_start_s == 1300.0


def test_a_long_incident_repeats_gauges_and_keeps_counters_growing_at_the_incident_rate() -> None:
    varied = long_incident(_timeline(), incident_s=600)
    counter = _series(varied, COUNTER)
    assert varied.end_s == 1300.0 + 600 - 15
    assert counter[-1][0] == varied.end_s
    assert all(b[1] >= a[1] for a, b in itertools.pairwise(counter))
    # 10/s all through the incident, across the repetitions' seams too.
    incident = [p for p in counter if p[0] >= 1300.0]
    rates = {(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(incident)}
    assert rates == {10.0}
    assert {v for at, v in _series(varied, GAUGE) if at >= 1300.0} == {5.0}
    assert [at for at, _ in counter] == sorted({at for at, _ in counter})


@pytest.mark.parametrize("interval", [30, 60])
def test_downsampling_keeps_the_scrapes_on_the_coarser_grid(interval: int) -> None:
    varied = downsampled(_timeline(), interval)
    times = [at for at, _ in _series(varied, GAUGE)]
    assert times[0] == 1000.0 and {b - a for a, b in itertools.pairwise(times)} == {float(interval)}
    assert varied.interval_s == interval
    assert set(_series(varied, COUNTER)) <= set(_series(_timeline(), COUNTER))


def test_downsampling_to_an_interval_off_the_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        downsampled(_timeline(), 20)


def test_a_counter_reset_restarts_cumulative_series_from_zero_and_leaves_gauges() -> None:
    varied = counter_reset(_timeline(), at_s=1390.0)
    counter = dict(_series(varied, COUNTER))
    original = dict(_series(_timeline(), COUNTER))
    assert counter[1375.0] == original[1375.0]
    assert counter[1390.0] == original[1390.0] - original[1375.0] == 150.0
    assert counter[1435.0] - counter[1390.0] == original[1435.0] - original[1390.0]
    assert _series(varied, GAUGE) == _series(_timeline(), GAUGE)


def test_missing_scrapes_drop_one_in_five_of_the_chosen_target_only() -> None:
    varied = missing_scrapes(_timeline(), every=5, target=lambda spec: dict(spec.labels)["job"] == "a")
    assert len(_series(varied, GAUGE)) == 24 and len(_series(varied, COUNTER)) == 24
    assert len(_series(varied, OTHER)) == 30
    assert 1060.0 not in dict(_series(varied, GAUGE))


def test_relabelling_moves_every_series_and_its_cumulative_mark() -> None:
    varied = relabelled(_timeline(), job="a--copy")
    moved = SeriesSpec("requests_total", (("job", "a--copy"),))
    assert varied.cumulative == frozenset({moved})
    assert _series(varied, moved) == _series(_timeline(), COUNTER)


def test_every_variation_changes_a_recorded_bed_and_keeps_its_incident() -> None:
    recorded = incident_timeline(
        "postgres-exporter-max-connections", start_s=1_700_000_000, lead_in_s=900, incident_s=600,
        scrape_labels={"job": "postgres", "instance": "10.0.0.5:9187"},
    )
    for variation in VARIATIONS:
        varied = variation.transform(recorded)
        assert varied.incident_start_s == recorded.incident_start_s
        assert any(at > recorded.incident_start_s for _, at, _ in varied.samples)
        if variation.name != "recorded":
            assert varied.samples != recorded.samples, variation.name


def test_a_counter_reset_leaves_counts_kept_elsewhere() -> None:
    # A Kafka group's offsets are the broker's: restarting the exporter does not reset them.
    recorded = replace(_timeline(), kept_on_restart=frozenset({COUNTER}))
    assert counter_reset(recorded, at_s=1390.0).samples == recorded.samples
