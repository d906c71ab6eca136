"""The ``resource`` check kind: how full, how queued and how refused every resource with a limit is.

::

    - resource: {measure: peak, kinds: [connections], window: "${confirm_window}"}
      op: ">="            # written inside the mapping, like every check's threshold
    - resource: {measure: refused, window: "${confirm_window}", op: ">", threshold: 0}

Resources are the catalogue's (``resources:`` sections) and those recognised by shape at the
instant (:mod:`diagnoser.signals.infer`: a gauge and its limit sharing labels, with the queue and
refusal series of the same prefix). Each measure is one query per resource
(:func:`~diagnoser.signals.resources.resource_query`); each row carries the resource's name, kind
and role as labels (``resource``, ``resource_kind``, ``resource_role``, and ``resource_id``: the
name with the resource's own labels) beside the target's and the resource's own, and the
evidence names the convention, or ``inferred (...)`` with a caveat.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from diagnoser.checks.comparison import Comparison, compare, filtered, unfiltered
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.errors import NoDataFound
from diagnoser.models import Evidence, SourceError
from diagnoser.promql import duration_seconds
from diagnoser.signals.recognition import recognition
from diagnoser.signals.resources import Measure, Resource, resource_query
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["ResourceParams", "resource_check"]

SOURCE = "prometheus"
MIN_NAMES_LOOKBACK_S = 300.0


class ResourceParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    measure: Measure
    window: str
    #: Only resources of these kinds (``connections``, ``file_descriptors``, ``workers``, ``other``).
    kinds: list[str] = Field(default_factory=lambda: ["connections"])
    #: Only resources in these roles (``server``, ``proxy``, ``pool``, ``process``); all if empty.
    roles: list[str] = Field(default_factory=list)
    #: The share of its limit at which a resource counts as at its limit (``at_limit``).
    near: float = Field(default=0.95, gt=0, le=1)
    #: The step a window is read at: about the scrape interval, so each scrape counts.
    resolution: str = "15s"
    op: Comparison | None = None
    threshold: float | None = None
    timeout_s: float | None = Field(default=None, gt=0)


def _wanted(resource: Resource, params: ResourceParams) -> bool:
    return resource.kind in params.kinds and (not params.roles or resource.role in params.roles)


# No ``queries=``: which resources exist is known only at the instant (most are recognised by
# shape), so the check says itself when it found none (NoDataFound: the coverage's no_data).
@check_kind("resource", params=ResourceParams, reads={SOURCE})
async def resource_check(params: ResourceParams, ctx: CheckContext) -> CheckResult:
    source: PrometheusSource = ctx.require(ctx.sources.prometheus, SOURCE)
    # The names of the diagnosis' window, whatever the measure's own range: one recognition for
    # every check of the instant (a longer range would be a second one, at every diagnosis). A
    # server whose series went stale hours ago is still named by a live Prometheus, whose head
    # block answers names for the hours it holds.
    lookback = max(MIN_NAMES_LOOKBACK_S, duration_seconds(ctx.window))
    recognised = await recognition(source, ctx.catalogue, ctx.names_at, lookback)
    if isinstance(recognised, SourceError):
        return recognised
    wanted = [resource for resource in recognised.resources if _wanted(resource, params)]
    if not wanted:
        roles = f", {'/'.join(params.roles)}" if params.roles else ""
        raise NoDataFound(f"no resource with a limit ({' or '.join(params.kinds)}{roles})")
    # A measure some resources lack (refusals of a proxy that counts none) is no row for them.
    planned = [
        (resource, filtered(ctx.narrow(query), params.op, params.threshold))
        for resource in wanted
        for query in [resource_query(resource, params.measure, params.window, params.resolution, params.near)]
        if query is not None
    ]
    # One request for every resource (each has its own names and labels: a query apiece).
    answers = await source.query_each([query for _, query in planned], ctx.at, params.timeout_s)
    rows: list[Evidence] = []
    for (resource, query), samples in zip(planned, answers, strict=True):
        if isinstance(samples, SourceError):
            return samples
        sent = unfiltered(source.prepare(query, ctx.at), params.op, params.threshold)
        for sample in samples:
            if math.isnan(sample.value) or not _holds(sample.value, params):
                continue
            labels = {key: value for key, value in sample.labels.items() if value}
            if "job" in labels:
                labels.setdefault("service", labels["job"])
            labels.update(resource=resource.name, resource_kind=resource.kind, resource_role=resource.role)
            named = _named(resource, labels)
            if named is not None:
                labels["resource_id"] = named
            rows.append(
                Evidence(
                    source=SOURCE,
                    query=ctx.shown(sent, labels),
                    labels=labels,
                    value=sample.value,
                    threshold=params.threshold,
                    convention=resource.how,
                    caveat=resource.caveat,
                )
            )
    return rows


def _named(resource: Resource, labels: dict[str, str]) -> str | None:
    """The resource's name with its own labels (``haproxy_server sessions (proxy=app, server=app1)``),
    so that a finding says which one without knowing what its labels are called; ``None`` for a
    row that lacks some of them (a backend's queue beside its servers), which then agrees with each."""
    if any(not labels.get(label) for label in resource.labels):
        return None
    own = [f"{label}={labels[label]}" for label in resource.labels]
    return f"{resource.name} ({', '.join(own)})" if own else resource.name


def _holds(value: float, params: ResourceParams) -> bool:
    if params.op is None or params.threshold is None:
        return True
    return compare(value, params.op, params.threshold)
