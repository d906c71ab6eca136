"""Recognition by metadata and shape: signals for the metric families no convention claims.

The catalogue (:mod:`diagnoser.signals.catalogue`) is the precise layer. Under it, this module
reads what a Prometheus holds at an instant (its metric names, ``/api/v1/metadata`` where served,
and one series' labels per candidate family) and recognises:

* a request-duration histogram or summary on the server side with a status label: an inferred
  convention for ``http.server.duration``, ``http.server.errors`` and ``http.server.shed``;
* one on the client side (a client token, or a peer label such as ``server_address``): an
  inferred convention for ``dependency.duration`` with the peer label, where the catalogue
  defines that signal;
* a gauge with a sibling that is its limit (``haproxy_server_current_sessions`` /
  ``haproxy_server_limit_sessions``, ``redis_connected_clients`` / ``redis_config_maxclients``,
  ``process_open_fds`` / ``process_max_fds``), with the waiting gauges and refusal counters of the
  same prefix: a :class:`~diagnoser.signals.resources.Resource` for the USE rules.

Metadata is often missing (Prometheus serves it only for targets it scrapes now; VictoriaMetrics
answers ``{}``), so names, suffixes and labels suffice; metadata refines the type and unit. A
unit that neither says is read from the bucket bounds, else assumed and said. Every inferred
mapping is named ``inferred (...)`` and carries a caveat, and what looks like a duration or a
limit but could not be recognised is listed (``diagnose signals`` shows both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diagnoser.signals.catalogue import TIME_UNITS, Catalogue, Convention, Form
from diagnoser.signals.otlp import escape_metric
from diagnoser.signals.peers import peer_candidates, pick_peer
from diagnoser.signals.resources import TARGET_LABELS, Resource
from diagnoser.signals.shapes import (
    LIMIT_WORDS,
    PEER_PORT_LABELS,
    SERVER_TOKENS,
    STATUS_LABELS,
    Family,
    families_of,
    is_duration,
    limit_parts,
    side,
    time_unit,
    tokens,
)

if TYPE_CHECKING:
    from diagnoser.signals.claims import Claims

__all__ = [
    "Lookalike",
    "Pairing",
    "Recognition",
    "Rejection",
    "candidate_pairs",
    "candidate_series",
    "labels_key",
    "overshoot_query",
    "recognise",
    "split_candidates",
    "unitless_histograms",
]

CAVEAT = "recognised by its shape, not by a catalogued convention: check that the metric means this"
_ROUTE_LABELS = ("http_route", "route", "handler", "path", "endpoint", "uri", "method_name")
#: What a server's own request durations are split by, beyond the route: the view or controller
#: of web frameworks (django-prometheus' ``view``, prometheus-net's ``controller``/``action``).
_SERVER_DIMENSIONS = (*_ROUTE_LABELS, "view", "controller", "action", "url", "operation")
_USAGE_WORDS = frozenset(
    {
        "current",
        "open",
        "active",
        "used",
        "connected",
        "count",
        "usage",
        "busy",
        "inuse",
        "in",
        "use",
        "cur",
        "num",
        "allocated",
    }
)
#: What a limit may cap: counts of things a server, proxy or process holds at once. A limit on
#: anything else (a checkpoint's age, a cluster's size, a status) is no resource: the false
#: pairs ``wsrep_cluster_status`` / ``wsrep_cluster_size`` and ``innodb_checkpoint_age`` /
#: ``innodb_checkpoint_max_age`` of mysqld_exporter's healthy recording are what this prevents.
_COUNT_NOUNS = frozenset(
    {
        "connections",
        "clients",
        "sessions",
        "fds",
        "files",
        "workers",
        "threads",
        "slots",
        "backends",
        "entries",
        "processes",
        "children",
        "channels",
        "sockets",
        "pool",
    }
)
#: Names of what is no count (a time, a size in bytes, a position, a state).
_NOT_A_COUNT = frozenset(
    {"age", "lsn", "status", "state", "cluster", "members", "nodes", "replicas", "version"}
)
#: How far a gauge may go above its limit over the day and the pair still be a limit: MySQL lets
#: one connection past max_connections (for SUPER), and a gauge read between two scrapes' churn
#: may count a connection being closed. Checked on every recording of
#: tests/integration/test_atlas_recordings.py, healthy and at the limit: no pair inferred there
#: (process_open_fds / process_max_fds, RabbitMQ's Erlang processes...) goes above its limit.
OVERSHOOT_SHARE = 0.05
OVERSHOOT_SLOTS = 1
#: A configured limit stays put (a restart with a new setting changes it once or twice); a
#: rolling high-water mark beside a gauge (Micrometer's jetty.connections.max, "the most
#: connections seen over 2 minutes") moves with it and would always read "at its limit".
LIMIT_CHANGES = 3
#: The day over which the gauge's peak is compared with its limit, read every 5 minutes.
OVERSHOOT_WINDOW = "1d"
OVERSHOOT_STEP = "5m"
_QUEUE_WORDS = frozenset({"queue", "queued", "pending", "waiting"})
#: What may follow a queue or refusal word: what waits or was refused (not ``objects``, ``calls``).
_WORK_NOUNS = frozenset(
    {
        "requests",
        "request",
        "connections",
        "connection",
        "conn",
        "clients",
        "sessions",
        "count",
        "length",
        "size",
        "current",
        "total",
    }
)
#: Limits worth listing as near misses: of connections, pools, workers, descriptors.
_RESOURCE_NOUNS = frozenset(
    {"connections", "clients", "sessions", "pool", "workers", "threads", "fds", "files", "slots", "backends"}
)
_REFUSAL_WORDS = frozenset(
    {"rejected", "refused", "timeouts", "timeout", "timedout", "overflow", "overflows", "dropped"}
)
_NOUNS = {
    "conn": "connections",
    "conns": "connections",
    "connection": "connections",
    "client": "clients",
    "session": "sessions",
    "fd": "fds",
    "file": "files",
    "worker": "workers",
    "thread": "threads",
}
_PROXIES = frozenset({"haproxy", "envoy", "nginx", "traefik"})
_NOT_COUNTS = frozenset(
    {"bytes", "seconds", "ratio", "percent", "milliseconds", "celsius", "replicas", "rate", "average", "avg"}
)
#: Bucket bounds this high are not seconds: an exporter that writes no unit wrote milliseconds.
_MILLISECOND_BOUND = 100.0


@dataclass(frozen=True)
class Lookalike:
    """A family that looks like a duration, a pool or a limit but was not recognised, and why."""

    metric: str
    looks_like: str
    reason: str


@dataclass(frozen=True)
class Rejection:
    """A catalogue entry or an inferred pairing that was considered and not used, and why.

    ``entry`` names it (a convention or resource entry's name, ``inferred pair used / limit``),
    ``metric`` the family it was about (which service it concerns is read from it), ``reason``
    one sentence. ``diagnose signals`` lists them per service.
    """

    entry: str
    metric: str
    reason: str


@dataclass(frozen=True)
class Recognition:
    """What was recognised at one instant: inferred conventions, resources and near misses."""

    conventions: tuple[Convention, ...] = ()
    resources: tuple[Resource, ...] = ()
    lookalikes: tuple[Lookalike, ...] = ()
    families: Mapping[str, Family] = field(default_factory=dict)
    rejected: tuple[Rejection, ...] = ()


def _unclaimed(
    names: Iterable[str],
    catalogue: Catalogue,
    metadata: Mapping[str, Mapping[str, str]],
    native: Iterable[str] = (),
    claims: Claims | None = None,
    families: Mapping[str, Family] | None = None,
) -> dict[str, Family]:
    """The families of ``names`` none of whose series a convention or catalogued resource reads
    (``families``: those of ``names``, where the caller has them already: an estate's thousands of
    names are grouped once, not once per question).

    With ``claims``, a convention reads only the families whose labels fit it
    (:mod:`diagnoser.signals.claims`); a duration family its claimants supply only some signals of
    (a duration whose status no claimant reads) is left to recognition as well."""
    every = families if families is not None else families_of(names, metadata, native)
    resources: set[str] = set().union(*(resource.required for resource in catalogue.resources))
    claimed: set[str] | frozenset[str]
    if claims is not None:
        claimed = claims.claimed | resources
        return {
            name: family
            for name, family in every.items()
            if not set(family.series) & claimed
            or (is_duration(family) and _partly_supplied(claims.supplied.get(family.name, frozenset())))
        }
    claimed = catalogue.metric_names() | resources
    spelt = catalogue.otel_spellings()  # an OpenTelemetry convention's other OTLP spellings
    return {
        name: family
        for name, family in every.items()
        if not set(family.series) & claimed and not {escape_metric(s) for s in family.series} & spelt
    }


#: What a server's duration family gives by shape: its duration, errors and shed requests.
_SERVER_SIGNALS = frozenset({"http.server.duration", "http.server.errors", "http.server.shed"})


def _partly_supplied(supplied: frozenset[str]) -> bool:
    """Claimants give some of a server family's HTTP signals and not the rest: a
    prometheus-fastapi-instrumentator entry reads the duration of a family whose errors it reads
    elsewhere, from a family that is absent, while this family's own status label has them."""
    return bool(supplied) and supplied <= _SERVER_SIGNALS and supplied != _SERVER_SIGNALS


def labels_key(family: Family) -> str:
    """The series whose labels stand for a duration family's: its ``_count``, or a native
    histogram's own series."""
    return family.name if family.histogram == "native" else f"{family.name}_count"


def candidate_series(
    names: set[str], metadata: Mapping[str, Mapping[str, str]], catalogue: Catalogue
) -> list[str]:
    """The series whose labels recognition needs, read from names alone: one per unclaimed
    duration family, each limit of a count, and the gauges of the same exporter that could be
    what it limits or its queue. On a Prometheus without such families, none (and no query)."""
    every = families_of(names, metadata)
    families = _unclaimed(names, catalogue, metadata, families=every)
    # Every duration family, claimed by name or not: a claim whose labels do not fit falls through.
    wanted = [labels_key(f) for f in every.values() if is_duration(f)]
    limits = {f.name for f in families.values() if f.type == "gauge" and _count_limit(f.name) is not None}
    exporters = {tokens(name)[0] for name in limits}
    wanted += limits
    related = _USAGE_WORDS | _QUEUE_WORDS
    for family in families.values():
        if family.type != "gauge" or family.name in limits:
            continue
        parts = tokens(family.name)
        if parts and parts[0] in exporters and set(parts) & related:
            wanted.append(family.name)
    return sorted(wanted)


def _count_limit(name: str) -> tuple[tuple[str, ...], str, tuple[str, ...]] | None:
    """``limit_parts`` of a limit on a count (not bytes, rates or a queue's longest)."""
    parts = limit_parts(name)
    if parts is None or _NOT_COUNTS & set(tokens(name)) or _QUEUE_WORDS & set(parts[2]):
        return None
    return parts


def request_side(family: Family, labels: frozenset[str]) -> str | None:
    """:func:`~diagnoser.signals.shapes.side`, and a request duration that only its request words
    call a server's: with no route (nor view, controller...) to split it but a label that is no
    known request dimension, it times calls out, that label naming who is called
    (``backend_request_duration_seconds{callee}`` beside the service's own
    ``http_request_duration_seconds{route}``). A server's durations are split by what it serves;
    a label left beside method and status is whom it calls. Protects against: reading a service's
    calls out as its own latency (and missing the slow peer), while a promhttp server family
    (``{code, method}``, nothing left) and every server family with a route stays a server's.
    Checked on the recorded expositions (tests/fixtures/expositions) and the unseen beds."""
    where = side(family, labels)
    if where != "server" or set(tokens(family.name)) & SERVER_TOKENS:
        return where
    if any(label in labels for label in _SERVER_DIMENSIONS) or any(
        label.endswith(("_route", "_path", "_target")) for label in labels
    ):
        return where
    candidates, how = peer_candidates(labels)
    return "client" if how == "left" and candidates else where


def split_candidates(
    names: set[str],
    metadata: Mapping[str, Mapping[str, str]],
    labels: Mapping[str, frozenset[str]],
    catalogue: Catalogue,
    claims: Claims | None = None,
    families: Mapping[str, Family] | None = None,
) -> dict[str, tuple[Family, tuple[str, ...]]]:
    """Client duration families no claim takes whose peer label is none of the known names and
    could be any of several labels: each with its candidates, for the split query."""
    found = {}
    for family in _unclaimed(names, catalogue, metadata, (), claims, families).values():
        own = labels.get(labels_key(family))
        if not is_duration(family) or own is None or request_side(family, own) != "client":
            continue
        candidates, how = peer_candidates(own)
        if how == "left" and len(candidates) > 1:
            found[family.name] = (family, candidates)
    return found


def unitless_histograms(families: Mapping[str, Family]) -> list[str]:
    """Histograms timed in a unit neither the metadata nor the name gives: read from their buckets."""
    return sorted(
        f"{f.name}_bucket"
        for f in families.values()
        if f.type == "histogram" and f.histogram != "native" and is_duration(f) and time_unit(f)[0] is None
    )


def recognise(
    names: set[str],
    metadata: Mapping[str, Mapping[str, str]],
    labels: Mapping[str, frozenset[str]],
    catalogue: Catalogue,
    bucket_bounds: Mapping[str, float] | None = None,
    native: Iterable[str] = (),
    overshoots: Mapping[tuple[str, str], float] | None = None,
    claims: Claims | None = None,
    splits: Mapping[str, Mapping[str, float]] | None = None,
) -> Recognition:
    """Recognise the unclaimed families of ``names``.

    ``labels`` holds the label names of one series per candidate (:func:`candidate_series`);
    ``bucket_bounds`` the highest finite ``le`` of each unitless histogram's ``_bucket``;
    ``native`` the names whose samples are native histograms;
    ``overshoots`` the answer of :func:`overshoot_query` per pair (used, limit) of
    :func:`candidate_pairs` (a pair without one is kept, and says its peak was not checked);
    ``claims`` which catalogued forms fit their families' labels (without it, names decide);
    ``splits`` per client family with several possible peer labels, how much each splits the
    slowdown (:func:`diagnoser.signals.peers.split_query`).
    """
    every = families_of(names, metadata, native)
    families = _unclaimed(names, catalogue, metadata, families=every)
    durations = (
        families if claims is None else _unclaimed(names, catalogue, metadata, claims=claims, families=every)
    )
    conventions: list[Convention] = []
    lookalikes: list[Lookalike] = []
    for family in durations.values():
        if not is_duration(family):
            continue
        found = _duration_convention(
            family,
            labels.get(labels_key(family)),
            catalogue,
            bucket_bounds or {},
            (splits or {}).get(family.name),
        )
        if isinstance(found, Lookalike):
            if found.looks_like != "duration":  # a duration of no request at all (GC, scrapes) is no miss
                lookalikes.append(found)
        else:
            conventions.append(found)
    pairs, missed, refused = _pairings(families, labels)
    resources: list[Resource] = []
    for pairing in pairs:
        over = None if overshoots is None else overshoots.get((pairing.used, pairing.limit))
        rejected = None if over is None else _verdict(pairing, over)
        if rejected is not None:
            refused.append(rejected)
            continue
        resources.append(_resource(families, labels, pairing, checked=over is not None))
    present_resources = [r for r in catalogue.resources if r.required <= names]
    refused += _partial_entries(catalogue, names)
    if claims is not None:
        refused += claims.rejected
    return Recognition(
        conventions=tuple(conventions),
        resources=(*present_resources, *resources),
        lookalikes=(*lookalikes, *missed),
        families={**families, **durations},
        rejected=tuple(refused),
    )


def _partial_entries(catalogue: Catalogue, names: set[str]) -> list[Rejection]:
    """Catalogued resources some of whose series exist and others not: the entry is not used."""
    rejected = []
    for resource in catalogue.resources:
        present = resource.required & names
        if present and present != resource.required:
            missing = ", ".join(sorted(resource.required - names))
            rejected.append(
                Rejection(
                    resource.how, min(present), f"{missing} absent, so the entry cannot compare use and limit"
                )
            )
    return rejected


def candidate_pairs(
    names: set[str],
    metadata: Mapping[str, Mapping[str, str]],
    labels: Mapping[str, frozenset[str]],
    catalogue: Catalogue,
) -> list[Pairing]:
    """The gauges and limits that pair by name, unit and labels, whose day's peak is to be checked."""
    return _pairings(_unclaimed(names, catalogue, metadata), labels)[0]


def _unit(family: Family, bounds: Mapping[str, float]) -> tuple[str, str]:
    unit, how = time_unit(family)
    if unit is not None:
        return unit, f"{unit} from its {how}"
    top = bounds.get(f"{family.name}_bucket")
    if top is not None:
        unit = "milliseconds" if top >= _MILLISECOND_BOUND else "seconds"
        return unit, f"{unit} from its bucket bounds (up to {top:g})"
    return "seconds", "seconds assumed (no unit in metadata, name or buckets)"


def _duration_convention(
    family: Family,
    labels: frozenset[str] | None,
    catalogue: Catalogue,
    bounds: Mapping[str, float],
    splits: Mapping[str, float] | None = None,
) -> Convention | Lookalike:
    if labels is None:
        return Lookalike(family.name, "duration", "no series to read its labels from at this instant")
    where = request_side(family, labels)
    unit, unit_how = _unit(family, bounds)
    scale = TIME_UNITS[unit]
    shape = f"{'native ' if family.histogram == 'native' else ''}{family.type} {family.name}"
    if where == "client":
        if "dependency.duration" not in catalogue.signals:
            return Lookalike(family.name, "client duration", "no dependency.duration signal in the catalogue")
        peer, peer_how = pick_peer(labels, splits)
        name = f"inferred ({shape}, client side, {peer_how}, {unit_how})"
        note = f"{CAVEAT}; {unit_how}"
        form = Form(metric=family.name, scale=scale, note=note)
        port = next((label for label in PEER_PORT_LABELS if label in labels), None) if peer else None
        mapped = {"service": "job", **({"peer": peer} if peer else {})}
        if port:
            mapped["peer_port"] = port
        return Convention(name=name, title=name, labels=mapped, forms={"dependency.duration": form})
    status = next((label for label in STATUS_LABELS if label in labels), None)
    if where is None:
        return Lookalike(
            family.name, "duration", "neither a request's (no http/rpc/request token) nor a client's"
        )
    if status is None:
        return Lookalike(family.name, "server duration", "no status label, so errors cannot be told apart")
    name = f"inferred ({shape}, server side, status label {status}, {unit_how})"
    note = f"{CAVEAT}; {unit_how}"
    route = next((label for label in _ROUTE_LABELS if label in labels), None)
    forms = {
        "http.server.duration": Form(metric=family.name, scale=scale, note=note),
        "http.server.errors": Form(
            metric=f"{family.name}_count", matchers=((status, "=~", "5.."),), note=note
        ),
        "http.server.shed": Form(metric=f"{family.name}_count", matchers=((status, "=", "503"),), note=note),
    }
    mapped = {"service": "job", **({"route": route} if route else {})}
    return Convention(name=name, title=name, labels=mapped, forms=forms)


def _noun(parts: Iterable[str]) -> tuple[str, ...]:
    return tuple(_NOUNS.get(part, part) for part in parts)


@dataclass(frozen=True)
class Pairing:
    """A gauge and the limit it pairs with by name, unit and labels; it becomes a resource unless
    the gauge went above the limit over the day (:func:`overshoot_query`)."""

    prefix: tuple[str, ...]
    noun: tuple[str, ...]
    used: str
    limit: str
    #: The limit's own labels (beyond the target's), all of which the gauge has.
    labels: tuple[str, ...]
    #: The limit word on the limit's name (``limit``, ``max``...).
    word: str

    @property
    def counted(self) -> str:
        return " ".join(self.noun) or self.prefix[-1]


def _counted(prefix: tuple[str, ...], noun: tuple[str, ...]) -> frozenset[str]:
    """What a limit caps: its noun, or for a limit word at the end (``entries_limit``), the word before."""
    return frozenset(_noun(noun or prefix[-1:]))


def _pairings(
    families: Mapping[str, Family], labels: Mapping[str, frozenset[str]]
) -> tuple[list[Pairing], list[Lookalike], list[Rejection]]:
    """Gauges paired with their limits by name, unit and labels; what looks like a limit and
    has no gauge, and the pairs refused, with the reason."""
    limits: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[int, str, str]] = {}
    for family in families.values():
        # Not a queue's most (HAProxy's max_queue is the longest seen): that is saturation.
        parts = _count_limit(family.name) if family.type == "gauge" else None
        if parts is None:
            continue
        prefix, word, noun = parts
        rank = LIMIT_WORDS.index(word)
        key = (prefix, _noun(noun))
        if key not in limits or rank < limits[key][0]:
            limits[key] = (rank, family.name, word)
    pairs: list[Pairing] = []
    missed: list[Lookalike] = []
    refused: list[Rejection] = []
    limit_names = {name for _, name, _ in limits.values()}
    gauges = _gauges_by_prefix(families, limit_names)
    for (prefix, noun), (_, limit, word) in sorted(limits.items()):
        used = _sibling(gauges, prefix, noun)
        counted = _counted(prefix, noun)
        if not counted & _COUNT_NOUNS or counted & _NOT_A_COUNT:
            near = used or _sibling(gauges, prefix, noun, _NOT_A_COUNT)
            if near is not None:
                thing = " ".join(sorted(counted))
                refused.append(
                    Rejection(
                        f"inferred pair {near} / {limit}",
                        limit,
                        f"{limit} caps {thing!r}, not a count a server holds at once "
                        "(connections, clients, sessions, workers, threads, descriptors, entries)",
                    )
                )
            continue
        if used is None:
            if set(noun) & _RESOURCE_NOUNS:
                missed.append(
                    Lookalike(limit, "limit", "no gauge of the same prefix and noun counts what it limits")
                )
            continue
        found = _pairing(families, labels, prefix, noun, used, limit, word)
        if isinstance(found, Pairing):
            pairs.append(found)
        elif isinstance(found, Lookalike):
            missed.append(found)
        else:
            refused.append(found)
    return pairs, missed, refused


_GaugesByPrefix = dict[tuple[str, ...], list[tuple[str, tuple[str, ...]]]]


def _gauges_by_prefix(families: Mapping[str, Family], limits: set[str]) -> _GaugesByPrefix:
    """Every gauge that is not a limit, with its name's tokens, under each leading run of them
    (``a_b_c`` under ``()``, ``(a,)``, ``(a, b)`` and ``(a, b, c)``): built once, so pairing an
    estate's limits with their gauges costs one lookup per limit, not one pass over every family
    (20,000 families made that quadratic scan most of a diagnosis)."""
    index: _GaugesByPrefix = {}
    for family in families.values():
        if family.type != "gauge" or family.name in limits:
            continue
        parts = tokens(family.name)
        for end in range(len(parts) + 1):
            index.setdefault(parts[:end], []).append((family.name, parts))
    return index


def _sibling(
    gauges: _GaugesByPrefix,
    prefix: tuple[str, ...],
    noun: tuple[str, ...],
    words: frozenset[str] = _USAGE_WORDS,
) -> str | None:
    """The gauge of ``prefix`` and ``noun`` that counts what the limit caps (``words`` between
    them: ``current``, ``active``...), the one with the fewest such words."""
    best: tuple[int, str] | None = None
    for name, parts in gauges.get(prefix, ()):
        rest = parts[len(prefix) :]
        middle = rest[: len(rest) - len(noun)] if noun else rest
        if noun and _noun(rest[len(middle) :]) != noun:
            continue
        if (middle and not set(middle) <= words) or (not noun and not middle):
            continue
        if best is None or len(middle) < best[0]:
            best = (len(middle), name)
    return best[1] if best else None


def _pairing(
    families: Mapping[str, Family],
    labels: Mapping[str, frozenset[str]],
    prefix: tuple[str, ...],
    noun: tuple[str, ...],
    used: str,
    limit: str,
    word: str,
) -> Pairing | Lookalike | Rejection:
    limit_labels, used_labels = labels.get(limit), labels.get(used)
    if limit_labels is None or used_labels is None:
        return Lookalike(limit, "limit", f"no series of {limit} or {used} to read labels from")
    own = limit_labels - {"__name__", "job", "instance", "namespace"}
    if not own <= used_labels:
        return Lookalike(limit, "limit", f"{used} lacks the labels {sorted(own - used_labels)} of its limit")
    entry = f"inferred pair {used} / {limit}"
    if _NOT_COUNTS & set(tokens(used)):
        return Rejection(entry, limit, f"{used} is not a count (its name gives a unit or a rate)")
    units = {families[name].unit for name in (used, limit) if families[name].unit}
    if len(units) > 1:
        return Rejection(entry, limit, f"their units differ ({', '.join(sorted(units))})")
    return Pairing(prefix, noun, used, limit, tuple(sorted(own)), word)


def overshoot_query(pairing: Pairing) -> str:
    """The day's verdict on a pair, one number: 1 when the gauge, summed to the limit's labels, went
    above its limit (with the slack of ``OVERSHOOT_SHARE`` and ``OVERSHOOT_SLOTS``), plus 2 when the
    limit changed more than ``LIMIT_CHANGES`` times (a high-water mark, not a configured limit); 0
    when neither."""
    by = f"by ({', '.join((*TARGET_LABELS, *pairing.labels))})"
    # A limit of 0 is none (PgBouncer's max_connections, database/sql's max open): not exceeded.
    over = (
        f"sum {by} ({pairing.used}) > bool "
        f"((max {by} ({pairing.limit}) > 0) * {1 + OVERSHOOT_SHARE:g} + {OVERSHOOT_SLOTS})"
    )
    moving = f"max(changes({pairing.limit}[{OVERSHOOT_WINDOW}])) > bool {LIMIT_CHANGES}"
    return f"max(max_over_time(({over})[{OVERSHOOT_WINDOW}:{OVERSHOOT_STEP}])) + 2 * ({moving})"


def _verdict(pairing: Pairing, value: float) -> Rejection | None:
    entry = f"inferred pair {pairing.used} / {pairing.limit}"
    if value >= 2:
        return Rejection(
            entry,
            pairing.limit,
            f"{pairing.limit} changed more than {LIMIT_CHANGES} times in {OVERSHOOT_WINDOW}: "
            "a high-water mark, not a configured limit",
        )
    if value > 0:
        return Rejection(
            entry,
            pairing.limit,
            f"{pairing.used} went above {pairing.limit} in the last {OVERSHOOT_WINDOW}, "
            "so that is not its limit",
        )
    return None


def _resource(
    families: Mapping[str, Family], labels: Mapping[str, frozenset[str]], pairing: Pairing, checked: bool
) -> Resource:
    prefix, own = pairing.prefix, frozenset(pairing.labels)
    queued = [
        f.name
        for f in families.values()
        if f.type == "gauge"
        and limit_parts(f.name) is None
        and _queue_of(f.name, labels.get(f.name), prefix, own)
    ]
    refused = [
        f.name
        for f in families.values()
        if f.type == "counter" and _work_after(f.name, prefix, _REFUSAL_WORDS)
    ]
    noun_text = pairing.counted
    kind = _kind(_counted(prefix, pairing.noun))
    role = (
        "process" if kind == "file_descriptors" else "proxy" if queued or prefix[0] in _PROXIES else "server"
    )
    queue_text = f"; queue {', '.join(sorted(queued))}" if queued else ""
    label_text = (
        f"its labels {', '.join(pairing.labels)} on the gauge" if pairing.labels else "no labels of its own"
    )
    peak_text = "the gauge never above it over the day" if checked else "the day's peak not checked"
    how = (
        f"inferred (gauge {pairing.used} with its limit {pairing.limit}: both count {noun_text}, "
        f"{pairing.word!r} in the limit's name, {label_text}, {peak_text}{queue_text})"
    )
    return Resource(
        name=f"{'_'.join(prefix)} {noun_text}",
        kind=kind,
        used=pairing.used,
        limit=pairing.limit,
        labels=pairing.labels,
        queued=tuple(sorted(queued)),
        refused=tuple(sorted(refused)),
        how=how,
        caveat=CAVEAT,
        role=role,
    )


def _work_after(name: str, prefix: tuple[str, ...], words: frozenset[str]) -> bool:
    """``name`` is ``prefix`` then a word of ``words`` with only work nouns after it (HAProxy's
    ``current_queue``, redis's ``rejected_connections``; not ``lazyfree_pending_objects``)."""
    parts = tokens(name)
    if parts[: len(prefix)] != prefix:
        return False
    rest = parts[len(prefix) :]
    hits = [index for index, part in enumerate(rest) if part in words]
    # A CPU's run queue holds tasks, not requests waiting for this resource.
    return bool(hits) and set(rest[hits[0] + 1 :]) <= _WORK_NOUNS and not (_NOT_COUNTS | {"run"}) & set(rest)


def _queue_of(name: str, labels: frozenset[str] | None, prefix: tuple[str, ...], own: frozenset[str]) -> bool:
    """A queue in front of the resource: of its own prefix, or, since a proxy queues where its
    scheduler does (HAProxy holds a one-server backend's requests in the backend's queue, not the
    server's), of the exporter's other prefixes when it shares one of the resource's own labels
    and has no other (a backend's ``proxy`` beside a server's ``proxy`` and ``server``)."""
    if _work_after(name, prefix, _QUEUE_WORDS):
        return True
    parts = tokens(name)
    if not own or labels is None or parts[:1] != prefix[:1]:
        return False
    theirs = labels - {"__name__", "job", "instance", "namespace"}
    return bool(theirs) and theirs < own and _work_after(name, tuple(parts[:2]), _QUEUE_WORDS)


def _kind(noun: Iterable[str]) -> str:
    words = set(noun)
    if words & {"connections", "clients", "sessions", "backends", "sockets"}:
        return "connections"
    if words & {"fds", "files"}:
        return "file_descriptors"
    if words & {"workers", "threads"}:
        return "workers"
    return "other"
