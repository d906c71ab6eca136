"""Who an OpenTelemetry service is, from ``target_info``, where its ``job`` alone cannot say.

Prometheus' OTLP receiver writes a resource's ``service.namespace`` and ``service.name`` as one
``job`` label, ``namespace/name``, and its other resource attributes on a ``target_info`` series
of that ``job`` (and ``instance``). With ``otlp.keep_identifying_resource_attributes`` it keeps
``service.name`` and ``service.namespace`` there too, under the translation strategy's spelling
(``service_name`` escaped, ``service.name`` under the UTF-8 strategies). Read once per instant: a
``job`` with a slash in a name or namespace (``team/a/checkout``) splits one way only there.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from diagnoser.models import SourceError
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["IDENTITY_QUERY", "Identity", "identities", "identities_from"]

#: The ``target_info`` series of OTLP-pushed services (a ``job`` of ``namespace/name``).
IDENTITY_QUERY = 'target_info{job=~".+/.+"}'

#: A ``job``'s service and namespace (``None``: the resource had no namespace).
Identity = tuple[str, str | None]


def identities_from(rows: list[Mapping[str, str]]) -> dict[str, Identity]:
    """``job`` -> (service, namespace) from ``target_info`` label sets that name the service; a job
    whose rows disagree is left out (its ``job`` is split as written)."""
    found: dict[str, set[Identity]] = {}
    for labels in rows:
        job = labels.get("job")
        name = labels.get("service_name") or labels.get("service.name")
        if not job or not name:
            continue
        namespace = labels.get("service_namespace") or labels.get("service.namespace") or None
        found.setdefault(job, set()).add((name, namespace))
    return {job: next(iter(seen)) for job, seen in found.items() if len(seen) == 1}


async def identities(source: PrometheusSource, at: datetime) -> dict[str, Identity]:
    """What ``target_info`` says of each OTLP-pushed ``job`` at ``at``; nothing when it is absent or
    cannot be read (the ``job`` is then split at its slash)."""
    samples = await source.query(IDENTITY_QUERY, at)
    if isinstance(samples, SourceError):
        return {}
    return identities_from([sample.labels for sample in samples])
