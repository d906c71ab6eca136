"""Which of a finding's labels say what it is about, and which change from one scrape to the next.

A finding's identity (:func:`~diagnoser.models.finding_identity`) is its rule, its cause and the
labels of its subject. Some exporters put things in labels whose values change every scrape:
redis_exporter's ``redis_exporter_last_scrape_error{err="write tcp 127.0.0.1:37908->127.0.0.1:6379:
write: broken pipe"}`` carries an ephemeral port, others an error text, a timestamp or a scrape
duration. A finding keyed by such a label is a new finding every cycle: a new incident that
never holds long enough to be told, and a "resolved" for the old one.

Two layers decide, as the signal catalogue and recognition do for metric names:

- :data:`VOLATILE_LABEL_NAMES`, the catalogue: label names known to hold such values, each with
  the software that writes it;
- :func:`looks_volatile`, recognition by what the value is: an error text, an address with an
  ephemeral port, a timestamp, a duration.

The labels that name a subject (:data:`SUBJECT_LABELS`: ``instance``, ``job``, ``pod``...) are
never dropped, whatever their values look like (an ``instance`` on an ephemeral port is still
the instance). The daemon adds a third layer: a label whose value changes between consecutive
evaluations while the rest of the identity holds (:mod:`diagnoser.daemon.volatile`). ::

    stable_labels({"instance": "127.0.0.1:9121", "err": "read tcp ...: connection reset by peer"})
    # {"instance": "127.0.0.1:9121"}
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

__all__ = ["SUBJECT_LABELS", "VOLATILE_LABEL_NAMES", "looks_volatile", "stable_labels"]

#: Labels that name what a finding is about: kept in its identity whatever their values look like.
SUBJECT_LABELS: frozenset[str] = frozenset(
    {
        "cluster", "namespace", "service", "job", "instance", "pod", "container", "node", "pool",
        "target", "host", "server_address", "client_service", "cmd", "queue", "topic", "index",
        "resource", "area", "type", "breaker", "deployment", "horizontalpodautoscaler",
    }
)  # fmt: skip

#: Label names whose values change between scrapes, as real software writes them (names
#: compared with ``.`` read as ``_`` and case ignored).
VOLATILE_LABEL_NAMES: Mapping[str, str] = {
    # oliver006/redis_exporter: redis_exporter_last_scrape_error{err} holds the Go error text of the
    # last scrape, with the exporter's ephemeral port when the connection broke.
    "err": "redis_exporter last scrape error text",
    "error": "error text (exporters' last-error gauges)",
    "error_message": "error text",
    "last_error": "error text (blackbox-style last error)",
    # OpenTelemetry's exception.message (semantic conventions; error.type is a class and stays).
    "exception_message": "OpenTelemetry exception.message",
    "exception_stacktrace": "OpenTelemetry exception.stacktrace",
    "message": "free text",
    "msg": "free text",
    # Scrape metadata some exporters label their own health gauges with.
    "scrape_duration": "scrape duration",
    "scrape_duration_seconds": "scrape duration",
    "duration": "a measured duration",
    "timestamp": "a timestamp",
    "time": "a timestamp",
    # The client side of a connection: the peer's ephemeral port (OpenTelemetry network.peer.port
    # on a server span, the older net.sock.peer.port, client.port).
    "client_port": "OpenTelemetry client.port",
    "network_peer_port": "OpenTelemetry network.peer.port",
    "net_sock_peer_port": "OpenTelemetry net.sock.peer.port (older conventions)",
    "source_port": "a connection's source port",
    "remote_port": "a connection's remote port",
    "trace_id": "a trace id",
    "span_id": "a span id",
    "request_id": "a request id",
}

#: Linux's default ``ip_local_port_range`` starts at 32768; IANA's dynamic range at 49152.
_EPHEMERAL_PORT_MIN = 32768
_ADDRESS = re.compile(r"^\[?[\w.:%-]*?\]?:(\d{1,5})$")
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2})?")
_EPOCH = re.compile(r"^\d{10}(\d{3})?(\.\d+)?$")
_DURATION = re.compile(r"^\d+(\.\d+)?(ns|us|µs|ms|s|m)$")
#: Words of an error text (Go's net errors, errno texts, HTTP client errors).
_ERROR_WORDS = re.compile(
    r"(?i)\b(error|err|failed|refused|reset|broken pipe|timeout|timed out|i/o|eof|unreachable|denied|"
    r"closed|no route|no such host|dial|read|write|cannot|could not|unable)\b"
)


def _normalised(name: str) -> str:
    return name.replace(".", "_").lower()


def looks_volatile(name: str, value: str) -> bool:
    """Whether ``name=value`` reads like something that changes between scrapes: a catalogued name,
    an error text, an address with an ephemeral port, a timestamp or a duration."""
    if name in SUBJECT_LABELS or not value:
        return False
    if _normalised(name) in VOLATILE_LABEL_NAMES:
        return True
    if " " in value and (_ERROR_WORDS.search(value) or ":" in value):
        return True  # a sentence with an error's words, or "a: b" (Go's wrapped errors)
    address = _ADDRESS.match(value)
    if address and int(address.group(1)) >= _EPHEMERAL_PORT_MIN:
        return True
    return bool(_TIMESTAMP.match(value) or _EPOCH.match(value) or _DURATION.match(value))


def stable_labels(labels: Mapping[str, str], also_volatile: Collection[str] = ()) -> dict[str, str]:
    """``labels`` without those that change between scrapes (and without ``also_volatile``, names
    the daemon saw change)."""
    return {
        name: value
        for name, value in labels.items()
        if name not in also_volatile and not looks_volatile(name, value)
    }
