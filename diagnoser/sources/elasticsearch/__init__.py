"""The Elasticsearch source and the pure parsers of what it reads.

:mod:`.source` holds :class:`ElasticsearchSource`, the only module that talks to a cluster (it
imports the ``elasticsearch`` client when it first connects, never at import time). The other
modules only interpret, so each runs on recorded samples in tests: :mod:`.hot_threads` (the text
of ``GET _nodes/hot_threads``), :mod:`.node_stats` (``GET _nodes/stats`` and rates between two
readings), :mod:`.shards` (shard sizing) and the slow log: :mod:`.slowlog_entries` (one line or
document to an entry), :mod:`.slowlog_queries` (a request body's shape and anti-patterns),
:mod:`.slowlog_summary` (entries grouped by shape), :mod:`.slowlog_files` (rotated and gzipped
files streamed into a summary) and :mod:`.slowlog_reading` (those files read under a deadline).
"""

from __future__ import annotations

from diagnoser.sources.elasticsearch.source import ElasticsearchSource

__all__ = ["ElasticsearchSource"]
