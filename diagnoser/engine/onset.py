"""Onsets: the instant a finding's signal left its baseline, found from the series themselves.

A rule that declares ``onset:`` asks, for each finding, since when its first condition has held
for the finding's labels. The engine evaluates that condition again at earlier instants (the
check kind does not matter: a ``signal``, a ``resource`` or a ``promql`` condition reads the past
as well as the present, ``diagnose now --at`` being the same thing) and keeps the start of the
run of instants at which it held without a break::

    now ──────────────── holds ───────────────┐
    at - 1, 2, 4, 8 ... steps: the first instant it did not hold bounds the onset; then halving
    the interval between that and the last instant it held, down to one step.

That is one evaluation per doubling back and one per halving (about 20 for a day at one
minute), all of one rule's findings at once, and only for a rule that holds: a healthy run pays
nothing. The result serves three ends: "since HH:MM" in the finding's text, ``Finding.since``
(from which the daemon counts how long an incident has been pending), and the instant just before
the onset, at which a rule reads its baseline (``at: before_onset`` evidence): the nearest earlier
window that was healthy, whatever the length of the history or of the incident.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

T = TypeVar("T")

__all__ = ["Onset", "find_onsets"]

#: The rows a condition answered at an instant; ``None`` when it could not be told (the source
#: failed there).
Rows = Sequence[T] | None


@dataclass(frozen=True)
class Onset:
    """When a finding's condition began to hold, to within one step."""

    #: The first instant of the unbroken run at which it held.
    since: datetime
    #: The last instant before it at which it did not: where its baseline is read.
    before: datetime


async def find_onsets(
    rows_at: Callable[[datetime], Awaitable[Rows[T]]],
    subjects: Sequence[Callable[[Sequence[T]], bool]],
    at: datetime,
    lookback_s: float,
    resolution_s: float,
) -> list[Onset | None]:
    """The onset of each of ``subjects``, looking back at most ``lookback_s`` from ``at`` in steps
    of ``resolution_s``; ``None`` for one whose condition held over the whole lookback (its onset
    is older) or that could not be told (the source failed at some instant).

    ``rows_at(instant)`` evaluates the condition at ``instant``; a subject (a finding) says whether
    those rows show it holding (a row with its labels, above its own threshold).
    """
    steps = max(1, math.floor(lookback_s / resolution_s))
    answers: dict[int, Rows[T]] = {}

    async def ask(offsets: set[int]) -> None:
        wanted = sorted(offsets - answers.keys())
        found = await asyncio.gather(*(rows_at(at - timedelta(seconds=k * resolution_s)) for k in wanted))
        answers.update(zip(wanted, found, strict=True))

    def held(subject: Callable[[Sequence[T]], bool], offset: int) -> bool | None:
        rows = answers[offset]
        return None if rows is None else subject(rows)

    ladder = sorted({min(2**power, steps) for power in range(steps.bit_length() + 1)})
    await ask(set(ladder))
    # Per subject: the furthest offset known to hold, and the nearest known not to (None: none).
    bounds: list[tuple[int, int] | None] = []
    for subject in subjects:
        last_held, found = 0, None
        for offset in ladder:
            holding = held(subject, offset)
            if holding is None:
                break
            if not holding:
                found = (last_held, offset)
                break
            last_held = offset
        bounds.append(found)
    while True:
        middles = {(lo + hi) // 2 for b in bounds if b is not None for lo, hi in [b] if hi - lo > 1}
        if not middles:
            break
        await ask(middles)
        for index, subject in enumerate(subjects):
            bound = bounds[index]
            if bound is None or bound[1] - bound[0] <= 1:
                continue
            lo, hi = bound
            middle = (lo + hi) // 2
            holding = held(subject, middle)
            bounds[index] = None if holding is None else (middle, hi) if holding else (lo, middle)
    return [
        None
        if bound is None
        else Onset(
            since=at - timedelta(seconds=bound[0] * resolution_s),
            before=at - timedelta(seconds=bound[1] * resolution_s),
        )
        for bound in bounds
    ]
