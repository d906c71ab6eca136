"""Slow log files: stream rotated and gzipped slow log files into a :class:`SlowlogSummary`.

Directories are expanded into their slow log files (``*slowlog*``, rotated ``.gz`` included);
each file is streamed line by line, entries outside the time window are counted and skipped, and
unreadable files are recorded in the summary (``OSError`` only when none could be read)::

    summary = summarise_slowlog_files([Path("/var/log/elasticsearch")], since=an_hour_ago)

:func:`summarise_slowlog_files` reads in this process. :func:`plan_slowlog_files` and
:func:`merge_chunks` let a caller spread the :class:`SlowlogChunk` work units of big logs over
worker processes (see :mod:`.slowlog_reading`).
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

from diagnoser.sources.elasticsearch.slowlog_entries import (
    SlowlogEntry,
    parse_slowlog_line,
    parse_slowlog_record,
)
from diagnoser.sources.elasticsearch.slowlog_summary import SlowlogSummary

__all__ = [
    "CHUNK_BYTES",
    "SlowlogChunk",
    "SlowlogPlan",
    "iter_slowlog_files",
    "merge_chunks",
    "plan_slowlog_files",
    "summarise_chunk",
    "summarise_slowlog_files",
    "summarise_slowlog_records",
]

#: Plain files above this size are split into chunks read by worker processes in parallel.
CHUNK_BYTES = 48 * 1024 * 1024


def iter_slowlog_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Expand directories into their slow log files (rotated and ``.gz`` included), files as given."""
    for path in paths:
        if path.is_dir():
            for child in sorted(path.iterdir()):
                if child.is_file() and "slowlog" in child.name:
                    yield child
        elif path.is_file():
            yield path


def _open_lines(path: Path) -> IO[bytes]:
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        # Rotated files are gzipped whatever their name says; the magic bytes decide.
        return cast(IO[bytes], gzip.open(path, "rb"))
    return path.open("rb")


_NO_UPPER_BOUND = "\uffff"


def _window_bounds(since: datetime | None, until: datetime | None) -> tuple[str, str]:
    # Timestamps are compared as text: ISO-8601 in UTC sorts like time, to the second.
    def text(moment: datetime | None, default: str) -> str:
        if moment is None:
            return default
        if moment.tzinfo is not None:
            moment = moment.astimezone(UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S")

    return text(since, ""), text(until, _NO_UPPER_BOUND)


def _in_window(entry: SlowlogEntry, low: str, high: str) -> bool:
    if not entry.timestamp or (not low and high == _NO_UPPER_BOUND):
        return True
    stamp = entry.timestamp[:19].replace(" ", "T")
    return low <= stamp <= high


def _read_chunk(
    path: Path, start: int, end: int | None, low: str, high: str, summary: SlowlogSummary
) -> None:
    """Count the lines that *start* in ``[start, end)`` of ``path`` (the whole file when ``end`` is None)."""
    with _open_lines(path) as handle:
        position = start
        if start > 0:
            # The line crossing ``start`` belongs to the previous chunk: skip to the next one.
            handle.seek(start - 1)
            position = start - 1 + len(handle.readline())
        limit = end if end is not None else float("inf")
        windowed = bool(low) or high != _NO_UPPER_BOUND
        lines = unparsed = outside = 0
        add = summary.add
        # The hot loop of a million-line log: locals, and counters written back once at the end.
        for line in handle:
            if position >= limit:
                break
            position += len(line)
            lines += 1
            entry = parse_slowlog_line(line)
            if entry is None:
                unparsed += 1
            elif not windowed or _in_window(entry, low, high):
                add(entry)
            else:
                outside += 1
        summary.lines += lines
        summary.unparsed_lines += unparsed
        summary.outside_window += outside


@dataclass(frozen=True)
class SlowlogChunk:
    """One unit of work: the lines starting in ``[start, end)`` of ``path`` (all of it if ``end`` is None)."""

    path: Path
    start: int
    end: int | None
    low: str
    high: str


def summarise_chunk(chunk: SlowlogChunk) -> SlowlogSummary:
    """Read one chunk (in this process or a worker): never raises, errors are recorded."""
    summary = SlowlogSummary()
    try:
        _read_chunk(chunk.path, chunk.start, chunk.end, chunk.low, chunk.high, summary)
        if chunk.start == 0:
            summary.files.append(str(chunk.path))
    except (OSError, EOFError, zlib.error) as exc:
        # A truncated rotated file (still being compressed) keeps the lines read before the error.
        summary.errors.append(f"{chunk.path}: {exc}")
    return summary


@dataclass(frozen=True)
class SlowlogPlan:
    """The slow log files found under some paths, cut into chunks, and how many bytes they hold."""

    files: list[Path]
    chunks: list[SlowlogChunk]
    total_bytes: int

    def processes(self, workers: int | None) -> int:
        """How many processes reading it is worth: one unless the log is big and splits.

        ``workers`` caps it (default: one per CPU, at most 4).
        """
        wanted = workers if workers is not None else min(4, os.cpu_count() or 1)
        if wanted > 1 and len(self.chunks) > 1 and self.total_bytes > CHUNK_BYTES:
            return min(wanted, len(self.chunks))
        return 1


def plan_slowlog_files(
    paths: Iterable[Path], *, since: datetime | None = None, until: datetime | None = None
) -> SlowlogPlan:
    """Find the slow log files under ``paths`` and cut big plain ones into :data:`CHUNK_BYTES` chunks."""
    low, high = _window_bounds(since, until)
    files = list(iter_slowlog_files(paths))
    chunks: list[SlowlogChunk] = []
    for path in files:
        try:
            size = path.stat().st_size
            with path.open("rb") as probe:
                gzipped = probe.read(2) == b"\x1f\x8b"
        except OSError:
            chunks.append(SlowlogChunk(path, 0, None, low, high))  # reading it will record the error
            continue
        if gzipped or size <= CHUNK_BYTES:
            chunks.append(SlowlogChunk(path, 0, None, low, high))
        else:
            chunks.extend(
                SlowlogChunk(path, start, start + CHUNK_BYTES, low, high)
                for start in range(0, size, CHUNK_BYTES)
            )
    return SlowlogPlan(files, chunks, sum(_size(path) for path in files))


def merge_chunks(
    plan: SlowlogPlan, results: Iterable[SlowlogSummary], summary: SlowlogSummary | None = None
) -> SlowlogSummary:
    """The chunks' summaries merged (into ``summary`` if given).

    Raises ``OSError`` when files were found and none of them could be read.
    """
    summary = summary if summary is not None else SlowlogSummary()
    read_before = len(summary.files)
    for result in results:
        summary.merge(result)
    if summary.errors and len(summary.files) == read_before and plan.files:
        raise OSError("; ".join(summary.errors))
    return summary


def summarise_slowlog_files(
    paths: Iterable[Path],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    summary: SlowlogSummary | None = None,
) -> SlowlogSummary:
    """Stream every slow log file under ``paths`` into a summary, in this process.

    ``since``/``until`` keep only entries in that window (entries without a timestamp are kept).
    Unreadable files are recorded in ``errors`` and skipped; raises ``OSError`` only when files
    were found and none could be read.
    """
    plan = plan_slowlog_files(paths, since=since, until=until)
    return merge_chunks(plan, (summarise_chunk(chunk) for chunk in plan.chunks), summary)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def summarise_slowlog_records(
    records: Iterable[Mapping[str, Any]],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> SlowlogSummary:
    """Summarise slow log documents already parsed as JSON (e.g. hits of a shipper's index)."""
    summary = SlowlogSummary()
    low, high = _window_bounds(since, until)
    for record in records:
        summary.lines += 1
        entry = parse_slowlog_record(record)
        if entry is None:
            summary.unparsed_lines += 1
        elif _in_window(entry, low, high):
            summary.add(entry)
        else:
            summary.outside_window += 1
    return summary
