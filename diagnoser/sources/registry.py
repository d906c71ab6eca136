"""Source kinds, registered by decorator as check kinds and receivers are.

A source kind says when the configuration asks for it and how to build its client from the
source sections (:class:`SourceSettings`). Each lives in one small module of
:mod:`diagnoser.sources.kinds`, imported the first time the kinds are listed; the module imports
its client only when it builds one, so listing the kinds loads no HTTP or Kubernetes client::

    @source_kind("elasticsearch", configured=lambda s: bool(s.elasticsearch.urls))
    def build(sources: SourceSettings, credentials: Credentials | None) -> ElasticsearchSource | None:
        from diagnoser.sources.elasticsearch import ElasticsearchSource

        return ElasticsearchSource.from_settings(sources.elasticsearch)

:func:`~diagnoser.engine.run.build_sources` builds every configured kind, in the order of
:data:`~diagnoser.sources.base.SourceName`; the probe is not built (its result is handed in).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, get_args

from diagnoser.config.sections import ElasticsearchSettings, KubernetesSettings, PrometheusSettings
from diagnoser.sources.base import SourceName

if TYPE_CHECKING:
    from diagnoser.config.settings import Settings
    from diagnoser.sources.kubernetes.credentials import Credentials

__all__ = ["SourceKind", "SourceSettings", "source_kind", "source_kinds"]


@dataclass(frozen=True)
class SourceSettings:
    """The sources a run builds: each one's section, and the metric renames Prometheus applies."""

    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    elasticsearch: ElasticsearchSettings = field(default_factory=ElasticsearchSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    metrics: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> SourceSettings:
        return cls(settings.prometheus, settings.elasticsearch, settings.kubernetes, dict(settings.metrics))

    def configured(self) -> list[SourceName]:
        """The kinds these sections ask for, in report order."""
        return [kind.name for kind in source_kinds().values() if kind.configured(self)]


#: Builds a kind's client; ``credentials`` are the run's Kubernetes credentials, if loaded.
Build = Callable[[SourceSettings, "Credentials | None"], Any]


@dataclass(frozen=True)
class SourceKind:
    name: SourceName
    configured: Callable[[SourceSettings], bool]
    build: Build
    #: Failures to set up reported by their message alone (a malformed URL); any other is
    #: reported with its type too.
    plain_errors: tuple[type[Exception], ...] = ()


_KINDS: dict[str, SourceKind] = {}


def source_kind(
    name: SourceName,
    *,
    configured: Callable[[SourceSettings], bool],
    plain_errors: tuple[type[Exception], ...] = (),
) -> Callable[[Build], Build]:
    """Register ``build`` as the source ``name``, built when ``configured`` says so."""
    if name not in get_args(SourceName):
        raise ValueError(f"source {name!r} is not a SourceName (add it there and to Sources)")

    def register(build: Build) -> Build:
        if name in _KINDS and _KINDS[name].build is not build:
            raise ValueError(f"source kind {name!r} registered twice")
        _KINDS[name] = SourceKind(name, configured, build, plain_errors)
        return build

    return register


@functools.cache
def source_kinds() -> Mapping[str, SourceKind]:
    """Every registered kind, in the order of ``SourceName`` (the kinds' modules imported once)."""
    import diagnoser.sources.kinds as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    order = list(get_args(SourceName))
    return {name: _KINDS[name] for name in sorted(_KINDS, key=order.index)}
