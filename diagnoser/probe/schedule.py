"""Intended send times of an open-loop schedule, as offsets in seconds from the start.

A schedule is a list of segments whose rate moves linearly. Both arrival processes come from
one idea: the cumulative expected count ``N(t)`` of a segment is inverted at targets ``k`` --
``0, 1, 2, ...`` for evenly spaced (uniform) arrivals, or the running sum of unit exponential
draws for Poisson arrivals (the time-rescaling theorem). The offsets depend only on the
schedule, never on the responses: that is what makes the load open-loop.

>>> from diagnoser.probe.spec import Segment
>>> list(arrival_offsets([Segment(start_rate=4, end_rate=4, duration_s=1)]))
[0.0, 0.25, 0.5, 0.75]
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import Literal

from diagnoser.probe.spec import Segment

__all__ = ["arrival_offsets"]


def _time_for_count(segment: Segment, count: float) -> float:
    """Seconds into ``segment`` at which its cumulative expected count reaches ``count``."""
    a = segment.start_rate
    slope = (segment.end_rate - a) / segment.duration_s
    if abs(slope) < 1e-12:
        return count / a
    # Solve slope/2 * t^2 + a * t = count for the root inside the segment.
    return (-a + math.sqrt(max(0.0, a * a + 2.0 * slope * count))) / slope


def arrival_offsets(
    segments: Sequence[Segment],
    arrivals: Literal["uniform", "poisson"] = "uniform",
    rng: random.Random | None = None,
) -> Iterator[float]:
    """Yield intended send offsets (seconds from the start), in increasing order."""
    poisson = arrivals == "poisson"
    draw = (rng or random.Random()).expovariate if poisson else None
    target = draw(1.0) if draw else 0.0
    base_time = 0.0
    base_count = 0.0
    for segment in segments:
        total = segment.expected_requests
        while target < base_count + total - 1e-9:
            yield base_time + _time_for_count(segment, target - base_count)
            target += draw(1.0) if draw else 1.0
        base_time += segment.duration_s
        base_count += total
