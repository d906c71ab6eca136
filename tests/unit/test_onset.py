"""The onset search: the start of the unbroken run at which a condition held, to within one step."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from diagnoser.engine.onset import find_onsets

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STEP_S = 60.0
DAY_S = 86_400.0


def _search(held_since: dict[str, datetime | None], gaps: Sequence[datetime] = ()) -> list[object]:
    """Each subject holds from its instant on (``None``: throughout); ``gaps`` fail to answer."""
    asked: list[datetime] = []

    async def rows_at(instant: datetime) -> list[str] | None:
        asked.append(instant)
        if instant in gaps:
            return None
        return [name for name, since in held_since.items() if since is None or instant >= since]

    def holding(name: str) -> object:
        return lambda rows: name in rows

    onsets = asyncio.run(find_onsets(rows_at, [holding(n) for n in held_since], AT, DAY_S, STEP_S))
    # Doubling back over a day (12 instants), then halving each subject's interval (11 at most).
    assert len(asked) <= 12 + 11 * len(held_since), len(asked)
    return list(onsets)


def test_each_onset_is_found_to_the_step_and_its_baseline_just_before() -> None:
    since = {"a": AT - timedelta(minutes=37), "b": AT - timedelta(hours=5, minutes=3)}
    found = _search(since)
    for (name, expected), onset in zip(since.items(), found, strict=True):
        assert onset is not None, name
        assert onset.since == expected, (name, onset)
        assert onset.before == expected - timedelta(seconds=STEP_S), (name, onset)


def test_a_condition_held_over_the_whole_lookback_has_no_onset() -> None:
    assert _search({"a": None}) == [None]


def test_an_instant_the_source_could_not_answer_leaves_the_onset_untold() -> None:
    since = AT - timedelta(minutes=100)
    assert _search({"a": since}, gaps=[AT - timedelta(minutes=64)]) == [None]
