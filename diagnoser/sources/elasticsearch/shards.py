"""Shard sizing: is an index's primary shard size inside the 10 to 50 GB range, and what count fits.

Elastic's sizing guidance keeps primary shards between about 10 and 50 GB: much larger shards
recover and relocate slowly and make merges heavy; many small shards waste heap and per-shard
search overhead. The recommended count aims at the middle of the range::

    >>> recommend_shard_count(180 * GB)
    6
    >>> recommend_shard_count(3 * GB)
    1
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GB", "ShardSizing", "recommend_shard_count", "shard_sizing"]

GB = 1024**3


def recommend_shard_count(primary_bytes: float, *, target_gb: float = 30.0, max_gb: float = 50.0) -> int:
    """Primary shard count that puts each shard near ``target_gb`` and never above ``max_gb``."""
    if primary_bytes <= 0 or not math.isfinite(primary_bytes):
        return 1
    count = max(1, round(primary_bytes / (target_gb * GB)))
    # Rounding down can leave shards above the ceiling: add shards until they fit.
    while primary_bytes / count > max_gb * GB:
        count += 1
    return count


@dataclass(frozen=True)
class ShardSizing:
    """One index's primary shards measured against the range, with the recommended count."""

    index: str
    primaries: int
    primary_bytes: float
    average_shard_bytes: float
    largest_shard_bytes: float
    recommended_primaries: int
    problem: str  # "too_large", "too_small" or "" when inside the range

    @property
    def average_shard_gb(self) -> float:
        return self.average_shard_bytes / GB


def shard_sizing(
    index: str,
    primary_shard_bytes: list[float],
    *,
    min_gb: float = 10.0,
    max_gb: float = 50.0,
    target_gb: float = 30.0,
) -> ShardSizing:
    """Judge one index from the store sizes of its primary shards.

    Too small is only a problem when fewer shards would do: a 2 GB index with one shard is fine
    even though its shard is below ``min_gb``.
    """
    primaries = len(primary_shard_bytes)
    total = float(sum(primary_shard_bytes))
    average = total / primaries if primaries else 0.0
    largest = max(primary_shard_bytes, default=0.0)
    recommended = recommend_shard_count(total, target_gb=target_gb, max_gb=max_gb)
    problem = ""
    if primaries and largest > max_gb * GB:
        problem = "too_large"
    elif primaries > recommended and average < min_gb * GB:
        problem = "too_small"
    return ShardSizing(
        index=index,
        primaries=primaries,
        primary_bytes=total,
        average_shard_bytes=average,
        largest_shard_bytes=float(largest),
        recommended_primaries=recommended,
        problem=problem,
    )
