from __future__ import annotations

import pytest

from diagnoser.testing.series import NotationError, expand_values, parse_series, to_openmetrics


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0+10x3", [0, 10, 20, 30]),
        ("1x3", [1, 1, 1, 1]),
        ("5-2x2", [5, 3, 1]),
        ("_x3", [None, None, None]),
        ("1 _ stale 4", [1, None, None, 4]),
        ("1e3 -1.5", [1000, -1.5]),
        ("0.5+0.25x2", [0.5, 0.75, 1.0]),
    ],
)
def test_expand_values_like_promtool(text: str, expected: list[float | None]) -> None:
    assert expand_values(text) == expected


@pytest.mark.parametrize("text", ["1+x3", "abc", "1x", "0+1x3x4"])
def test_bad_values_are_errors(text: str) -> None:
    with pytest.raises(NotationError):
        expand_values(text)


def test_parse_series_labels_and_escapes() -> None:
    spec = parse_series('http_requests_total{job="api", path="/a\\"b", le="+Inf"}')
    assert spec.name == "http_requests_total"
    assert dict(spec.labels) == {"job": "api", "path": '/a"b', "le": "+Inf"}
    with pytest.raises(NotationError):
        parse_series('x{job=api}')


def test_openmetrics_groups_families_and_orders_samples() -> None:
    a = parse_series('m{x="1"}')
    b = parse_series("n")
    text = to_openmetrics([(a, 30, 2.0), (b, 0, 1.0), (a, 0, 1.0)])
    assert text.splitlines() == ['m{x="1"} 1.0 0.000', 'm{x="1"} 2.0 30.000', "n 1.0 0.000", "# EOF"]
