"""``es: {check: expensive_query}``: slow log query shapes with a known anti-pattern and a high cost.

The source reads its slow log files (``elasticsearch.slowlog_paths``) and index
(``elasticsearch.slowlog_index``) into one summary of query shapes; this check holds for the
``top`` shapes, by total slow time, that show one of ``anti_patterns`` and spent at least
``min_total_ms``. ``window_minutes`` keeps only entries of that many minutes before the
evaluation instant (0: the whole log). Works without a cluster URL: slow log files alone suffice.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator

from diagnoser.checks.es.base import SOURCE, EsCheckParams, only_known
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.errors import SourceNotConfigured
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.elasticsearch.slowlog_queries import ANTI_PATTERN_FIXES, ANTI_PATTERNS
from diagnoser.sources.elasticsearch.slowlog_summary import ShapeStats

__all__ = ["ExpensiveQueryParams", "expensive_query"]


class ExpensiveQueryParams(EsCheckParams):
    check = "expensive_query"

    anti_patterns: list[str] = Field(default_factory=lambda: sorted(ANTI_PATTERNS))
    min_total_ms: float = Field(default=1000.0, ge=0)
    top: int = Field(default=5, ge=1, le=100)
    window_minutes: float = Field(default=0.0, ge=0)
    max_index_docs: int = Field(default=5000, ge=1, le=10_000)

    @field_validator("anti_patterns")
    @classmethod
    def _known_anti_patterns(cls, names: list[str]) -> list[str]:
        return only_known(names, sorted(ANTI_PATTERNS), "anti-pattern")


@check_kind("es.expensive_query", params=ExpensiveQueryParams, reads={"elasticsearch"})
async def expensive_query(params: ExpensiveQueryParams, ctx: CheckContext) -> CheckResult:
    """One row per costly shape with a wanted anti-pattern, the costliest first."""
    source = ctx.require(ctx.sources.elasticsearch, SOURCE)
    if not source.has_slowlog:
        raise SourceNotConfigured("elasticsearch slow log")
    windowed = params.window_minutes > 0
    read = await source.read_slowlog(
        since=ctx.at - timedelta(minutes=params.window_minutes) if windowed else None,
        until=ctx.at if windowed else None,
        max_index_docs=params.max_index_docs,
    )
    if isinstance(read, SourceError):
        return read
    wanted = set(params.anti_patterns)
    query = " + ".join(read.queries)
    evidence = []
    for shape in read.summary.slowest(len(read.summary.shapes), with_anti_patterns=True):
        found = sorted(shape.anti_patterns & wanted)
        if not found or shape.total_ms < params.min_total_ms:
            continue
        evidence.append(_evidence(shape, found, query, params))
        if len(evidence) >= params.top:
            break
    return evidence


def _evidence(shape: ShapeStats, found: list[str], query: str, params: ExpensiveQueryParams) -> Evidence:
    return Evidence(
        source=SOURCE,
        query=query,
        labels={
            "index": shape.index,
            "shape_id": shape.shape_id,
            "anti_patterns": ",".join(found),
            "shape": shape.shape[:300],
            "fix": "; ".join(ANTI_PATTERN_FIXES[name] for name in found),
        },
        value=shape.total_ms,
        threshold=params.min_total_ms,
        detail=(
            f"{shape.count} slow search(es) on {shape.index} with shape {shape.shape_id} took "
            f"{shape.total_ms / 1000:.1f} s in total (max {shape.max_ms / 1000:.1f} s, mean "
            f"{shape.mean_ms / 1000:.1f} s): "
            + "; ".join(f"{name}: {ANTI_PATTERNS[name]}" for name in found)
            + f". Example: {shape.example[:300]}"
        ),
    )
