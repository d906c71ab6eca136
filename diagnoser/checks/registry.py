"""Check kinds: the Python behind the conditions rules write in YAML.

A check kind is one module that registers a coroutine with :func:`check_kind`::

    class HotThreadsParams(BaseModel):
        model_config = ConfigDict(extra="forbid")
        pool: str
        min_share: float = 0.5

    @check_kind("es_hot_threads_demo", params=HotThreadsParams, reads={"elasticsearch"})
    async def hot_threads(params: HotThreadsParams, ctx: CheckContext) -> CheckResult:
        es = ctx.require(ctx.sources.elasticsearch, "elasticsearch")
        ...
        return [Evidence(source="elasticsearch", query="GET _nodes/hot_threads", ...)]

A rule condition ``- es_hot_threads_demo: {pool: merge}`` is then validated against
``HotThreadsParams`` when the rule file loads. A check sees only its :class:`CheckContext` (the
instant, the sources, the signal catalogue and the rules' window), never the whole
configuration. A check returns the evidence rows that hold (an empty list means the condition
does not hold), or a :class:`SourceError` when its source could not answer.

A kind declares the sources it ``reads`` (all must be configured, else the engine skips the rule
quietly before any query) and those it ``also_reads`` when present; a name that is not a source
is an error when the kind registers. ``queries`` lists the PromQL a condition would send (given
the signal catalogue), for ``rules lint`` and the coverage report. Every module in the
``diagnoser.checks`` package tree is imported by :func:`load_check_kinds`, so adding a kind
edits no table.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from diagnoser.config import Settings
from diagnoser.errors import PromqlSyntaxError, SourceNotConfigured
from diagnoser.models import Evidence, SourceError
from diagnoser.promql.restrict import restrict, restricted_to_one
from diagnoser.signals import Catalogue, load_catalogue
from diagnoser.sources.base import SOURCE_NAMES, SourceName, Sources

__all__ = [
    "CheckContext",
    "CheckKind",
    "CheckResult",
    "check_kind",
    "check_kinds",
    "load_check_kinds",
]

CheckResult = list[Evidence] | SourceError
P = TypeVar("P", bound=BaseModel)
T = TypeVar("T")


#: The rules' averaging window when none is given: the config's default ``window``.
DEFAULT_WINDOW: str = Settings.model_fields["window"].default


@dataclass(frozen=True)
class CheckContext:
    """What a check may use: the evaluation instant, the sources, the signal catalogue and the
    rules' averaging window. Configuration reaches a check as its parameters (``${...}`` resolved
    when the rule is evaluated), not as settings."""

    at: datetime
    sources: Sources
    #: The catalogue the rules were checked against (shipped plus ``signal_files``).
    catalogue: Catalogue = field(default_factory=load_catalogue)
    #: ``window`` in the config, a PromQL duration.
    window: str = DEFAULT_WINDOW
    #: The instant whose metric names and recognition decide which conventions and resources a
    #: check reads (``None``: ``at``). An onset searched back from the diagnosis keeps the
    #: diagnosis' own: the candidate it follows was found there, and the estate is not recognised
    #: again at every instant the search tries.
    recognised_at: datetime | None = None

    #: ``(label, values)``: only rows carrying one of ``values`` in ``label`` (or none) are used, so
    #: queries may read only those series (:meth:`narrow`). Set for a rule's further conditions
    #: and evidence once its first condition named the candidates (``engine.evaluate.narrowed``).
    narrowed_to: tuple[str, frozenset[str]] | None = None

    def narrow(self, query: str) -> str:
        """``query`` reading only the series :attr:`narrowed_to` keeps, where that changes none of
        the answers kept (:func:`diagnoser.promql.restrict`); as written when unset or unreadable."""
        if self.narrowed_to is None:
            return query
        label, values = self.narrowed_to
        try:
            return restrict(query, label, values)
        except PromqlSyntaxError:
            return query

    def shown(self, query: str, labels: Mapping[str, str]) -> str:
        """``query`` as sent (:meth:`narrow`), for a row with ``labels``: narrowed to the row's own
        value rather than to every candidate's, which reads the same row."""
        if self.narrowed_to is None:
            return query
        label, values = self.narrowed_to
        own = labels.get(label)
        if not own or own not in values:
            return query
        return restricted_to_one(query, label, values, own)

    @property
    def names_at(self) -> datetime:
        """The instant the metric names and recognition are read at (:attr:`recognised_at`)."""
        return self.recognised_at or self.at

    def earlier(self, instant: datetime) -> CheckContext:
        """This context at ``instant``, reading the conventions and resources recognised at this one's."""
        return replace(self, at=instant, recognised_at=self.names_at)

    def require(self, source: T | None, name: str) -> T:
        """Return ``source`` or raise :class:`SourceNotConfigured` so the rule is skipped."""
        if source is None:
            raise SourceNotConfigured(name)
        return source


@dataclass(frozen=True)
class CheckKind:
    """A registered check kind: its name, parameter model, coroutine and what it reads."""

    name: str
    params: type[BaseModel]
    run: Callable[[Any, CheckContext], Awaitable[CheckResult]]
    #: The sources it cannot work without, in the order reports name them.
    reads: tuple[SourceName, ...]
    #: Sources it reads when they are configured and does without otherwise.
    also_reads: tuple[SourceName, ...] = ()
    #: ``(where, PromQL)`` for every query a condition with these (resolved) params can send;
    #: ``where`` tells alternatives apart (``""``, ``".limit"``, ``" (otel-semconv)"``).
    queries: Callable[[Any, Catalogue], list[tuple[str, str]]] | None = None
    #: False for a kind that holds when its data is missing (``absent``): its metrics being
    #: absent is no gap in coverage.
    needs_data: bool = True

    @property
    def sources(self) -> tuple[SourceName, ...]:
        return (*self.reads, *(name for name in self.also_reads if name not in self.reads))

    def queries_of(self, params: BaseModel, catalogue: Catalogue) -> list[tuple[str, str]]:
        return self.queries(params, catalogue) if self.queries is not None else []


_REGISTRY: dict[str, CheckKind] = {}


def _source_names(kind: str, names: Collection[str]) -> tuple[SourceName, ...]:
    unknown = sorted(set(names) - SOURCE_NAMES)
    if unknown:
        raise ValueError(f"check kind {kind!r} reads {unknown}, not sources (known: {sorted(SOURCE_NAMES)})")
    return tuple(cast(SourceName, name) for name in sorted(names))


def check_kind(
    name: str,
    *,
    params: type[P],
    reads: Collection[str],
    also_reads: Collection[str] = (),
    queries: Callable[[P, Catalogue], list[tuple[str, str]]] | None = None,
    needs_data: bool = True,
) -> Callable[
    [Callable[[P, CheckContext], Awaitable[CheckResult]]], Callable[[P, CheckContext], Awaitable[CheckResult]]
]:
    """Register the decorated coroutine as the check kind ``name`` with parameters ``params``."""
    if not reads:
        raise ValueError(f"check kind {name!r} reads no source")
    kind_reads, kind_also_reads = _source_names(name, reads), _source_names(name, also_reads)

    def register(
        func: Callable[[P, CheckContext], Awaitable[CheckResult]],
    ) -> Callable[[P, CheckContext], Awaitable[CheckResult]]:
        if name in _REGISTRY and _REGISTRY[name].run is not func:
            raise ValueError(f"check kind {name!r} is registered twice")
        _REGISTRY[name] = CheckKind(
            name=name,
            params=params,
            run=func,
            reads=kind_reads,
            also_reads=kind_also_reads,
            queries=queries,
            needs_data=needs_data,
        )
        return func

    return register


def load_check_kinds() -> Mapping[str, CheckKind]:
    """Import every module of the ``diagnoser.checks`` tree (registering its kinds); the registry."""
    import diagnoser.checks as package

    for module in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
        if module.name != __name__:
            importlib.import_module(module.name)
    return _REGISTRY


@functools.cache
def check_kinds() -> Mapping[str, CheckKind]:
    """The registry, loading the built-in kinds on first use (once: walking the package is not free)."""
    return load_check_kinds()
