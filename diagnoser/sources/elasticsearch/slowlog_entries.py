"""Slow log entries: one :class:`SlowlogEntry` from a JSON record, a JSON line or a plain-text line.

Entries come from Elasticsearch's JSON log files (``<cluster>_index_search_slowlog.json``, rotated
``...-2024-03-01-1.json.gz``), from the older plain-text lines of 6.x/7.x, or from documents a log
shipper wrote to an index (flat ECS keys, nested objects or a mix). Every format becomes a
:class:`SlowlogEntry`; a line that is not a slow log event gives ``None``, never an exception::

    entry = parse_slowlog_line(line)
    if entry is not None:
        print(entry.index, entry.took_ms, entry.source)

Query-shape analysis is in :mod:`.slowlog_queries`, grouping in :mod:`.slowlog_summary` and file
reading in :mod:`.slowlog_files`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from diagnoser.sources.elasticsearch.hot_threads import parse_time_value_ms

__all__ = ["SlowlogEntry", "parse_json", "parse_slowlog_line", "parse_slowlog_record"]


def parse_json(text: str | bytes) -> Any:
    """Parse with orjson (about three times faster on a slow log line), falling back to the
    standard parser for what orjson refuses (``NaN``, for one)."""
    try:
        return orjson.loads(text)
    except (ValueError, RecursionError):
        return json.loads(text)


_INDEX_MESSAGE = re.compile(r"^\[(?P<index>[^\]/]+)(?:/[^\]]*)?\](?:\[(?P<shard>\d+)\])?")
_TOTAL_HITS = re.compile(r"^\s*(\d+)")
# The plain-text layout of 6.x/7.x log4j files:
# [2019-01-01T10:00:00,000][WARN ][index.search.slowlog.query] [n1] [logs][0] took[1.2s], took_millis[1200]...
_PLAIN_LINE = re.compile(
    r"^\[(?P<ts>[^\]]+)\]\[\s*\w+\s*\]\[index\.(?P<kind>search|indexing)\.slowlog\.(?P<phase>\w+)[^\]]*\]\s*"
    r"\[(?P<node>[^\]]*)\]\s*(?P<message>\[[^\]]+\](?:\[\d+\])?)\s*took\[(?P<took>[^\]]*)\],\s*"
    r"took_millis\[(?P<ms>\d+)\](?P<rest>.*)$"
)
_PLAIN_HITS = re.compile(r"total_hits\[(?P<hits>[^\]]*)\]")
# The source ends at "], id[" when an id follows (7.x), else at the last "]" of the line.
_PLAIN_SOURCE = re.compile(r"source\[(?P<source>.*?)\], id\[|source\[(?P<last>.*)\]")


@dataclass(slots=True)
class SlowlogEntry:
    """One slow log event, whatever format it came in (not frozen: frozen init is slower)."""

    kind: str  # "search" or "indexing"
    index: str
    took_ms: float
    source: str
    shard: int | None = None
    total_hits: int | None = None
    node: str = ""
    timestamp: str = ""
    phase: str = ""  # query, fetch, index


def _lookup(record: Mapping[str, Any], dotted: str) -> Any:
    """A field by its dotted name: flat ECS keys (``"a.b.c": 1``) or nested objects, or a mix."""
    if dotted in record:
        return record[dotted]
    head, _, tail = dotted.partition(".")
    while tail:
        sub = record.get(head)
        if isinstance(sub, Mapping):
            found = _lookup(sub, tail)
            if found is not None:
                return found
        more, _, tail = tail.partition(".")
        head = f"{head}.{more}"
    return None


def _first(record: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = _lookup(record, name)
        if value is not None:
            return value
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _hits(value: Any) -> int | None:
    """``"123 hits"`` or ``"10000+ hits"`` -> the number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        head = value.lstrip().partition(" ")[0].rstrip("+")
        if head.isdigit():
            return int(head)
        match = _TOTAL_HITS.match(value)
        if match:
            return int(match.group(1))
    return None


def _kind_of(record: Mapping[str, Any]) -> str | None:
    for name in ("event.dataset", "type", "log.logger", "fileset.name", "logger"):
        value = _lookup(record, name)
        if isinstance(value, str):
            # Not a bare "search" test: "elasticsearch" itself contains it.
            if "search_slowlog" in value or "search.slowlog" in value:
                return "search"
            if "indexing_slowlog" in value or "indexing.slowlog" in value:
                return "indexing"
    return None


def _parse_flat_ecs(record: Mapping[str, Any]) -> SlowlogEntry | None:
    """Fast path for the ES 8 file layout, where every field is a flat dotted key."""
    dataset = record.get("event.dataset")
    if dataset == "elasticsearch.index_search_slowlog":
        kind = "search"
    elif dataset == "elasticsearch.index_indexing_slowlog":
        kind = "indexing"
    else:
        return None
    message = record.get("elasticsearch.slowlog.message")
    if not isinstance(message, str) or message[:1] != "[" or message[-1:] != "]":
        return None
    # "[index][shard]" for searches, "[index/uuid]" for indexing: string slicing, no regex.
    index, _, shard = message[1:-1].partition("][")
    index = index.partition("/")[0]
    took = _as_float(record.get("elasticsearch.slowlog.took_millis"))
    source = record.get("elasticsearch.slowlog.source")
    node = record.get("elasticsearch.node.name")
    logger = record.get("log.logger")
    timestamp = record.get("@timestamp")
    # Positional: keyword calls cost measurably at a million lines.
    return SlowlogEntry(
        kind,
        index,
        took if took is not None else 0.0,
        source if isinstance(source, str) else "",
        int(shard) if shard.isdigit() else None,
        _hits(record.get("elasticsearch.slowlog.total_hits")),
        node if isinstance(node, str) else "",
        timestamp if isinstance(timestamp, str) else "",
        logger.rsplit(".", 1)[-1] if isinstance(logger, str) and logger.count(".") == 3 else "",
    )


def parse_slowlog_record(record: Mapping[str, Any]) -> SlowlogEntry | None:
    """Read one JSON slow log event (8.x ECS keys, 7.x keys, or a shipper's nested document).

    Returns ``None`` for a record that is not a slow log event.
    """
    if "elasticsearch.slowlog.took_millis" in record:
        entry = _parse_flat_ecs(record)
        if entry is not None:
            return entry
    kind = _kind_of(record)
    if kind is None:
        return None
    message = _first(record, "elasticsearch.slowlog.message", "message")
    index, shard = "", None
    if isinstance(message, str):
        match = _INDEX_MESSAGE.match(message)
        if match:
            index = match.group("index")
            shard = int(match.group("shard")) if match.group("shard") else None
    if not index:
        named = _first(record, "elasticsearch.index.name", "index")
        index = named if isinstance(named, str) else "unknown"
    took = _as_float(_first(record, "elasticsearch.slowlog.took_millis", "took_millis"))
    if took is None:
        took_text = _first(record, "elasticsearch.slowlog.took", "took")
        took = parse_time_value_ms(took_text) if isinstance(took_text, str) else None
    if took is None:
        # A shipper that parsed the event may keep only event.duration, in nanoseconds.
        duration = _as_float(_first(record, "event.duration"))
        took = duration / 1e6 if duration is not None else 0.0
    source = _first(record, "elasticsearch.slowlog.source", "source")
    if isinstance(source, Mapping):
        source = json.dumps(source, separators=(",", ":"))
    node = _first(record, "elasticsearch.node.name", "node.name")
    logger = _first(record, "log.logger")
    phase = ""
    if isinstance(logger, str):
        phase = logger.split(".")[3] if logger.count(".") >= 3 else ""
    timestamp = _first(record, "@timestamp", "timestamp")
    return SlowlogEntry(
        kind=kind,
        index=index,
        took_ms=took,
        source=source if isinstance(source, str) else "",
        shard=shard,
        total_hits=_hits(_first(record, "elasticsearch.slowlog.total_hits", "total_hits")),
        node=node if isinstance(node, str) else "",
        timestamp=timestamp if isinstance(timestamp, str) else "",
        phase=phase,
    )


def _parse_plain_line(line: str) -> SlowlogEntry | None:
    match = _PLAIN_LINE.match(line)
    if match is None:
        return None
    index_match = _INDEX_MESSAGE.match(match.group("message"))
    rest = match.group("rest")
    hits = _PLAIN_HITS.search(rest)
    source = _PLAIN_SOURCE.search(rest)
    return SlowlogEntry(
        kind=match.group("kind"),
        index=index_match.group("index") if index_match else "unknown",
        shard=int(index_match.group("shard")) if index_match and index_match.group("shard") else None,
        took_ms=float(match.group("ms")),
        source=(source.group("source") or source.group("last") or "") if source else "",
        total_hits=_hits(hits.group("hits")) if hits else None,
        node=match.group("node"),
        timestamp=match.group("ts"),
        phase=match.group("phase"),
    )


def parse_slowlog_line(line: str | bytes) -> SlowlogEntry | None:
    """Parse one log line (JSON or the older plain-text layout); ``None`` if it is not a slow log entry."""
    stripped = line.strip()
    if not stripped:
        return None
    if stripped[:1] in (b"{", "{"):
        try:
            # The parser takes bytes as they come off the file: no separate decode pass.
            record = parse_json(stripped)
        except (ValueError, RecursionError):
            return None
        return parse_slowlog_record(record) if isinstance(record, dict) else None
    if isinstance(stripped, bytes):
        stripped = stripped.decode("utf-8", errors="replace")
    return _parse_plain_line(stripped)

