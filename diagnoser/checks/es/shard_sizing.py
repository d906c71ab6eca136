"""``es: {check: shard_sizing}``: indices whose primary shards are far too large or too small.

Reads ``GET _cat/shards`` in bytes, sums the started primaries per index (hidden ``.`` indices
only with ``include_hidden``) and holds for each index whose average primary is above
``max_shard_gb`` or below ``min_shard_gb`` (``problems`` picks which), with the primary count
that would bring shards near ``target_shard_gb``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from diagnoser.checks.es.base import SOURCE, EsCheckParams, api_source
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.elasticsearch.shards import GB, ShardSizing, shard_sizing

__all__ = ["ShardSizingParams", "shard_sizing_check"]

SizingProblem = Literal["too_large", "too_small"]
_SIZING_PROBLEMS: tuple[SizingProblem, ...] = ("too_large", "too_small")


class ShardSizingParams(EsCheckParams):
    check = "shard_sizing"

    min_shard_gb: float = Field(default=10.0, gt=0)
    max_shard_gb: float = Field(default=50.0, gt=0)
    target_shard_gb: float = Field(default=30.0, gt=0)
    problems: list[SizingProblem] = Field(default_factory=lambda: list(_SIZING_PROBLEMS))
    include_hidden: bool = False

    @model_validator(mode="after")
    def _ordered_bounds(self) -> ShardSizingParams:
        if not self.min_shard_gb <= self.target_shard_gb <= self.max_shard_gb:
            raise ValueError("need min_shard_gb <= target_shard_gb <= max_shard_gb")
        return self


@check_kind("es.shard_sizing", params=ShardSizingParams, reads={"elasticsearch"})
async def shard_sizing_check(params: ShardSizingParams, ctx: CheckContext) -> CheckResult:
    """One row per index whose primaries are outside the bounds."""
    rows = await api_source(ctx).cat_shards()
    if isinstance(rows, SourceError):
        return rows
    primaries = _primary_sizes(rows, include_hidden=params.include_hidden)
    evidence = []
    for index in sorted(primaries):
        sizing = shard_sizing(
            index,
            primaries[index],
            min_gb=params.min_shard_gb,
            max_gb=params.max_shard_gb,
            target_gb=params.target_shard_gb,
        )
        if sizing.problem and sizing.problem in params.problems:
            evidence.append(_evidence(index, sizing, params))
    return evidence


def _primary_sizes(rows: list[dict[str, Any]], *, include_hidden: bool) -> dict[str, list[float]]:
    """Bytes of each started primary shard, by index."""
    primaries: dict[str, list[float]] = {}
    for row in rows:
        if row.get("prirep") != "p" or row.get("state") != "STARTED":
            continue
        index = str(row.get("index", ""))
        if not index or (index.startswith(".") and not include_hidden):
            continue
        try:
            size = float(row.get("store") or 0)
        except (TypeError, ValueError):
            continue
        primaries.setdefault(index, []).append(size)
    return primaries


def _evidence(index: str, sizing: ShardSizing, params: ShardSizingParams) -> Evidence:
    bound = params.max_shard_gb if sizing.problem == "too_large" else params.min_shard_gb
    per_shard = sizing.primary_bytes / sizing.recommended_primaries / GB
    return Evidence(
        source=SOURCE,
        query="GET _cat/shards?bytes=b",
        labels={
            "index": index,
            "problem": sizing.problem,
            "primaries": str(sizing.primaries),
            "recommended_primaries": str(sizing.recommended_primaries),
        },
        value=sizing.average_shard_gb,
        threshold=bound,
        detail=(
            f"{index}: {sizing.primaries} primary shard(s) averaging "
            f"{sizing.average_shard_gb:.1f} GiB (largest {sizing.largest_shard_bytes / GB:.1f} GiB, "
            f"{sizing.primary_bytes / GB:.1f} GiB in total); {sizing.recommended_primaries} "
            f"primaries would be about {per_shard:.1f} GiB each"
        ),
    )
