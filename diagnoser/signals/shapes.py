"""What a metric family is, from its series' names, its labels and (where served) its metadata.

Pure functions over names and label sets, used by :mod:`diagnoser.signals.infer`: families are
grouped from series names (``x_bucket`` with ``x_count`` and ``x_sum`` is a histogram, ``x_count``
with ``x_sum`` a summary, ``x_total`` a counter; a series ``x`` whose samples are native
histograms, as Prometheus 3 keeps them, a native histogram), typed by ``/api/v1/metadata`` when
Prometheus has it for the family, and their names split into tokens to read what they measure (a time unit, a
client or server side, a limit, a queue, refusals).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

__all__ = [
    "CLIENT_PEER_LABELS",
    "CLIENT_TOKENS",
    "LIMIT_WORDS",
    "PEER_LABELS",
    "PEER_PORT_LABELS",
    "STATUS_LABELS",
    "Family",
    "families_of",
    "limit_parts",
    "native_candidates",
    "time_unit",
    "tokens",
]

#: Labels that carry an HTTP or RPC status.
STATUS_LABELS = (
    "http_response_status_code",
    "http_status_code",
    "status_code",
    "response_code",
    "code",
    "status",
)
#: Labels that name the other end of a client call, in the order preferred as ``peer``: the
#: semantic conventions' names first, then the ones services instrumented by hand choose
#: (client_golang's curried ``upstream``, ``peer``, ``target``), then the vaguer ``host``, ``server``.
#: Not ``service``: scrapes in Kubernetes put the target's own Service there.
PEER_LABELS = (
    "server_address", "net_peer_name", "net_peer_address", "peer_service", "upstream", "peer", "target",
    "db_system", "host", "server",
)
#: Peer labels that make a duration a client's by themselves, whatever its name says.
CLIENT_PEER_LABELS = PEER_LABELS[:6]
#: The port beside a peer, where the metric carries one.
PEER_PORT_LABELS = ("server_port", "net_peer_port")
CLIENT_TOKENS = frozenset({"client", "outbound", "upstream", "egress"})
SERVER_TOKENS = frozenset({"server", "handler", "inbound"})
_REQUEST_TOKENS = frozenset({"http", "request", "requests", "rpc", "grpc", "api", "handler", "route"})
_DURATION_TOKENS = frozenset({"duration", "latency", "time", "seconds", "milliseconds", "ms"})
_TIME_SUFFIXES = {
    "seconds": "seconds",
    "milliseconds": "milliseconds",
    "ms": "milliseconds",
    "microseconds": "microseconds",
    "us": "microseconds",
    "nanoseconds": "nanoseconds",
    "ns": "nanoseconds",
}
#: Metadata units (OpenMetrics ``# UNIT``, OTel's UCUM) for time.
_METADATA_UNITS = {
    "s": "seconds",
    "seconds": "seconds",
    "ms": "milliseconds",
    "milliseconds": "milliseconds",
    "us": "microseconds",
    "microseconds": "microseconds",
    "ns": "nanoseconds",
}
#: Words before a noun that make a limit (``limit_sessions``, ``max_fds``), most specific first:
#: HAProxy's ``max_sessions`` is the highest count seen, its ``limit_sessions`` the configured one.
LIMIT_WORDS = ("limit", "capacity", "max", "maximum", "size")
_FUSED_LIMITS = {
    "maxconn": "connections",
    "maxconns": "connections",
    "maxclients": "clients",
    "maxsessions": "sessions",
    "maxconnections": "connections",
}
#: Words in a limit's prefix that say where it is configured (``redis_config_maxclients``).
_CONFIG_WORDS = frozenset({"config", "configured", "settings", "spec"})


@dataclass(frozen=True)
class Family:
    """One metric family: its name, type, unit and help, and where each came from."""

    name: str
    type: str
    #: ``metadata`` when Prometheus described it, else ``name`` (read from the series' names).
    typed_by: str
    unit: str = ""
    help: str = ""
    #: For a histogram: ``classic`` (``_bucket`` series), ``native`` (one series of histograms) or ``both``.
    histogram: str = ""

    @property
    def series(self) -> tuple[str, ...]:
        if self.type == "histogram":
            classic = (f"{self.name}_bucket", f"{self.name}_count", f"{self.name}_sum")
            if self.histogram == "native":
                return (self.name,)
            return (self.name, *classic) if self.histogram == "both" else classic
        if self.type == "summary":
            return (self.name, f"{self.name}_count", f"{self.name}_sum")
        return (self.name,)


@functools.lru_cache(maxsize=1 << 17)
def tokens(name: str) -> tuple[str, ...]:
    """The words of a name (``HTTP_server__requests`` -> ``("http", "server", "requests")``), cached:
    recognition asks for the same names' words many times over, on estates of 20,000 families."""
    return tuple(part for part in name.lower().split("_") if part)


def families_of(
    names: Iterable[str], metadata: Mapping[str, Mapping[str, str]], native: Iterable[str] = ()
) -> dict[str, Family]:
    """Every family the series names make up; ``metadata`` (family -> type, unit, help) refines.

    ``native`` names the series known to hold native histograms (their samples said so); a name
    that metadata types ``histogram`` and that has no ``_bucket`` series is one too.
    """
    present = set(names)
    natives = {n for n in present if n in set(native) or _native_by_metadata(n, present, metadata)}
    families: dict[str, Family] = {}
    grouped: set[str] = set()
    for name in sorted(present):
        if name.endswith("_count") and f"{name[:-6]}_sum" in present:
            base = name[:-6]
            shape = "histogram" if f"{base}_bucket" in present else "summary"
            family = _family(base, shape, metadata)
            if family.type == "histogram":
                family = replace(family, histogram="both" if base in natives else "classic")
            families[base] = family
            grouped.update((name, f"{base}_sum", f"{base}_bucket"))
    for name in sorted(natives - grouped):
        if name not in families:
            family = _family(name, "histogram", metadata)
            typed_by = family.typed_by if family.typed_by == "metadata" else "samples"
            families[name] = replace(family, type="histogram", histogram="native", typed_by=typed_by)
    for name in sorted(present - grouped):
        if name in families:
            continue
        shape = "counter" if name.endswith("_total") else "gauge"
        family = _family(name.removesuffix("_total") if shape == "counter" else name, shape, metadata)
        families[name] = Family(name, family.type, family.typed_by, family.unit, family.help)
    return families


def _native_by_metadata(name: str, present: set[str], metadata: Mapping[str, Mapping[str, str]]) -> bool:
    meta = metadata.get(name) or {}
    return meta.get("type") == "histogram" and f"{name}_bucket" not in present


def _family(name: str, shape: str, metadata: Mapping[str, Mapping[str, str]]) -> Family:
    meta = metadata.get(name) or {}
    kind = str(meta.get("type") or "")
    if kind in ("histogram", "summary", "counter", "gauge"):
        return Family(name, kind, "metadata", str(meta.get("unit") or ""), str(meta.get("help") or ""))
    return Family(name, shape, "name")


def native_candidates(names: Iterable[str], metadata: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Names that may hold native histograms of durations, whose samples must say: a name with no
    classic part of its own (``_bucket``, ``_count``, ``_sum``, ``_total``) that metadata does not
    type as something else, and that reads as a duration."""
    present = set(names)
    found = []
    for family in families_of(present, metadata).values():
        if family.type not in ("gauge", "histogram") or (family.type == "histogram" and family.histogram):
            continue
        if _classic_part(family.name, present):
            continue
        if family.typed_by == "metadata" and family.type != "histogram":
            continue
        if time_unit(family)[0] is not None or _DURATION_TOKENS & set(tokens(family.name)):
            found.append(family.name)
    return sorted(found)


def _classic_part(name: str, present: set[str]) -> bool:
    """A classic histogram's series by its name, even where its family lacks a part (a ``_sum``
    dropped by relabelling): ``X_bucket``, or ``X_count``/``X_sum`` beside ``X_bucket``."""
    if name.endswith("_bucket"):
        return True
    base = name.removesuffix("_count").removesuffix("_sum")
    return base != name and f"{base}_bucket" in present


def time_unit(family: Family) -> tuple[str | None, str]:
    """The family's time unit and how it is known (``metadata``, ``name``), or ``None``."""
    unit = _METADATA_UNITS.get(family.unit.lower()) if family.unit else None
    if unit:
        return unit, "metadata"
    parts = tokens(family.name)
    if parts and parts[-1] in _TIME_SUFFIXES:
        return _TIME_SUFFIXES[parts[-1]], "name"
    return None, ""


def is_duration(family: Family) -> bool:
    """A histogram or summary whose name or unit says it times something."""
    if family.type not in ("histogram", "summary"):
        return False
    return time_unit(family)[0] is not None or bool(_DURATION_TOKENS & set(tokens(family.name)))


def side(family: Family, labels: frozenset[str]) -> str | None:
    """``server`` or ``client`` for a request duration, ``None`` when it is no request's."""
    parts = set(tokens(family.name))
    if parts & CLIENT_TOKENS:
        return "client"
    if parts & SERVER_TOKENS:
        return "server"
    if any(label in labels for label in CLIENT_PEER_LABELS):
        return "client"
    return "server" if parts & _REQUEST_TOKENS else None


def limit_parts(name: str) -> tuple[tuple[str, ...], str, tuple[str, ...]] | None:
    """``(prefix, limit word, noun)`` of a limit's name (``haproxy_server_limit_sessions`` ->
    ``(("haproxy", "server"), "limit", ("sessions",))``), or ``None`` for any other name."""
    parts = tokens(name)
    for index, part in enumerate(parts):
        if part in _FUSED_LIMITS:
            noun: tuple[str, ...] = (_FUSED_LIMITS[part],)
            word = "max"
        elif part in LIMIT_WORDS and index > 0:
            noun, word = tuple(parts[index + 1 :]), part
        else:
            continue
        prefix = list(parts[:index])
        while prefix and prefix[-1] in _CONFIG_WORDS:
            prefix.pop()
        return (tuple(prefix), word, noun) if prefix else None
    return None
