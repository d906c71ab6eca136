"""Slow log files read under a deadline: worker processes give the same summary and stop when cancelled."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from diagnoser.sources.elasticsearch import slowlog_files
from diagnoser.sources.elasticsearch.slowlog_files import plan_slowlog_files, summarise_slowlog_files
from diagnoser.sources.elasticsearch.slowlog_reading import read_slowlog_files
from diagnoser.sources.elasticsearch.slowlog_summary import SlowlogSummary
from tests.fixtures.es_server import FIXTURES


@pytest.fixture
def big_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 4 MB search slow log that counts as big: 64 KiB chunks instead of writing 48 MB ones."""
    monkeypatch.setattr(slowlog_files, "CHUNK_BYTES", 64 * 1024)
    lines = (FIXTURES / "slowlog" / "prod-search_index_search_slowlog.json").read_bytes()
    path = tmp_path / "prod-search_index_search_slowlog.json"
    path.write_bytes(lines * 150)
    assert plan_slowlog_files([path]).processes(2) == 2  # the worker-process path, not the thread
    return path


def _figures(summary: SlowlogSummary) -> tuple[object, ...]:
    shapes = {key: (s.count, s.total_ms, s.max_ms, sorted(s.anti_patterns)) for key, s in summary.shapes.items()}
    return summary.lines, summary.entries, summary.unparsed_lines, summary.files, shapes


async def _until(condition: Callable[[], object], timeout_s: float = 20.0) -> None:
    """Wait until ``condition()`` holds, at most ``timeout_s``; the caller asserts it then."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(0.02)


async def test_worker_processes_give_the_same_summary(big_log: Path) -> None:
    in_processes = await read_slowlog_files([big_log], workers=2)
    assert _figures(in_processes) == _figures(summarise_slowlog_files([big_log]))
    assert in_processes.entries > 0
    await _until(lambda: not multiprocessing.active_children())
    assert multiprocessing.active_children() == []


async def test_cancelled_reading_stops_its_workers(big_log: Path) -> None:
    task = asyncio.create_task(read_slowlog_files([big_log], workers=2))
    await _until(multiprocessing.active_children)
    workers = multiprocessing.active_children()
    assert workers, "the workers never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Killed, not waited for: a worker that finished its share would otherwise wait for more.
    await _until(lambda: not multiprocessing.active_children())
    assert multiprocessing.active_children() == []
    assert [worker.exitcode for worker in workers] == [-signal.SIGTERM] * len(workers)


async def test_small_log_is_read_in_this_process(es_fixtures: Path) -> None:
    path = es_fixtures / "slowlog" / "prod-search_index_search_slowlog.json"
    summary = await read_slowlog_files([path])
    assert _figures(summary) == _figures(summarise_slowlog_files([path]))
    assert multiprocessing.active_children() == []


async def test_unreadable_files_raise_like_the_in_process_reader(tmp_path: Path) -> None:
    (tmp_path / "x_index_search_slowlog.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(OSError, match="x_index_search_slowlog"):
        await read_slowlog_files([tmp_path])


def test_importing_the_source_package_does_not_load_the_client() -> None:
    code = (
        "import sys, diagnoser.models, diagnoser.sources.elasticsearch, diagnoser.checks.es.heap; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('elasticsearch', 'elastic_transport')))"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]"
