"""Schedules, probe definition files and validators, without the network."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from diagnoser.config import ProbeSettings
from diagnoser.errors import ConfigError, ProbeSafetyError
from diagnoser.probe import build_spec, enforce_safety, load_probe_file, spec_from_url
from diagnoser.probe.schedule import arrival_offsets
from diagnoser.probe.spec import Expectations, ProbeSpec, Segment
from diagnoser.probe.validate import check_response, has_no_values, parse_json_path

REPO = Path(__file__).resolve().parents[2]


def test_constant_rate_spaces_requests_evenly() -> None:
    offsets = list(arrival_offsets([Segment(start_rate=200, end_rate=200, duration_s=2)]))
    assert len(offsets) == 400
    assert offsets[:3] == pytest.approx([0.0, 0.005, 0.010])
    assert offsets[-1] == pytest.approx(1.995)


def test_steps_hold_each_rate_for_its_duration() -> None:
    spec = ProbeSpec.model_validate(
        {
            "target": "http://h/",
            "schedule": {
                "kind": "steps",
                "steps": [{"rate": 10, "duration_s": 1}, {"rate": 100, "duration_s": 1}],
            },
        }
    )
    offsets = list(arrival_offsets(spec.schedule.segments()))
    assert len(offsets) == 110
    assert sum(1 for t in offsets if t < 1) == 10
    assert spec.peak_rate == 100
    assert spec.duration_s == 2


def test_a_ramp_sends_its_integral_with_shrinking_gaps() -> None:
    offsets = list(arrival_offsets([Segment(start_rate=0, end_rate=100, duration_s=10)]))
    assert len(offsets) == 500
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert gaps[10] > gaps[100] > gaps[400]
    # Half the requests come in the last 30 % of a linear ramp from zero.
    assert offsets[250] == pytest.approx(10 * (0.5**0.5), rel=0.01)


def test_poisson_arrivals_keep_the_mean_rate_and_are_repeatable() -> None:
    segment = [Segment(start_rate=500, end_rate=500, duration_s=20)]
    first = list(arrival_offsets(segment, "poisson", random.Random(7)))
    again = list(arrival_offsets(segment, "poisson", random.Random(7)))
    assert first == again
    assert 9700 <= len(first) <= 10300
    gaps = sorted(b - a for a, b in itertools.pairwise(first))
    # Exponential gaps: the median is ln(2) times the mean, unlike evenly spaced ones.
    assert gaps[len(gaps) // 2] == pytest.approx(0.002 * 0.693, rel=0.08)


def test_cli_ramp_then_hold() -> None:
    spec = spec_from_url("http://h/", rate=100, duration_s=10, ramp_s=4)
    segments = spec.schedule.segments()
    assert [(s.start_rate, s.end_rate, s.duration_s) for s in segments] == [(1.0, 100, 4), (100, 100, 6)]
    with pytest.raises(ConfigError, match="--ramp"):
        spec_from_url("http://h/", rate=100, duration_s=10, ramp_s=20)


def test_the_example_probe_file_loads() -> None:
    spec = load_probe_file(REPO / "probes" / "example.yaml")
    assert spec.name == "example"
    assert spec.host == "127.0.0.1"
    assert spec.expect.json_path == "$.features"


def test_a_probe_file_with_an_unknown_key_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "target: http://h/\nschedule: {rate: 5, duration_s: 1, burst: 3}\nexpect: {jsonpath: $.a}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_probe_file(path)
    message = str(caught.value)
    assert str(path) in message
    assert "schedule.constant.burst: Extra inputs are not permitted" in message
    assert "expect.jsonpath: Extra inputs are not permitted" in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("target: ftp://h/\nschedule: {rate: 1, duration_s: 1}\n", "http:// or https://"),
        ("target: http://h/\nschedule: {rate: -1, duration_s: 1}\n", "schedule.constant.rate"),
        ("target: http://h/\nschedule: {kind: wave, rate: 1}\n", "does not match any of the expected tags"),
        (
            "target: http://h/\nschedule: {rate: 1, duration_s: 1}\nexpect: {json_path: features}\n",
            "must start with '$'",
        ),
        ("target: http://h/\nbody: a\nbodies: [b]\nschedule: {rate: 1, duration_s: 1}\n", "only one of body"),
        ("- just a list\n", "must be a mapping"),
    ],
)
def test_invalid_probe_files_are_refused_clearly(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as caught:
        load_probe_file(path)
    assert fragment in str(caught.value)


def test_build_spec_knows_urls_from_files(tmp_path: Path) -> None:
    spec, explicit = build_spec("http://127.0.0.1:1/x", rate=3, duration_s=2)
    assert explicit
    assert spec.peak_rate == 3
    assert spec.duration_s == 2
    path = tmp_path / "f.yaml"
    path.write_text("target: https://api.example.com/x\nschedule: {rate: 50, duration_s: 60}\n")
    spec, explicit = build_spec(str(path), rate=2)
    assert not explicit
    assert spec.peak_rate == 2
    assert spec.duration_s == 60
    with pytest.raises(ConfigError, match="neither an http"):
        build_spec(str(tmp_path / "missing.yaml"))


def test_timeout_over_the_config_is_refused() -> None:
    spec = ProbeSpec.model_validate(
        {"target": "http://h/", "timeout_s": 30, "schedule": {"rate": 1, "duration_s": 1}}
    )
    with pytest.raises(ProbeSafetyError, match="timeout 30 s exceeds"):
        enforce_safety(spec, ProbeSettings(), explicit_target=True)


def test_json_paths() -> None:
    assert parse_json_path("$.a.b[2]['odd key'].c") == ["a", "b", 2, "odd key", "c"]
    with pytest.raises(ValueError, match="cannot parse"):
        parse_json_path("$.a..b")


@pytest.mark.parametrize(
    ("value", "empty"),
    [({}, True), ([], True), (None, True), ({"features": {}}, True), ({"a": [[], {}]}, True),
     ({"items": [], "total": 0}, False), ({"a": 1}, False), ("x", False), (0, False), (False, False)],
)  # fmt: skip
def test_what_counts_as_empty_json(value: object, empty: bool) -> None:
    assert has_no_values(value) is empty


@pytest.mark.parametrize(
    ("expect", "status", "body", "length", "kind"),
    [
        ({}, 200, b'{"a": 1}', None, None),
        ({}, 503, b'{"a": 1}', None, "status"),
        ({"status": [200, 503]}, 503, b'{"a": 1}', None, None),
        ({}, 200, b"", None, "empty_body"),
        ({"non_empty_body": False}, 200, b"", None, None),
        ({}, 200, b"{}", None, "empty_json"),
        ({}, 200, b"[]", None, "empty_json"),
        ({}, 200, b"not json but fine", None, None),
        ({}, 200, b'{"a": 1}', 50, "truncated"),
        ({"json_path": "$.features"}, 200, b'{"features": {"x": 1}}', None, None),
        ({"json_path": "$.features"}, 200, b'{"other": 1}', None, "missing_path"),
        (
            {"json_path": "$.features", "non_empty_json": False},
            200,
            b'{"features": []}',
            None,
            "missing_path",
        ),
        ({"json_path": "$.features"}, 200, b"<html>", None, "missing_path"),
    ],
)
def test_check_response(
    expect: dict[str, object], status: int, body: bytes, length: int | None, kind: str | None
) -> None:
    model = Expectations.model_validate(expect)
    path = parse_json_path(model.json_path) if model.json_path else None
    got = check_response(
        model, path, status=status, content_type="application/json" if body[:1] in b"{[" else None,
        content_length=length, body=body,
    )  # fmt: skip
    assert got == kind


def test_public_surface_and_registration() -> None:
    import diagnoser.probe
    from diagnoser.checks import check_kinds

    for name in diagnoser.probe.__all__:
        assert hasattr(diagnoser.probe, name), name
    kind = check_kinds()["probe"]
    assert kind.reads == ("probe",)
