"""Slow log summary: entries grouped by index, kind and query shape, with counts, time and anti-patterns.

:class:`SlowlogSummary` takes entries one by one (:meth:`SlowlogSummary.add`) or another summary
(:meth:`SlowlogSummary.merge`, a worker's share of the files) and answers the slowest shapes.
Shapes are capped at :data:`MAX_SHAPES`, so memory stays bounded however long the log is::

    summary = SlowlogSummary()
    for entry in entries:
        summary.add(entry)
    for shape in summary.slowest(5, with_anti_patterns=True):
        print(shape.index, shape.count, shape.total_ms, sorted(shape.anti_patterns), shape.shape)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from diagnoser.sources.elasticsearch.slowlog_entries import SlowlogEntry
from diagnoser.sources.elasticsearch.slowlog_queries import QueryAnalysis, analyse_source

__all__ = ["MAX_SHAPES", "ShapeStats", "SlowlogSummary"]

#: Distinct (index, kind, shape) groups kept; later new shapes are counted in ``overflow``.
MAX_SHAPES = 10_000
_EXAMPLE_CHARS = 2_000
_MAX_NODES_PER_SHAPE = 16


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
