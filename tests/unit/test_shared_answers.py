"""The shared-answer cache: a run keeps every answer it asked, however many; after it, the resting size."""

from __future__ import annotations

import asyncio

from diagnoser.sources.base import SingleFlight


def test_a_run_holding_the_cache_asks_nothing_twice_past_the_resting_size() -> None:
    cache = SingleFlight(max_entries=4)
    calls: list[int] = []

    async def start_for(key: int) -> int:
        calls.append(key)
        return key

    async def run() -> None:
        with cache.holding():
            for key in range(10):  # more questions than the resting size
                await cache.run(key, lambda key=key: start_for(key))
            for key in range(10):  # asked again within the run: shared
                assert await cache.run(key, lambda key=key: start_for(key)) == key
        # After the run, only the newest four are kept.
        for key in (9, 6, 0):
            await cache.run(key, lambda key=key: start_for(key))

    asyncio.run(run())
    assert calls == [*range(10), 0]


def test_without_a_run_the_oldest_answers_make_room() -> None:
    cache = SingleFlight(max_entries=2)
    calls: list[int] = []

    async def start_for(key: int) -> int:
        calls.append(key)
        return key

    async def run() -> None:
        for key in (1, 2, 3, 1):
            await cache.run(key, lambda key=key: start_for(key))

    asyncio.run(run())
    assert calls == [1, 2, 3, 1]


def test_an_answer_whose_time_to_live_passed_is_asked_again() -> None:
    cache = SingleFlight(ttl_s=0.0)
    calls: list[int] = []

    async def start() -> int:
        calls.append(1)
        return 1

    async def run() -> None:
        await cache.run("k", start)
        await asyncio.sleep(0.01)
        await cache.run("k", start)

    asyncio.run(run())
    assert calls == [1, 1]
