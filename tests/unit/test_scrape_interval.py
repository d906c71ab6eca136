"""The confirmation window's floor at a scrape interval (diagnoser/engine/scrape_interval.py)."""

from __future__ import annotations

import pytest

from diagnoser.engine.scrape_interval import PROBE_WINDOW_S, confirm_floor_s


@pytest.mark.parametrize(
    ("samples", "floor_s"),
    [
        (20, 120.0),  # 15 s: the default 2m, unchanged
        (21, 120.0),  # 15 s, both ends of the range holding a sample
        (19, 120.0),  # 15 s with a scrape missing from the count
        (10, 240.0),  # 30 s
        (11, 240.0),  # 30 s, both ends
        (5, 480.0),  # 60 s (capped at ${window} by with_scrape_floor)
    ],
)
def test_floor_holds_eight_scrapes(samples: int, floor_s: float) -> None:
    assert confirm_floor_s(PROBE_WINDOW_S / samples) == floor_s
