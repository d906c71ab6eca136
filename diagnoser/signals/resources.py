"""Resources with a limit (the USE method's subjects): what is used, its limit, its queue, its refusals.

A resource is a gauge of what is in use and the limit it may reach (a server's connections and
its ``max_connections``, a proxy's sessions to a server and the server line's ``maxconn``, a
process' open file descriptors and their maximum), with the gauges of work waiting for it and the
counters of work it refused. Resources come from the catalogue's ``resources:`` sections, for
exporters whose names no shape gives away (PostgreSQL's ``pg_stat_activity_count`` against
``pg_settings_max_connections``)::

    resources:
      - name: postgres-exporter
        title: PostgreSQL connections (prometheus-community postgres_exporter)
        resource: postgresql max_connections
        kind: connections
        role: server
        used: pg_stat_activity_count
        limit: pg_settings_max_connections - pg_settings_superuser_reserved_connections
        labels: [server]

and from recognition by shape (:mod:`diagnoser.signals.infer`). :func:`resource_query` writes the
PromQL of one measure of one resource: every series summed to the resource's labels (the target's
``namespace``, ``job``, ``instance`` and its own, such as HAProxy's ``proxy`` and ``server``),
ratios over the limit's answer, and a window read as a subquery so that a gauge that touches its
limit between two scrapes' churn still counts at its peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from diagnoser.promql import format_duration, format_number, metric_names, parse, quote

__all__ = ["MEASURES", "Measure", "Resource", "ResourceSpec", "resource_from_spec", "resource_query"]

Measure = Literal[
    "peak", "at_limit", "limit", "configured", "used", "failed", "queued", "queued_peak", "refused",
    "pressure", "last_used", "last_limit",
]
MEASURES: tuple[Measure, ...] = (
    "peak",
    "at_limit",
    "limit",
    "configured",
    "used",
    "failed",
    "queued",
    "queued_peak",
    "refused",
    "pressure",
    "last_used",
    "last_limit",
)
TARGET_LABELS = ("namespace", "job", "instance")
#: How far back a target must have shown a resource's limit for its failed scrapes to be that
#: resource's (the ``failed`` measure), read at one-minute steps: a server's storm can outlast an
#: hour (mariadb-pooled-replicas under the variation harness's two-hour incident).
FAILED_TARGET_LOOKBACK_S = 6 * 3600.0
#: Failed scrapes of a resource's exporter count as scrapes at its limit only when the scrapes that
#: landed in the same window peaked at this share of the limit or more. An exporter that needs a
#: connection of its own (mysqld_exporter, one per scrape) fails exactly when the server is full,
#: and the scrapes that land catch the count between churning connections (14-17 of 17 on the
#: recorded PostgreSQL and MariaDB beds: 0.82 and up). The false positive this keeps out: a server
#: that went down or restarted, whose exporter fails too while its last counts were anywhere
#: (checked on the mysqld, postgres, redis and memcached beds and their healthy instants).
FAILED_SCRAPES_NEAR = 0.75


class ResourceSpec(BaseModel):
    """A ``resources:`` entry of a catalogue file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    title: str
    #: What the finding calls it (``postgresql max_connections``).
    resource: str
    kind: Literal["connections", "file_descriptors", "workers", "other"]
    #: ``server`` (a server's own limit), ``proxy`` (a proxy's limit towards a server), ``pool``,
    #: ``process`` (a process' own: descriptors, workers) or ``host`` (the kernel's, for all).
    role: Literal["server", "proxy", "pool", "process", "host"] = "server"
    used: str
    #: The limit the clients can reach (PostgreSQL's max_connections less the reserved slots).
    limit: str
    #: The limit as configured, where the usable one is less (``pg_settings_max_connections``).
    configured: str | None = None
    #: Slots reserved only by some versions of the server, taken off ``limit`` where the series
    #: exists and never required (PostgreSQL 16's ``reserved_connections``).
    reserved: str | None = None
    #: The exporter's own gauge of whether it could read the server (``pg_up``, ``mysql_up``):
    #: 0, like the target's ``up`` 0, is a failed scrape.
    up: str | None = None
    #: A wider limit of the same target this one falls under (HAProxy's global maxconn over a
    #: frontend's, which inherits it): where this limit is the wider one or more, the wider one
    #: binds, and the resource is left to the entry of that limit (one limit, one finding).
    within: str | None = None
    labels: list[str] = Field(default_factory=list)
    queued: list[str] = Field(default_factory=list)
    refused: list[str] = Field(default_factory=list)
    note: str | None = None


@dataclass(frozen=True)
class Resource:
    """One kind of resource as a Prometheus holds it: PromQL for its use, limit, queue, refusals."""

    name: str
    kind: str
    used: str
    limit: str
    #: The resource's own labels, beyond the target's (``proxy``, ``server``).
    labels: tuple[str, ...] = ()
    queued: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    #: The catalogue entry's name, or ``inferred (...)`` saying how it was recognised.
    how: str = ""
    caveat: str | None = None
    role: str = "server"
    configured: str | None = None
    reserved: str | None = None
    up: str | None = None
    within: str | None = None

    @property
    def required(self) -> frozenset[str]:
        """Metric names that must exist for this resource to be present."""
        return metric_names(self.used) | metric_names(self.limit)

    @property
    def grouping(self) -> tuple[str, ...]:
        return (*TARGET_LABELS, *self.labels)


def resource_from_spec(spec: ResourceSpec, where: str) -> Resource:
    """A catalogued resource; ``ValueError`` naming ``where`` when its PromQL does not parse."""
    optional = [text for text in (spec.configured, spec.reserved, spec.up, spec.within) if text is not None]
    for text in (spec.used, spec.limit, *optional, *spec.queued, *spec.refused):
        try:
            parse(text)
        except Exception as exc:  # the parser's own error types
            raise ValueError(f"{where}: {text!r} is not PromQL ({exc})") from exc
    return Resource(
        name=spec.resource,
        kind=spec.kind,
        used=spec.used,
        limit=spec.limit,
        labels=tuple(spec.labels),
        queued=tuple(spec.queued),
        refused=tuple(spec.refused),
        how=spec.name,
        caveat=spec.note,
        role=spec.role,
        configured=spec.configured,
        reserved=spec.reserved,
        up=spec.up,
        within=spec.within,
    )


def _by(resource: Resource) -> str:
    return f"by ({', '.join(resource.grouping)})"


def _names(names: tuple[str, ...]) -> str:
    """One selector of several metrics (``{__name__=~"a|b"}``); metric names hold no metacharacters."""
    if len(names) == 1:
        return names[0]
    return "{__name__=~" + quote("|".join(names)) + "}"


def _rates(counters: tuple[str, ...], window: str) -> str:
    """The per-second rate of each of ``counters`` (selectors), side by side: ``rate()`` drops the
    metric name, so two counters with the same labels (memcached's rejected connections and
    listener disabled) are told apart by a label of their own before they are summed."""
    if len(counters) == 1:
        return f"rate({counters[0]}[{window}])"
    return " or ".join(
        f'label_replace(rate({counter}[{window}]), "refusal", "{index}", "", "")'
        for index, counter in enumerate(counters)
    )


def _failed_scrapes(resource: Resource) -> str | None:
    """Per target, 1 at an instant its exporter's scrape failed (its own ``up`` gauge 0, or the
    target's ``up`` 0) and 0 when it succeeded; ``None`` when the exporter has no such gauge (a
    resource of a server recognised by shape: nothing says which target reads the server).

    A process' own resource (its open file descriptors, its worker pool) is read by the process
    itself: its target's ``up`` is that process failing to answer its own scrape, which a process
    out of descriptors does (its ``accept()`` fails with EMFILE)."""
    target = f"max by ({', '.join(TARGET_LABELS)})"
    if resource.up is None:
        return f"({target} (up) < bool 1)" if resource.role == "process" else None
    # Either failing counts: the exporter's gauge from its last good scrape lingers for the
    # lookback after its scrapes start failing (a replay or remote-written copy has no staleness
    # markers), so it must not hide the target's ``up`` 0 as ``or`` alone would.
    own = f'label_replace({target} ({resource.up}) < bool 1, "failed_by", "exporter", "", "")'
    scrape = f'label_replace({target} (up) < bool 1, "failed_by", "scrape", "", "")'
    return f"({target} ({own} or {scrape}))"


def resource_query(
    resource: Resource, measure: Measure, window: str, resolution: str, near: float
) -> str | None:
    """The PromQL of ``measure`` over ``window`` for ``resource``; ``None`` when it has no such series.

    ``peak`` and ``at_limit`` are ratios to the usable limit (the highest, and the share of the
    window's steps at ``near`` or above; for ``peak``, a scrape its exporter failed counts as one at
    the limit when those that landed came within :data:`FAILED_SCRAPES_NEAR` of it, and for
    ``at_limit`` the share of failed scrapes then counts when it is the larger); ``limit`` is
    the usable limit, ``configured`` the configured one (where they differ); ``failed`` the share
    of the window's steps its exporter failed at; ``queued`` is the mean waiting, ``queued_peak`` the most;
    ``refused`` refusals per second; ``pressure`` either, where above 0; ``last_used`` and
    ``last_limit`` the use and the limit at the last scrape within ``window`` that carried them (an
    exporter refused by its server carries neither: what it showed last). Queues and refusals of
    several series are summed per label set they have: a backend's queue (no ``server`` label)
    stays beside a server's.
    """
    if measure == "pressure":
        # Work waiting for the resource or refused by it, whichever the resource has.
        parts = [resource_query(resource, part, window, resolution, near) for part in ("queued", "refused")]
        found = [f"({part} > 0)" for part in parts if part is not None]
        return " or ".join(found) or None
    by = _by(resource)
    used = f"sum {by} ({resource.used})"
    usable = resource.limit
    if resource.reserved is not None:
        usable = f"({usable}) - (({resource.reserved}) or ({usable}) * 0)"
    limit = f"(max {by} ({usable}) > 0)"
    if resource.within is not None:
        # Where the wider limit is no higher, it binds: the resource is left to its entry.
        target = ", ".join(TARGET_LABELS)
        wider = f"max by ({target}) ({resource.within})"
        limit = f"({limit} unless ({limit} >= on ({target}) group_left {wider}))"
    ranged = f"[{window}:{resolution}]"
    if measure == "peak":
        peak = f"max_over_time(({used} / {limit}){ranged})"
        failed = _failed_scrapes(resource)
        if failed is None:
            return peak
        # A scrape that failed at the limit counts as one at the limit (1.0), on the resource's
        # own rows, when the scrapes that landed came near it.
        near_it = f"({peak} >= {format_number(FAILED_SCRAPES_NEAR)})"
        on = f"on ({', '.join(TARGET_LABELS)}) group_left"
        return f"({near_it} * 0 + {on} max_over_time({failed}{ranged}) > 0) or {peak}"
    if measure == "at_limit":
        at_limit = f"avg_over_time(({used} / {limit} >= bool {format_number(near)}){ranged})"
        failed = _failed_scrapes(resource)
        if failed is None:
            return at_limit
        # Scrapes that failed while the ones that landed came near the limit count as scrapes at
        # it (as for ``peak``): the share is the larger of the two, on the resource's own rows.
        near_it = f"(max_over_time(({used} / {limit}){ranged}) >= {format_number(FAILED_SCRAPES_NEAR)})"
        on = f"on ({', '.join(TARGET_LABELS)}) group_left"
        blind = f"({near_it} * 0 + {on} avg_over_time({failed}{ranged}))"
        return f'max {by} ({at_limit} or label_replace({blind}, "scrapes", "failed", "", ""))'
    if measure == "limit":
        return limit
    if measure == "last_used":
        return f"last_over_time(({used} and {limit}){ranged})"
    if measure == "last_limit":
        return f"last_over_time({limit}{ranged})"
    if measure == "configured":
        return None if resource.configured is None else f"(max {by} ({resource.configured}) > 0)"
    if measure == "used":
        return f"max_over_time(({used}){ranged})"
    if measure == "failed":
        failed = _failed_scrapes(resource)
        if failed is None:
            return None
        # The share of the window's instants it failed at, for the resource's own targets only:
        # those that showed a limit within the last hours. Not within the window alone: an exporter
        # refused for longer than the window (a two-hour storm at a server's connection limit)
        # shows no limit in it, and its target would drop out of the very measure of its failing.
        on = f"on ({', '.join(TARGET_LABELS)})"
        shown = f"max_over_time({limit}[{format_duration(FAILED_TARGET_LOOKBACK_S)}:1m])"
        return f"avg_over_time({failed}{ranged}) and {on} {shown}"
    if measure in ("queued", "queued_peak"):
        if not resource.queued:
            return None
        function = "avg_over_time" if measure == "queued" else "max_over_time"
        return f"{function}((sum {by} ({_names(resource.queued)})){ranged})"
    if not resource.refused:
        return None
    return f"sum {by} ({_rates(resource.refused, window)})"
