"""Elasticsearch, built when cluster URLs or slow log files are configured."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diagnoser.sources.registry import SourceSettings, source_kind

if TYPE_CHECKING:
    from diagnoser.sources.elasticsearch import ElasticsearchSource
    from diagnoser.sources.kubernetes.credentials import Credentials


@source_kind(
    "elasticsearch", configured=lambda s: bool(s.elasticsearch.urls or s.elasticsearch.slowlog_paths)
)
def build(sources: SourceSettings, credentials: Credentials | None) -> ElasticsearchSource | None:
    from diagnoser.sources.elasticsearch import ElasticsearchSource  # the client loads only when used

    return ElasticsearchSource.from_settings(sources.elasticsearch)
