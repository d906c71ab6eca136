"""What the Elasticsearch checks share: the base of their parameter models and the API source.

:class:`EsCheckParams` refuses a parameter the check does not take with a message naming the
check and what it does take (``check 'heap' does not take ['groups']; it takes [...]``), since
one ``es:`` condition can name any of the checks and a parameter of another one is the usual
slip. :func:`api_source` is the source for checks that ask the cluster's API: in slow-log-only
mode (files configured, no URL) there is no cluster, so those checks are skipped, not failed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from diagnoser.checks.registry import CheckContext
from diagnoser.errors import SourceNotConfigured
from diagnoser.sources.elasticsearch import ElasticsearchSource

__all__ = ["SOURCE", "EsCheckParams", "SampledParams", "api_source", "only_known"]

SOURCE = "elasticsearch"


class EsCheckParams(BaseModel):
    """Parameters of one ``es`` check; ``check`` names it in messages."""

    model_config = ConfigDict(extra="forbid")
    check: ClassVar[str]

    @model_validator(mode="before")
    @classmethod
    def _only_own_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            stray = sorted(str(key) for key in data if key not in cls.model_fields)
            if stray:
                raise ValueError(
                    f"check {cls.check!r} does not take {stray}; it takes {sorted(cls.model_fields)}"
                )
        return data


class SampledParams(EsCheckParams):
    """A check that reads node stats counters twice, ``sample_s`` apart."""

    sample_s: float = Field(default=2.0, ge=0, le=60)


def only_known(names: list[str], known: Collection[str], what: str) -> list[str]:
    """``names`` when each is one of ``known``; else a ValueError listing the unknown and the known."""
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown {what}(s) {unknown}; known: {list(known)}")
    return names


def api_source(ctx: CheckContext) -> ElasticsearchSource:
    """The Elasticsearch source when it can answer API calls; else the rule is skipped."""
    source = ctx.require(ctx.sources.elasticsearch, SOURCE)
    if not source.has_api:
        raise SourceNotConfigured(SOURCE)
    return source
