"""The one number formatter: what a person reads, never scientific notation."""

from __future__ import annotations

import math

import pytest

from diagnoser.models import Evidence
from diagnoser.notify.incident_render import duration_text
from diagnoser.notify.slack import number
from diagnoser.numbers import format_measure, format_number
from diagnoser.ruleset.templating import format_text


@pytest.mark.parametrize(
    ("value", "digits", "text"),
    [
        (17923.4, 3, "17,923"),
        (17900.0, 3, "17,900"),
        (2_450_000.0, 3, "2.45M"),
        (3.2e9, 3, "3.2G"),
        (0.000123, 3, "0.000123"),
        (139.46, 4, "139.5"),
        (999.96, 3, "1,000"),
        (0.0, 3, "0"),
        (-0.5, 3, "-0.5"),
        (1.0, 3, "1"),
        (math.nan, 3, "not measured"),
        (math.inf, 3, "unbounded"),
    ],
)
def test_format_number(value: float, digits: int, text: str) -> None:
    assert format_number(value, digits) == text


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.973, "ratio", "97.3 %"),
        (0.00001, "ratio", "0.001 %"),
        (0.2286, "s", "228.6 ms"),
        (17.9, "s", "17.9 s"),
        (600.0, "s", "10 min"),
        (1.5 * 2**30, "bytes", "1.5 GiB"),
        (17923.0, "/s", "17,923/s"),
        (12_345_678.0, "", "12.35M"),
        (0.00012, "/s", "0.00012/s"),
    ],
)
def test_format_measure(value: float, unit: str, text: str) -> None:
    assert format_measure(value, unit) == text


@pytest.mark.parametrize("value", [17923.0, 1.2e7, 0.0000123, 4.5e-7, 123456789.0])
def test_no_renderer_writes_scientific_notation(value: float) -> None:
    texts = [
        number(value),
        duration_text(value),
        format_text("{x:.3g} {x:g} {x:.2g}", {"x": value}),
        Evidence(source="prometheus", query="up", name="queue_length", value=value, threshold=value).text,
    ]
    for text in texts:
        assert "e+" not in text and "e-" not in text, text


def test_a_g_template_keeps_its_significant_digits() -> None:
    assert format_text("{x:.3g} req/s", {"x": 17923.0}) == "17,923 req/s"
    assert format_text("{x:.2g}", {"x": 0.0000123}) == "0.000012"
    assert format_text("{x:.3g}", {"x": 12.34}) == "12.3"
