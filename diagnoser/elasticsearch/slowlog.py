"""Slow log analysis: read search and indexing slow log entries, find query anti-patterns, group shapes.

Entries come from Elasticsearch's JSON log files (``<cluster>_index_search_slowlog.json``, rotated
``...-2024-03-01-1.json.gz``), from the older plain-text lines, or from documents a log shipper
wrote to an index. Every format is turned into a :class:`SlowlogEntry`; a search entry's
``source`` (the request body) is parsed, its literal values are replaced by ``?`` to get the
query *shape*, and the request is checked for the anti-patterns that make searches expensive::

    summary = summarise_slowlog_files([Path("/var/log/elasticsearch")])
    for shape in summary.slowest(5, with_anti_patterns=True):
        print(shape.index, shape.count, shape.total_ms, sorted(shape.anti_patterns), shape.shape)

Files are streamed line by line and shapes are capped at :data:`MAX_SHAPES`, so memory stays
bounded however long the log is.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import multiprocessing
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, NamedTuple, cast

__all__ = [
    "ANTI_PATTERNS",
    "ANTI_PATTERN_FIXES",
    "MAX_SHAPES",
    "QueryAnalysis",
    "ShapeStats",
    "SlowlogEntry",
    "SlowlogSummary",
    "analyse_source",
    "iter_slowlog_files",
    "parse_slowlog_line",
    "parse_slowlog_record",
    "summarise_slowlog_files",
    "summarise_slowlog_records",
]

#: Anti-patterns :func:`analyse_source` can flag, with the reason each one costs.
ANTI_PATTERNS: dict[str, str] = {
    "deep_pagination": "from + size beyond 10,000: every shard collects and sorts from + size hits",
    "leading_wildcard": "a wildcard or query_string term starting with * or ? scans the term dictionary",
    "regexp": "regexp queries walk the term dictionary through an automaton",
    "script": "a script in the query or sort runs per matching document",
    "scoring_query_context": "exact-match clauses (term, range...) scored; in a filter they would be cached",
    "track_total_hits": "track_total_hits: true counts every match on a large result set",
    "unfiltered_source": "whole _source returned: no _source filtering on a request that returns hits",
    "highlight": "highlighting re-analyses the returned text fields",
}

#: What to do about each anti-pattern, for recommendations.
ANTI_PATTERN_FIXES: dict[str, str] = {
    "deep_pagination": "page with search_after and a point in time instead of from/size",
    "leading_wildcard": "index an n-gram, reversed or wildcard-type field instead of *prefix searches",
    "regexp": "replace the regexp with terms on a keyword or n-gram field",
    "script": "compute the scripted value at index time and query or sort on that field",
    "scoring_query_context": "move exact-match clauses (term, terms, range, exists) into bool.filter",
    "track_total_hits": "set track_total_hits to false or a bound such as 10000",
    "unfiltered_source": "return only the needed fields with _source includes or fields",
    "highlight": "drop highlight where it is not shown, or limit it to one short field",
}

#: Plain files above this size are split into chunks read by worker processes in parallel.
CHUNK_BYTES = 48 * 1024 * 1024


def _fast_json_loads() -> Callable[[str | bytes], Any]:
    # orjson parses a slow log line about three times faster than the standard library; it is
    # optional, so the analysis works (more slowly) without it.
    try:
        module = importlib.import_module("orjson")
    except ImportError:
        return json.loads
    loads: Callable[[str | bytes], Any] = module.loads
    return loads


_loads = _fast_json_loads()


def _parse_json(text: str | bytes) -> Any:
    """Parse with the fast parser, falling back to the standard one (huge integers, NaN)."""
    try:
        return _loads(text)
    except (ValueError, RecursionError):
        if _loads is json.loads:
            raise
        return json.loads(text)


#: Distinct (index, kind, shape) groups kept; later new shapes are counted in ``overflow``.
MAX_SHAPES = 10_000
#: The window within which Elasticsearch allows ``from + size`` (``index.max_result_window``).
MAX_RESULT_WINDOW = 10_000
_EXAMPLE_CHARS = 2_000
_MAX_NODES_PER_SHAPE = 16

_INDEX_MESSAGE = re.compile(r"^\[(?P<index>[^\]/]+)(?:/[^\]]*)?\](?:\[(?P<shard>\d+)\])?")
_TOTAL_HITS = re.compile(r"^\s*(\d+)")
_TIME_VALUE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>nanos|micros|ms|s|m|h|d)$")
_TIME_UNIT_MS = {"nanos": 1e-6, "micros": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6, "d": 8.64e7}
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
_TERM_LEVEL = frozenset({"term", "terms", "range", "exists", "ids", "prefix", "terms_set"})


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


class QueryAnalysis(NamedTuple):
    """A request body reduced to its shape, and the anti-patterns found in it."""

    shape: str
    anti_patterns: frozenset[str]
    parsed: bool = True
    #: The request body as JSON text (the log's extra escaping undone), ``None`` when unparsed.
    request: str | None = None


@dataclass(slots=True)
class ShapeStats:
    """Every slow entry of one query shape on one index."""

    index: str
    kind: str
    shape: str
    count: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0
    anti_patterns: set[str] = field(default_factory=set)
    example: str = ""
    nodes: set[str] = field(default_factory=set)
    first_seen: str = ""
    last_seen: str = ""

    @property
    def shape_id(self) -> str:
        """A short stable id of the shape, for labels and for grepping a report."""
        return hashlib.blake2b(f"{self.kind}\0{self.shape}".encode(), digest_size=4).hexdigest()

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.count if self.count else 0.0


@dataclass
class SlowlogSummary:
    """The result of reading slow log entries: shapes with counts and time, and what was skipped."""

    lines: int = 0
    entries: int = 0
    unparsed_lines: int = 0
    outside_window: int = 0
    overflow_entries: int = 0
    files: list[str] = field(default_factory=list)
    #: Files that could not be read (fully), with the reason; what was read before still counts.
    errors: list[str] = field(default_factory=list)
    shapes: dict[tuple[str, str, str], ShapeStats] = field(default_factory=dict)

    def add(self, entry: SlowlogEntry) -> None:
        """Count one entry into its shape group."""
        self.entries += 1
        if entry.kind == "search":
            analysis = analyse_source(entry.source, total_hits=entry.total_hits)
        else:
            # Indexing entries carry a document, not a query: one group per index is what helps.
            analysis = QueryAnalysis(shape="(document)", anti_patterns=frozenset())
        key = (entry.index, entry.kind, analysis.shape)
        stats = self.shapes.get(key)
        if stats is None:
            if len(self.shapes) >= MAX_SHAPES:
                self.overflow_entries += 1
                return
            # The example is the readable body, not the log's doubly escaped text.
            example = analysis.request if analysis.request is not None else entry.source
            stats = ShapeStats(
                index=entry.index,
                kind=entry.kind,
                shape=analysis.shape,
                example=example[:_EXAMPLE_CHARS],
                first_seen=entry.timestamp,
            )
            self.shapes[key] = stats
        stats.count += 1
        stats.total_ms += entry.took_ms
        if entry.took_ms > stats.max_ms:
            stats.max_ms = entry.took_ms
        if analysis.anti_patterns:
            stats.anti_patterns.update(analysis.anti_patterns)
        if entry.node and len(stats.nodes) < _MAX_NODES_PER_SHAPE:
            stats.nodes.add(entry.node)
        if entry.timestamp:
            if not stats.first_seen or entry.timestamp < stats.first_seen:
                stats.first_seen = entry.timestamp
            if entry.timestamp > stats.last_seen:
                stats.last_seen = entry.timestamp

    def merge(self, other: SlowlogSummary) -> None:
        """Add another summary's counts (a worker's share of the files) into this one."""
        self.lines += other.lines
        self.entries += other.entries
        self.unparsed_lines += other.unparsed_lines
        self.outside_window += other.outside_window
        self.overflow_entries += other.overflow_entries
        self.files.extend(other.files)
        self.errors.extend(other.errors)
        for key, theirs in other.shapes.items():
            mine = self.shapes.get(key)
            if mine is None:
                if len(self.shapes) >= MAX_SHAPES:
                    self.overflow_entries += theirs.count
                    continue
                self.shapes[key] = theirs
                continue
            mine.count += theirs.count
            mine.total_ms += theirs.total_ms
            mine.max_ms = max(mine.max_ms, theirs.max_ms)
            mine.anti_patterns |= theirs.anti_patterns
            mine.nodes |= set(list(theirs.nodes)[: max(0, _MAX_NODES_PER_SHAPE - len(mine.nodes))])
            if theirs.first_seen and (not mine.first_seen or theirs.first_seen < mine.first_seen):
                mine.first_seen = theirs.first_seen
            if theirs.last_seen > mine.last_seen:
                mine.last_seen = theirs.last_seen

    def slowest(
        self, limit: int = 10, *, with_anti_patterns: bool = False, kind: str | None = "search"
    ) -> list[ShapeStats]:
        """The shapes with the most total slow time, optionally only those with an anti-pattern."""
        shapes = [
            s
            for s in self.shapes.values()
            if (kind is None or s.kind == kind) and (not with_anti_patterns or s.anti_patterns)
        ]
        shapes.sort(key=lambda s: (-s.total_ms, -s.count, s.index, s.shape))
        return shapes[: max(0, limit)]


# ----------------------------------------------------------------------------------------------
# Entries


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


def _time_value_ms(text: str) -> float | None:
    match = _TIME_VALUE.match(text.strip())
    if match is None:
        return None
    return float(match.group("num")) * _TIME_UNIT_MS[match.group("unit")]


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
        took = _time_value_ms(took_text) if isinstance(took_text, str) else None
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
            record = _parse_json(stripped)
        except (ValueError, RecursionError):
            return None
        return parse_slowlog_record(record) if isinstance(record, dict) else None
    if isinstance(stripped, bytes):
        stripped = stripped.decode("utf-8", errors="replace")
    return _parse_plain_line(stripped)


# ----------------------------------------------------------------------------------------------
# Query analysis
#
# The shape is made from the request text with three regex passes (C speed) rather than by
# rebuilding the parsed tree in Python: Elasticsearch serialises a search source
# deterministically, so equal structures give equal text once literals are replaced. The parsed
# tree is walked only along query clauses, to find anti-patterns.

# Each pattern starts at a token boundary (after a key's colon, or after "[" or ","), so a match
# can never pair the closing quote of one string with the opening quote of the next.
_KEYED_STRING = re.compile(r'("(?:[^"\\]|\\.)*"\s*:\s*)"(?:[^"\\]|\\.)*"')
_LISTED_STRING = re.compile(r'(?<=[\[,])(\s*)"(?:[^"\\]|\\.)*"(?!\s*:)')
_SCALAR_VALUE = re.compile(r"(?<=[:\[,])\s*(?:-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)(?=\s*[,\]}])")
_REPEATED = re.compile(r'\[\s*"\?"(?:\s*,\s*"\?")+\s*\]')
_QS_REGEXP = re.compile(r"(^|[\s:(])/[^/]+/")
_QS_TOKENS = re.compile(r"[\s()]+")
_SCORING_CLAUSES = ("must", "should")
_NESTING = ("nested", "has_child", "has_parent", "boosting", "dis_max")
_NESTED_QUERIES = ("query", "queries", "positive", "negative")


def _decode_source(source: str) -> tuple[Any, str]:
    """The request body as JSON and as JSON text; ``(None, "")`` when it does not parse.

    The ES 8 JSON layout escapes the body a second time (``{\\"query\\":...}``): the quick undo
    is a replace, checked by parsing; the exact double decode is the fallback.
    """
    text = source.strip()
    if not text:
        return None, ""
    candidates = [text.replace('\\"', '"'), text] if text.startswith('{\\"') else [text]
    for candidate in candidates:
        try:
            return _parse_json(candidate), candidate
        except (ValueError, RecursionError):
            continue
    if '\\"' in text:
        try:
            unescaped = json.loads('"' + text + '"')
            return json.loads(unescaped), unescaped
        except (ValueError, RecursionError, TypeError):
            pass
    return None, ""


# Keys with the brackets they open: equal skeletons mean equal shapes (Elasticsearch writes keys
# in a fixed order; lists of literals collapse in the shape anyway), so the costlier
# value-replacing passes run once per skeleton. The pattern starts with a literal quote, which
# the regex engine scans for quickly: about 6 us a body where keys and all brackets took 14.
_SKELETON = re.compile(r'"[^"\\]*":[{\[]*')
_SHAPE_CACHE: dict[str, str] = {}
_SHAPE_CACHE_SIZE = 4096


def _shape_of(text: str) -> str:
    skeleton = "".join(_SKELETON.findall(text))
    shape = _SHAPE_CACHE.get(skeleton)
    if shape is None:
        shape = _normalise_literals(text)
        if len(_SHAPE_CACHE) >= _SHAPE_CACHE_SIZE:
            _SHAPE_CACHE.clear()
        _SHAPE_CACHE[skeleton] = shape
    return shape


def _normalise_literals(text: str) -> str:
    shape = _KEYED_STRING.sub(r'\1"?"', text)
    shape = _LISTED_STRING.sub(r'\1"?"', shape)
    shape = _SCALAR_VALUE.sub('"?"', shape)
    # Lists of literals (terms, fields, ids) are one shape whatever their length.
    return _REPEATED.sub('["?"]', shape)


class _Walk:
    """One pass over the query clauses of a request body, collecting anti-patterns."""

    __slots__ = ("flags",)

    def __init__(self) -> None:
        self.flags: set[str] = set()

    def query(self, node: Any, scoring: bool) -> None:
        """Visit a query clause; ``scoring`` is false inside filter, must_not and constant_score."""
        if isinstance(node, list):
            for item in node:
                self.query(item, scoring)
            return
        if not isinstance(node, dict):
            return
        for key, body in node.items():
            if key == "bool" and isinstance(body, dict):
                for clause, sub in body.items():
                    if clause in _SCORING_CLAUSES:
                        self.query(sub, scoring)
                    elif clause in ("filter", "must_not"):
                        self.query(sub, False)
            elif key == "constant_score" and isinstance(body, dict):
                self.query(body.get("filter"), False)
            elif key in ("script", "script_score"):
                self.flags.add("script")
                if key == "script_score" and isinstance(body, dict):
                    self.query(body.get("query"), scoring)
            elif key == "function_score" and isinstance(body, dict):
                self.function_score(body, scoring)
            elif key in _NESTING and isinstance(body, dict):
                for nested_key in _NESTED_QUERIES:
                    if nested_key in body:
                        self.query(body[nested_key], scoring)
            elif key == "wildcard":
                if self.leading_wildcard_term(body):
                    self.flags.add("leading_wildcard")
            elif key == "regexp":
                self.flags.add("regexp")
            elif key in ("query_string", "simple_query_string"):
                self.query_string(body)
            elif scoring and key in _TERM_LEVEL:
                self.flags.add("scoring_query_context")

    def function_score(self, body: dict[str, Any], scoring: bool) -> None:
        self.query(body.get("query"), scoring)
        if "script_score" in body:
            self.flags.add("script")
        functions = body.get("functions")
        if isinstance(functions, list) and any(
            isinstance(f, dict) and "script_score" in f for f in functions
        ):
            self.flags.add("script")

    @staticmethod
    def leading_wildcard_term(body: Any) -> bool:
        if not isinstance(body, dict):
            return False
        for spec in body.values():
            pattern = spec
            if isinstance(spec, dict):
                pattern = spec.get("value", spec.get("wildcard"))
            if isinstance(pattern, str) and pattern[:1] in ("*", "?"):
                return True
        return False

    def query_string(self, body: Any) -> None:
        if not isinstance(body, dict):
            return
        text = body.get("query")
        if not isinstance(text, str):
            return
        if body.get("allow_leading_wildcard", True) is not False:
            for token in _QS_TOKENS.split(text):
                term = token.split(":", 1)[1] if ":" in token and not token.startswith("\\") else token
                if term.lstrip("+-!")[:1] in ("*", "?"):
                    self.flags.add("leading_wildcard")
                    break
        if _QS_REGEXP.search(text):
            self.flags.add("regexp")

    def request(self, body: dict[str, Any], total_hits: int | None) -> None:
        self.query(body.get("query"), True)
        self.query(body.get("post_filter"), False)
        sort = body.get("sort")
        if sort is not None:
            keys = sort if isinstance(sort, list) else [sort]
            if any(isinstance(key, dict) and "_script" in key for key in keys):
                self.flags.add("script")
        if "script_fields" in body:
            self.flags.add("script")
        size = body.get("size", 10)
        start = body.get("from", 0)
        if isinstance(size, int) and isinstance(start, int) and start + size > MAX_RESULT_WINDOW:
            self.flags.add("deep_pagination")
        # A large result set is what makes exact counting expensive; unknown counts are flagged.
        if body.get("track_total_hits") is True and (total_hits is None or total_hits >= MAX_RESULT_WINDOW):
            self.flags.add("track_total_hits")
        source_filter = body.get("_source", True)
        if source_filter is True and size != 0 and "stored_fields" not in body:
            self.flags.add("unfiltered_source")
        if "highlight" in body:
            self.flags.add("highlight")


# The search slow log is written per shard: one slow search on a five-shard index is up to five
# lines with the same body. Analyses are kept by body text, in a bounded table.
_ANALYSIS_CACHE: dict[tuple[str, bool], QueryAnalysis] = {}
_ANALYSIS_CACHE_SIZE = 8192


def analyse_source(source: str, *, total_hits: int | None = None) -> QueryAnalysis:
    """Reduce a search request body to its shape (literals replaced by ``?``) and its anti-patterns."""
    # Only "large result set or unknown" matters to the analysis (track_total_hits), not the count.
    key = (source, total_hits is None or total_hits >= MAX_RESULT_WINDOW)
    cached = _ANALYSIS_CACHE.get(key)
    if cached is not None:
        return cached
    analysis = _analyse(source, total_hits)
    if len(_ANALYSIS_CACHE) >= _ANALYSIS_CACHE_SIZE:
        _ANALYSIS_CACHE.clear()
    _ANALYSIS_CACHE[key] = analysis
    return analysis


def _analyse(source: str, total_hits: int | None) -> QueryAnalysis:
    body, text = _decode_source(source)
    if not isinstance(body, dict):
        return QueryAnalysis(shape="(unparsed)", anti_patterns=frozenset(), parsed=False)
    walk = _Walk()
    try:
        walk.request(body, total_hits)
    except RecursionError:
        return QueryAnalysis(shape="(too deep)", anti_patterns=frozenset(), parsed=False)
    if '": ' in text or ', "' in text:
        # Elasticsearch writes compact JSON; other writers (shippers, hand-made logs) are made
        # compact too, so the shape passes see one layout.
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return QueryAnalysis(shape=_shape_of(text), anti_patterns=frozenset(walk.flags), request=text)


# ----------------------------------------------------------------------------------------------
# Files and summaries


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


def _summarise_chunk(path: Path, start: int, end: int | None, low: str, high: str) -> SlowlogSummary:
    """One unit of work (in this process or a worker): never raises, errors are recorded."""
    summary = SlowlogSummary()
    try:
        _read_chunk(path, start, end, low, high, summary)
        if start == 0:
            summary.files.append(str(path))
    except (OSError, EOFError, zlib.error) as exc:
        # A truncated rotated file (still being compressed) keeps the lines read before the error.
        summary.errors.append(f"{path}: {exc}")
    return summary


def _chunks(files: list[Path]) -> list[tuple[Path, int, int | None]]:
    work: list[tuple[Path, int, int | None]] = []
    for path in files:
        try:
            size = path.stat().st_size
            with path.open("rb") as probe:
                gzipped = probe.read(2) == b"\x1f\x8b"
        except OSError:
            work.append((path, 0, None))  # reading it will record the error
            continue
        if gzipped or size <= CHUNK_BYTES:
            work.append((path, 0, None))
        else:
            bounds = list(range(0, size, CHUNK_BYTES))
            work.extend((path, b, b + CHUNK_BYTES) for b in bounds)
    return work


def summarise_slowlog_files(
    paths: Iterable[Path],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    summary: SlowlogSummary | None = None,
    workers: int | None = None,
) -> SlowlogSummary:
    """Stream every slow log file under ``paths`` into a summary; unreadable files are skipped.

    ``since``/``until`` keep only entries in that window (entries without a timestamp are kept).
    Logs bigger than :data:`CHUNK_BYTES` are read by ``workers`` processes in parallel (default:
    one per CPU, at most 4), each streaming its own files or byte ranges; ``workers=1`` keeps
    everything in this process. Raises ``OSError`` only when files were found and none could be
    read.
    """
    summary = summary if summary is not None else SlowlogSummary()
    low, high = _window_bounds(since, until)
    files = list(iter_slowlog_files(paths))
    work = _chunks(files)
    if workers is None:
        workers = min(4, os.cpu_count() or 1)
    results: Iterable[SlowlogSummary]
    if workers > 1 and len(work) > 1 and sum(_size(p) for p in files) > CHUNK_BYTES:
        # "spawn": the caller may run threads (an event loop, HTTP clients) that fork would copy.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(work)), mp_context=context) as pool:
            results = list(
                pool.map(
                    _summarise_chunk,
                    [w[0] for w in work],
                    [w[1] for w in work],
                    [w[2] for w in work],
                    [low] * len(work),
                    [high] * len(work),
                )
            )
    else:
        results = (_summarise_chunk(path, start, end, low, high) for path, start, end in work)
    read_before = len(summary.files)
    for result in results:
        summary.merge(result)
    if summary.errors and len(summary.files) == read_before and files:
        raise OSError("; ".join(summary.errors))
    return summary


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
