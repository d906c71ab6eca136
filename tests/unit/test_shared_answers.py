"""The shared-answer cache: a run keeps every answer it asked, however many; after it, the resting size."""

from __future__ import annotations

import asyncio

from diagnoser.sources.base import SingleFlight


class _Asking:
    """Asks a cache for keys, recording which ones it had to start (answer each key with itself)."""

    def __init__(self, cache: SingleFlight) -> None:
        self.cache = cache
        self.started: list[int] = []

    async def ask(self, *keys: int) -> None:
        for key in keys:
            assert await self.cache.run(key, lambda key=key: self._start(key)) == key

    async def _start(self, key: int) -> int:
        self.started.append(key)
        return key


def test_a_run_holding_the_cache_asks_nothing_twice_past_the_resting_size() -> None:
    asking = _Asking(SingleFlight(max_entries=4))

    async def run() -> None:
        with asking.cache.holding():
            await asking.ask(*range(10))  # more questions than the resting size
            await asking.ask(*range(10))  # asked again within the run: shared
        await asking.ask(9, 6, 0)  # after the run, only the newest four are kept

    asyncio.run(run())
    assert asking.started == [*range(10), 0]


def test_without_a_run_the_oldest_answers_make_room() -> None:
    asking = _Asking(SingleFlight(max_entries=2))
    asyncio.run(asking.ask(1, 2, 3, 1))
    assert asking.started == [1, 2, 3, 1]


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
