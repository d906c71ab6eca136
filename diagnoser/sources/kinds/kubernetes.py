"""The Kubernetes API, built when ``kubernetes.enabled``, over the run's credentials."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diagnoser.sources.registry import SourceSettings, source_kind

if TYPE_CHECKING:
    from diagnoser.sources.kubernetes import KubernetesSource
    from diagnoser.sources.kubernetes.credentials import Credentials


@source_kind("kubernetes", configured=lambda s: s.kubernetes.enabled)
def build(sources: SourceSettings, credentials: Credentials | None) -> KubernetesSource:
    from diagnoser.sources.kubernetes import KubernetesSource  # the client loads only when used

    return KubernetesSource.from_settings(sources.kubernetes, credentials=credentials)
