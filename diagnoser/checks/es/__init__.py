"""The Elasticsearch checks: one module per check, each registering the kind ``es.<check>``.

A rule condition names one with ``check:``, and the other keys are that check's parameters::

    - es: {check: hot_threads, groups: [merge, gc], min_share: 0.5}

=========================  =======================================================================
``check``                  holds for (one evidence row each)
=========================  =======================================================================
``hot_threads``            a node where one of ``groups`` (merge, gc, ...) takes ``min_share`` of
                           the hot-thread CPU and at least ``min_percent`` (100 = one core)
``heap``                   a node with heap used over ``max_heap_percent`` (and, with
                           ``require_gc_rising``, old-gen GC time above its lifetime rate)
``thread_pool_rejections`` a node and pool (search, write) whose ``rejected`` counter grew by
                           ``min_rejected`` or more between two readings ``sample_s`` apart
``expensive_query``        a slow log query shape with one of ``anti_patterns`` and at least
                           ``min_total_ms`` of slow time (files from ``elasticsearch.slowlog_paths``,
                           documents from ``elasticsearch.slowlog_index``)
``shard_sizing``           an index whose primary shards are outside ``min_shard_gb``..``max_shard_gb``
``fielddata_text``         a node holding ``min_fielddata_bytes`` or more fielddata on a ``text`` field
``node_stats``             a node whose ``field`` (dotted path in node stats, or node info with
                           ``api: info``; ``delta: true`` for growth between readings) compares
                           ``op`` ``threshold``
=========================  =======================================================================

Counters (GC, rejections) are read twice ``sample_s`` apart (see
:mod:`diagnoser.sources.elasticsearch.node_stats`); checks asking for the same interval share one
pair of readings. Every module here is found by the registry's package scan: adding a check is
adding a module.
"""
