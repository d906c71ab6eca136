"""Which label of a client-side duration names the peer: a known name, else the one that splits the slowdown.

Client histograms name the called peer however their authors chose: OpenTelemetry's
``server_address``, client_golang's curried ``upstream`` or ``peer``, a hand-written
``dest_service`` or ``callee``. Known names are taken first (:data:`~diagnoser.signals.shapes.PEER_LABELS`,
then gRPC's service labels). For a name nobody anticipated, the labels that are known to be no
peer (the target's, the bucket bound, the method, the status, the route, the scheme, the
instrumentation scope...) are set aside; when one label is left it is the peer, and when several
are, the one whose values split the slowdown: the label under which one value's mean duration
rose the most against its own lowest of the last hour (a finer split, ``dest_service`` beside
``dest_zone``, isolates the slow peer and rises more). :func:`split_query` asks that of
Prometheus in one query per family; recognition runs it only for families with several candidates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from diagnoser.promql import label_name, quote
from diagnoser.signals.shapes import PEER_LABELS, Family

__all__ = ["SPLIT_LABEL", "peer_candidates", "pick_peer", "split_query"]

#: Known peer names beyond the HTTP ones: the called gRPC service, in order of preference.
_RPC_PEER_LABELS = ("rpc_service", "grpc_service")
#: Labels known to be no peer: the target's (``service`` is the target's own Service in Kubernetes),
#: histogram and summary bounds, and the request's own dimensions.
_NOT_PEERS = frozenset(
    {
        "job", "instance", "namespace", "pod", "container", "node", "service", "endpoint", "le",
        "quantile", "method", "code", "status", "route", "handler", "path", "uri", "url", "scheme",
        "outcome", "result", "error", "exception", "reason", "type", "kind", "operation", "direction",
        "version", "grpc_method", "grpc_type", "grpc_code", "rpc_method", "rpc_system", "protocol",
        "cached", "retry", "attempt", "success",
    }
)  # fmt: skip
#: Name parts that make a label a request dimension (``http_request_method``, ``status_code``,
#: ``network_protocol_version``, ``otel_scope_name``, ``server_port``...).
_NOT_PEER_PREFIXES = ("otel_", "network_", "url_", "http_request_", "http_response_", "__")
_NOT_PEER_SUFFIXES = (
    "_code",
    "_status",
    "_method",
    "_version",
    "_type",
    "_scheme",
    "_port",
    "_route",
    "_path",
)
#: The label the split query writes each answer's candidate into.
SPLIT_LABEL = "diagnoser_split_label"
#: The split is judged on 5-minute means against their lowest over the last hour: the baseline
#: window of dependency-slow, and an hour so that a recording with 10 minutes of history still
#: has one (checked on the py-hand-dest-slow and go-http-peer-slow beds).
_SPLIT_WINDOW = "5m"
_SPLIT_LOOKBACK = "1h"


def _is_dimension(label: str) -> bool:
    lowered = label.lower()
    return (
        lowered in _NOT_PEERS
        or lowered.startswith(_NOT_PEER_PREFIXES)
        or lowered.endswith(_NOT_PEER_SUFFIXES)
    )


def peer_candidates(labels: Iterable[str]) -> tuple[tuple[str, ...], str]:
    """The labels that may name the peer, and how they were found: one known name, or every
    label that is no known request dimension (sorted)."""
    present = set(labels)
    known = next((label for label in (*PEER_LABELS, *_RPC_PEER_LABELS) if label in present), None)
    if known is not None:
        return (known,), "known"
    return tuple(sorted(label for label in present if not _is_dimension(label))), "left"


def pick_peer(labels: Iterable[str], splits: Mapping[str, float] | None = None) -> tuple[str | None, str]:
    """The peer label and how it was chosen (said in the inferred convention's name)."""
    candidates, how = peer_candidates(labels)
    if not candidates:
        return None, "no peer label"
    if how == "known":
        return candidates[0], f"peer label {candidates[0]}"
    if len(candidates) == 1:
        return candidates[0], f"peer label {candidates[0]} (the one label beside known dimensions)"
    scored = {label: splits[label] for label in candidates if splits and label in splits}
    if not scored:
        return None, f"no peer label (candidates {', '.join(candidates)} not compared)"
    best = max(sorted(scored), key=lambda label: scored[label])
    return best, f"peer label {best} (of {', '.join(candidates)}, the one whose values split the slowdown)"


def _mean(family: Family, by: str, window: str) -> str:
    if family.histogram == "native":
        parts = (
            f"histogram_sum(rate({family.name}[{window}]))",
            f"histogram_count(rate({family.name}[{window}]))",
        )
    else:
        parts = (f"rate({family.name}_sum[{window}])", f"rate({family.name}_count[{window}])")
    return f"(sum by ({by}) ({parts[0]}) / sum by ({by}) ({parts[1]}))"


def split_query(family: Family, candidates: Iterable[str]) -> str:
    """Per candidate label, the largest rise of one of its values' mean against that value's
    lowest 5-minute mean of the hour (each answer tagged with its label in :data:`SPLIT_LABEL`)."""
    parts = []
    for label in sorted(candidates):
        by = f"namespace, job, {label_name(label)}"
        mean = _mean(family, by, _SPLIT_WINDOW)
        rise = f"max({mean} / min_over_time({mean}[{_SPLIT_LOOKBACK}:{_SPLIT_WINDOW}]))"
        parts.append(f'label_replace({rise}, "{SPLIT_LABEL}", {quote(label)}, "__name__", ".*")')
    return " or ".join(parts)
