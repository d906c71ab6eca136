"""Pure Elasticsearch analysis: hot threads text, node stats, slow log entries and shard sizing.

Nothing here does I/O over the network: :mod:`diagnoser.sources.elasticsearch` fetches, these
modules interpret, so every parser runs on recorded samples in tests.
"""

from __future__ import annotations

from diagnoser.elasticsearch.hot_threads import (
    HotThread,
    HotThreadsNode,
    StackSample,
    classify_thread,
    parse_hot_threads,
    pool_shares,
)
from diagnoser.elasticsearch.node_stats import GcRate, NodeStats, field_value, gc_rates, parse_node_stats
from diagnoser.elasticsearch.shards import ShardSizing, recommend_shard_count, shard_sizing
from diagnoser.elasticsearch.slowlog import (
    ANTI_PATTERN_FIXES,
    ANTI_PATTERNS,
    QueryAnalysis,
    ShapeStats,
    SlowlogEntry,
    SlowlogSummary,
    analyse_source,
    parse_slowlog_line,
    parse_slowlog_record,
    summarise_slowlog_files,
    summarise_slowlog_records,
)

__all__ = [
    "ANTI_PATTERNS",
    "ANTI_PATTERN_FIXES",
    "GcRate",
    "HotThread",
    "HotThreadsNode",
    "NodeStats",
    "QueryAnalysis",
    "ShapeStats",
    "ShardSizing",
    "SlowlogEntry",
    "SlowlogSummary",
    "StackSample",
    "analyse_source",
    "classify_thread",
    "field_value",
    "gc_rates",
    "parse_hot_threads",
    "parse_node_stats",
    "parse_slowlog_line",
    "parse_slowlog_record",
    "pool_shares",
    "recommend_shard_count",
    "shard_sizing",
    "summarise_slowlog_files",
    "summarise_slowlog_records",
]
