"""Read-only sources of evidence. Each answers with data or a SourceError value, never a raw exception."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["Sources"]


@dataclass
class Sources:
    """The sources one evaluation may use; ``None`` means not configured (rules needing it are skipped).

    ``elasticsearch`` is an ``ElasticsearchSource``, ``kubernetes`` a ``KubernetesSource`` and
    ``probe`` the last ``ProbeResult``; they are typed loosely here so this module imports none
    of their client libraries.
    """

    prometheus: PrometheusSource | None = None
    elasticsearch: Any | None = None
    kubernetes: Any | None = None
    probe: Any | None = None
