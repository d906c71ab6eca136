"""Check kinds: the Python behind the conditions rules write in YAML.

A check kind is one module that registers a coroutine with :func:`check_kind`::

    class HotThreadsParams(BaseModel):
        model_config = ConfigDict(extra="forbid")
        pool: str
        min_share: float = 0.5

    @check_kind("es_hot_threads_demo", params=HotThreadsParams)
    async def hot_threads(params: HotThreadsParams, ctx: CheckContext) -> CheckResult:
        es = ctx.require(ctx.sources.elasticsearch, "elasticsearch")
        ...
        return [Evidence(source="elasticsearch", query="GET _nodes/hot_threads", ...)]

A rule condition ``- es_hot_threads_demo: {pool: merge}`` is then validated against
``HotThreadsParams`` when the rule file loads. A check returns the evidence rows that hold
(an empty list means the condition does not hold), or a :class:`SourceError` when its source
could not answer. It raises :class:`SourceNotConfigured` (via ``ctx.require``) when the source
it needs is absent, which skips the rule quietly. Every module in ``diagnoser.checks`` is
imported by :func:`load_check_kinds`, so adding a kind edits no table.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from diagnoser.errors import SourceNotConfigured
from diagnoser.models import Evidence, SourceError

if TYPE_CHECKING:
    from diagnoser.config import Settings
    from diagnoser.sources import Sources

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


@dataclass
class CheckContext:
    """What a check may use: the evaluation instant, config, sources and template values."""

    at: datetime
    settings: Settings
    sources: Sources
    #: Values for ``${...}`` placeholders: ``slo.p99_seconds``, ``signals.queue_length``, rule params.
    variables: Mapping[str, Any] = field(default_factory=dict)

    def require(self, source: T | None, name: str) -> T:
        """Return ``source`` or raise :class:`SourceNotConfigured` so the rule is skipped."""
        if source is None:
            raise SourceNotConfigured(name)
        return source


@dataclass(frozen=True)
class CheckKind:
    """A registered check kind: its name, parameter model and coroutine."""

    name: str
    params: type[BaseModel]
    run: Callable[[Any, CheckContext], Awaitable[CheckResult]]
    #: The source this kind reads (for reports and ``rules list``).
    source: str


_REGISTRY: dict[str, CheckKind] = {}


def check_kind(
    name: str, *, params: type[P], source: str
) -> Callable[
    [Callable[[P, CheckContext], Awaitable[CheckResult]]], Callable[[P, CheckContext], Awaitable[CheckResult]]
]:
    """Register the decorated coroutine as the check kind ``name`` with parameters ``params``."""

    def register(
        func: Callable[[P, CheckContext], Awaitable[CheckResult]],
    ) -> Callable[[P, CheckContext], Awaitable[CheckResult]]:
        if name in _REGISTRY and _REGISTRY[name].run is not func:
            raise ValueError(f"check kind {name!r} is registered twice")
        _REGISTRY[name] = CheckKind(name=name, params=params, run=func, source=source)
        return func

    return register


def load_check_kinds() -> Mapping[str, CheckKind]:
    """Import every module of ``diagnoser.checks`` (registering its kinds) and return the registry."""
    import diagnoser.checks as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "registry":
            importlib.import_module(f"{package.__name__}.{module.name}")
    return _REGISTRY


def check_kinds() -> Mapping[str, CheckKind]:
    """The registry, loading the built-in kinds on first use."""
    return load_check_kinds()
