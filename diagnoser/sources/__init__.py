"""Read-only sources of evidence. Each answers with data or a SourceError value, never a raw exception.

:mod:`diagnoser.sources.base` holds what they share; each source lives in its own module and
imports its client library only when it is used. :mod:`diagnoser.sources.registry` lists the
kinds a run builds, each registered by one module of :mod:`diagnoser.sources.kinds`.
"""

from __future__ import annotations

from diagnoser.sources.base import SourceName, Sources

__all__ = ["SourceName", "Sources"]
