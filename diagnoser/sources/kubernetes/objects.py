"""Reading Kubernetes API objects as the plain dicts :class:`KubernetesSource` returns.

Small pure functions over the documented object shapes: timestamps, resource quantities
(``500m``, ``256Mi``), status conditions, the workload a pod belongs to (ownerReferences:
Pod -> ReplicaSet -> Deployment) and event times. They tolerate missing fields, since the API
omits empty ones, and never raise on a malformed object: they answer ``None`` instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "condition",
    "event_time",
    "format_bytes",
    "labels_match",
    "parse_label_selector",
    "parse_quantity",
    "parse_time",
    "percentile",
    "replicaset_owners",
    "workload_of",
]

_SUFFIXES: dict[str, Decimal] = {
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "Ei": Decimal(1024**6),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 API timestamp (``2026-11-29T19:30:00Z``, with or without microseconds)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_quantity(value: Any) -> float | None:
    """A resource quantity as a number: ``500m`` -> 0.5, ``256Mi`` -> 268435456.0."""
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value.strip())
    if not match:
        return None
    try:
        return float(Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""])
    except InvalidOperation:
        return None


def format_bytes(value: float) -> str:
    """Bytes the way a memory limit is written: ``256Mi``, ``1.5Gi``."""
    for suffix, size in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if value >= size:
            scaled = value / size
            return f"{scaled:.0f}{suffix}" if scaled.is_integer() else f"{scaled:.1f}{suffix}"
    return f"{value:.0f}"


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind`` (``Ready``, ``ScalingActive``...), if present."""
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for entry in conditions or ():
        if isinstance(entry, dict) and entry.get("type") == kind:
            return entry
    return None


def event_time(event: Mapping[str, Any]) -> datetime | None:
    """When an event last happened: series.lastObservedTime, lastTimestamp, eventTime or creation time."""
    series = event.get("series")
    if isinstance(series, dict):
        observed = parse_time(series.get("lastObservedTime"))
        if observed:
            return observed
    metadata = event.get("metadata")
    created = metadata.get("creationTimestamp") if isinstance(metadata, dict) else None
    for value in (event.get("lastTimestamp"), event.get("eventTime"), created):
        parsed = parse_time(value)
        if parsed:
            return parsed
    return None


def replicaset_owners(replicasets: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """``(namespace, replicaset) -> deployment`` for ReplicaSets a Deployment controls."""
    owners: dict[tuple[str, str], str] = {}
    for rs in replicasets:
        metadata = rs.get("metadata") or {}
        for ref in metadata.get("ownerReferences") or ():
            if ref.get("kind") == "Deployment" and ref.get("controller", True):
                owners[(str(metadata.get("namespace", "")), str(metadata.get("name", "")))] = str(
                    ref.get("name")
                )
    return owners


def workload_of(pod: Mapping[str, Any], rs_owners: Mapping[tuple[str, str], str]) -> tuple[str, str]:
    """``(kind, name)`` of the workload running ``pod``: ``("Deployment", "web")``, ``("StatefulSet", "db")``.

    A ReplicaSet's owner comes from ``rs_owners``; when the ReplicaSet is unknown (not readable),
    the Deployment name is its name without the ``pod-template-hash`` suffix, as the controller
    names it. A pod without a controller is its own workload.
    """
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    refs = [r for r in metadata.get("ownerReferences") or () if r.get("controller", True)]
    if not refs:
        return "Pod", str(metadata.get("name", ""))
    ref = refs[0]
    kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
    if kind == "ReplicaSet":
        deployment = rs_owners.get((namespace, name))
        if deployment:
            return "Deployment", deployment
        template_hash = (metadata.get("labels") or {}).get("pod-template-hash")
        if template_hash and name.endswith(f"-{template_hash}"):
            return "Deployment", name[: -len(template_hash) - 1]
    return kind, name


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (``fraction`` 0.99 for p99); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


_SELECTOR_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.-]*))?\s*$")


def parse_label_selector(selector: str) -> list[tuple[str, str, str | None]]:
    """An equality-based label selector (``app=web,tier!=cache,canary,!legacy``) as ``(op, key, value)``.

    Raises ``ValueError`` for anything else (set-based ``in (...)`` terms are not supported).
    """
    terms: list[tuple[str, str, str | None]] = []
    for raw in filter(None, (part.strip() for part in selector.split(","))):
        match = _SELECTOR_TERM.match(raw)
        if not match:
            raise ValueError(
                f"unsupported label selector term {raw!r} (use key=value, key!=value, key, !key)"
            )
        negated, key, op, value = match.groups()
        if negated and op:
            raise ValueError(f"unsupported label selector term {raw!r}")
        kind = "!" if negated else ("exists" if op is None else ("!=" if op == "!=" else "="))
        terms.append((kind, key, value))
    return terms


def labels_match(labels: Mapping[str, str], terms: list[tuple[str, str, str | None]]) -> bool:
    """Whether ``labels`` satisfy every parsed selector term."""
    for op, key, value in terms:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
    return True
