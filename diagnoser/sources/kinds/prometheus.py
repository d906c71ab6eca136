"""Prometheus (or any PromQL backend), built when ``prometheus.url`` is set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diagnoser.sources.registry import SourceSettings, source_kind

if TYPE_CHECKING:
    from diagnoser.sources.kubernetes.credentials import Credentials
    from diagnoser.sources.prometheus import PrometheusSource


@source_kind("prometheus", configured=lambda s: bool(s.prometheus.url), plain_errors=(ValueError, OSError))
def build(sources: SourceSettings, credentials: Credentials | None) -> PrometheusSource:
    from diagnoser.sources.prometheus import PrometheusSource

    return PrometheusSource(sources.prometheus, metric_overrides=dict(sources.metrics))
