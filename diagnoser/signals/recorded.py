"""Recorded conditions: a rule query's answer written by a ruler as a ``diag:*`` series.

A signal condition (or one of its ``any_of`` alternatives) may name the series a ruler records it
as (``record: diag:namespace_service_pool:pool_utilisation:ratio``, Prometheus'
``level:metric:operations`` naming under a ``diag:`` prefix). ``diagnose rules export --recording``
writes one recording rule per convention the condition expands to, labelled with the expansion's
fingerprint (``diag_query``) and the convention of this module (``diag_convention``), and beside
each a heartbeat series, :data:`PRESENT`, carrying the same labels: it exists exactly while the
ruler evaluates that rule, whether or not the condition has rows.

With ``prometheus.use_recorded``, the signal check reads the recorded series of an expansion whose
fingerprint has a heartbeat at the instant, and the raw query otherwise (:func:`substitute`, the
one place a query is swapped). A pack whose query changed has another fingerprint, so an old
recording is never read for a new query.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from diagnoser.models import SourceError
from diagnoser.signals.expand import Expansion
from diagnoser.sources.prometheus import PrometheusSource, Sample

__all__ = [
    "CONVENTION",
    "PRESENT",
    "RECORDING_LABELS",
    "fingerprint",
    "recorded_fingerprints",
    "recorded_query",
    "strip_recording_labels",
    "substitute",
    "valid_record_name",
]

#: The version of the recording convention: names, labels and how a fingerprint is taken. A
#: change here that a reader must not mix with older recordings bumps it.
CONVENTION = "1"
#: The heartbeat recorded beside every rule of the group (``vector(1)`` with its labels).
PRESENT = "diag:recorded:present"
#: Labels a recording adds to what the raw query answers; dropped when it is read back.
RECORDING_LABELS = frozenset({"__name__", "diag_query", "diag_convention", "diag_record"})
#: ``diag:<level>:<metric>:<operations>``.
_NAME = re.compile(r"^diag:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$")


def valid_record_name(name: str) -> bool:
    """Whether ``name`` is ``diag:<level>:<metric>:<operations>`` (lower case, digits, ``_``)."""
    return bool(_NAME.match(name))


def fingerprint(query: str) -> str:
    """A short, stable fingerprint of an expanded query (whitespace does not count)."""
    return hashlib.sha256(" ".join(query.split()).encode()).hexdigest()[:12]


def recorded_query(record: str, query: str) -> str:
    """The selector of ``query``'s recording under ``record``."""
    return f'{record}{{diag_convention="{CONVENTION}",diag_query="{fingerprint(query)}"}}'


async def recorded_fingerprints(source: PrometheusSource, at: datetime) -> dict[str, str] | SourceError:
    """The fingerprints whose recording a ruler writes at ``at``, and the series it writes each
    as (one query, shared by every rule at the instant)."""

    async def ask() -> dict[str, str] | SourceError:
        samples = await source.query(f'{PRESENT}{{diag_convention="{CONVENTION}"}}', at)
        if isinstance(samples, SourceError):
            return samples
        return {
            s.labels["diag_query"]: s.labels["diag_record"]
            for s in samples
            if valid_record_name(s.labels.get("diag_record", "")) and s.labels.get("diag_query")
        }

    return await source.shared(("recorded", at.timestamp()), ask)


def substitute(expansion: Expansion, present: Mapping[str, str]) -> Expansion | None:
    """The expansion reading its recording when a ruler writes one for this very query (any
    rule's condition that sends it, whichever named the ``record``); ``None`` otherwise."""
    record = present.get(fingerprint(expansion.query))
    if record is None:
        return None
    return replace(expansion, query=recorded_query(record, expansion.query))


def strip_recording_labels(samples: list[Sample]) -> list[Sample]:
    """A recording's answers with the labels the raw query's answers carry, no more."""
    return [
        replace(s, labels={k: v for k, v in s.labels.items() if k not in RECORDING_LABELS}) for s in samples
    ]
