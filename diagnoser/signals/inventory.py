"""What a Prometheus holds, as the rules will read it: the inventory ``diagnose signals`` prints.

For one instant: every signal a catalogued convention or recognition by shape answers, per
service (the scrape job, or the label a convention maps ``service`` to), with the metric, the unit
it is read in, the normalised labels and how it was recognised; every resource with a limit; and
what looks like a request duration or a limit but was not recognised, with the reason; and every
catalogue entry or inferred pair considered and not used, with the reason (a limit its gauge went
above, a status or a cluster size, an entry some of whose series are absent). This is
how a user learns why a rule had no data. It costs one ``group by`` query per present form (a
command run by hand, not a rule).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from diagnoser.models import SourceError
from diagnoser.promql import held, kind_from_names, label_name, quote
from diagnoser.signals.catalogue import TIME_UNITS, Catalogue, Convention, Form
from diagnoser.signals.claims import claims
from diagnoser.signals.holdings import holdings, resolve
from diagnoser.signals.infer import Recognition
from diagnoser.signals.otlp import escape_label
from diagnoser.signals.recognition import recognition
from diagnoser.signals.resources import Resource
from diagnoser.signals.shapes import STATUS_LABELS
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["Inventory", "Recognised", "Rejected", "Unrecognised", "inventory"]

_UNITS_BY_SCALE = {scale: unit for unit, scale in TIME_UNITS.items()}


@dataclass(frozen=True)
class Recognised:
    """One signal (or resource) of one service and how it was recognised."""

    service: str
    signal: str
    convention: str
    inferred: bool
    metric: str
    unit: str
    labels: dict[str, str]
    caveat: str | None = None
    #: How Prometheus holds a histogram: ``classic`` (``_bucket`` series), ``native`` or ``both``.
    histogram: str | None = None


@dataclass(frozen=True)
class Unrecognised:
    service: str
    metric: str
    looks_like: str
    reason: str


@dataclass(frozen=True)
class Rejected:
    """A catalogue entry or an inferred pair considered for a service and not used, and why."""

    service: str
    entry: str
    metric: str
    reason: str


@dataclass
class Inventory:
    recognised: list[Recognised] = field(default_factory=list)
    unrecognised: list[Unrecognised] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)

    def services(self) -> list[str]:
        return sorted(
            {r.service for r in self.recognised}
            | {u.service for u in self.unrecognised}
            | {r.service for r in self.rejected}
        )


def _unit(form: Form, catalogue: Catalogue, signal: str) -> str:
    unit = catalogue.signals[signal].unit
    if unit != "seconds" or form.scale == 1.0:
        return unit
    return f"{_UNITS_BY_SCALE.get(form.scale, f'x{form.scale:g}')}, read as seconds"


async def _services(
    source: PrometheusSource, selector: str, label: str, at: datetime
) -> list[str] | SourceError:
    samples = await source.query(f"group by ({label_name(label)}) ({selector})", at)
    if isinstance(samples, SourceError):
        return samples
    return sorted({s.labels.get(label, "") for s in samples} - {""})


def _present_forms(
    catalogue: Catalogue, conventions: list[Convention], names: set[str]
) -> list[tuple[Convention, str, Form]]:
    return [
        (convention, signal, form)
        for convention in conventions
        for signal, form in convention.forms.items()
        if signal in catalogue.signals and _present(form, catalogue.signals[signal].type, names)
    ]


def _present(form: Form, kind: str, names: set[str]) -> bool:
    """A form's series are there: a gauge's or counter's name; a histogram's classic series, or
    its own name as a native histogram."""
    if kind != "histogram":
        return held(form.metric, names)
    return kind_from_names(form.metric, names) is not None


def _presence(form: Form, histogram: bool) -> str:
    """The selector of a form's series, a status value matcher read as "the status label is set":
    a service that had no 5xx has its errors signal all the same.

    Only the value is let go, not the label: the status label's name is what tells one library's
    family from another's under the same name (promhttp's ``code``, prom-client's
    ``status_code``), and with it dropped prom-client's service was listed under promhttp.
    """
    kept = tuple(
        m if escape_label(m[0]) not in STATUS_LABELS or _asks_presence(m[1], m[2]) else (m[0], "!=", "")
        for m in form.matchers
    )
    return Form(metric=form.metric, matchers=kept).selector("_count" if histogram else "")


def _asks_presence(op: str, value: str) -> bool:
    """A matcher that selects on whether a label is set, not on its value."""
    return (op in ("=", "!=") and value == "") or (op == "=~" and value in (".+", ".*"))


async def _signal_rows(
    source: PrometheusSource,
    catalogue: Catalogue,
    found: Recognition,
    names: set[str],
    at: datetime,
    lookback_s: float,
) -> tuple[list[Recognised], list[Rejected], list[SourceError]]:
    """Each service's signals, the convention that answers each, and per service the conventions
    present under the same name that did not: their labels do not fit its series, or one earlier in
    catalogue order answered first."""
    inferred = {c.name for c in found.conventions}
    # OpenTelemetry conventions in whichever OTLP spelling the server holds them.
    held_now = await holdings(source, catalogue, names, at, lookback_s)
    # The forms whose families' labels fit them (signals.claims); the rest are listed as rejected.
    claimed = await claims(source, catalogue, at, lookback_s)
    conventions = catalogue.conventions if isinstance(claimed, SourceError) else claimed.conventions
    catalogued = [resolve(c, held_now) for c in conventions]
    present = _present_forms(catalogue, [*catalogued, *found.conventions], names)
    histograms = [catalogue.signals[signal].type == "histogram" for _, signal, _ in present]
    selectors = [
        _presence(form, histogram) for (_, _, form), histogram in zip(present, histograms, strict=True)
    ]
    # Who holds each name at all, whatever its labels: a service that has the name and not a
    # convention's labels is told why that convention is not its.
    bare = sorted(
        {
            (Form(metric=form.metric).selector("_count" if histogram else ""), c.source_label("service"))
            for (c, _, form), histogram in zip(present, histograms, strict=True)
        }
    )
    answers, holders = await asyncio.gather(
        asyncio.gather(
            *(
                _services(source, sel, c.source_label("service"), at)
                for sel, (c, _, _) in zip(selectors, present, strict=True)
            )
        ),
        asyncio.gather(*(_services(source, sel, label, at) for sel, label in bare)),
    )
    holding = dict(zip(bare, holders, strict=True))
    rows: list[Recognised] = []
    rejected: list[Rejected] = []
    errors: list[SourceError] = []
    answered: dict[tuple[str, str], str] = {}
    for (convention, signal, form), histogram, services in zip(present, histograms, answers, strict=True):
        if isinstance(services, SourceError):
            errors.append(services)
            continue
        held_by = holding[(Form(metric=form.metric).selector("_count" if histogram else ""),
                           convention.source_label("service"))]  # fmt: skip
        if not isinstance(held_by, SourceError) and convention.name not in inferred:
            rejected.extend(
                Rejected(
                    service=service,
                    entry=convention.name,
                    metric=form.metric,
                    reason=f"{signal}: its {form.metric} series lack the labels of {form.selector()}",
                )
                for service in sorted(set(held_by) - set(services))
            )
        for service in services:
            first = answered.get((service, signal))
            if first is not None:  # the first convention in catalogue order answers
                if first != convention.name:
                    rejected.append(
                        Rejected(
                            service=service,
                            entry=convention.name,
                            metric=form.metric,
                            reason=f"{signal}: {first} answers it first (catalogue order)",
                        )
                    )
                continue
            answered[(service, signal)] = convention.name
            rows.append(
                Recognised(
                    service=service,
                    signal=signal,
                    convention=convention.name,
                    inferred=convention.name in inferred,
                    metric=form.selector(),
                    unit=_unit(form, catalogue, signal),
                    labels=dict(convention.labels),
                    caveat=form.note,
                    histogram=kind_from_names(form.metric, names) if histogram else None,
                )
            )
    return rows, rejected, errors


async def _resource_rows(
    source: PrometheusSource, resources: tuple[Resource, ...], at: datetime
) -> tuple[list[Recognised], list[SourceError]]:
    answers = await asyncio.gather(*(_services(source, r.used, "job", at) for r in resources))
    rows: list[Recognised] = []
    errors: list[SourceError] = []
    for resource, services in zip(resources, answers, strict=True):
        if isinstance(services, SourceError):
            errors.append(services)
            continue
        rows.extend(
            Recognised(
                service=service,
                signal=f"resource ({resource.kind}, {resource.role}): {resource.name}",
                convention=resource.how,
                inferred=resource.how.startswith("inferred"),
                metric=" ".join(f"{resource.used} / {resource.limit}".split()),
                unit="count",
                labels={"service": "job", **{label: label for label in resource.labels}},
                caveat=resource.caveat,
            )
            for service in services
        )
    return rows, errors


async def _jobs_of(
    source: PrometheusSource, metrics: set[str], names: set[str], at: datetime
) -> dict[str, list[str]] | SourceError:
    """The jobs each of ``metrics`` (a family, or its ``_count`` series) has series in."""
    by_series = {name: metric for metric in metrics for name in (metric, f"{metric}_count") if name in names}
    if not by_series:
        return {}
    matcher = "{__name__=~" + quote("|".join(sorted(by_series))) + "}"
    samples = await source.query(f"group by (__name__, job) ({matcher})", at)
    if isinstance(samples, SourceError):
        return samples
    jobs: dict[str, set[str]] = {}
    for sample in samples:
        metric = by_series.get(sample.labels.get("__name__", ""))
        if metric is not None:
            jobs.setdefault(metric, set()).add(sample.labels.get("job", ""))
    return {metric: sorted(found) for metric, found in jobs.items()}


async def _unrecognised_rows(
    source: PrometheusSource, found: Recognition, names: set[str], at: datetime
) -> tuple[list[Unrecognised], list[Rejected], list[SourceError]]:
    metrics = {item.metric for item in found.lookalikes} | {item.metric for item in found.rejected}
    jobs = await _jobs_of(source, metrics, names, at)
    if isinstance(jobs, SourceError):
        return [], [], [jobs]
    missed = sorted(
        {
            Unrecognised(service=job, metric=item.metric, looks_like=item.looks_like, reason=item.reason)
            for item in found.lookalikes
            for job in jobs.get(item.metric, [])
        },
        key=lambda u: (u.service, u.metric),
    )
    rejected = sorted(
        {
            Rejected(service=job, entry=item.entry, metric=item.metric, reason=item.reason)
            for item in found.rejected
            for job in jobs.get(item.metric, [])
        },
        key=lambda r: (r.service, r.entry),
    )
    return missed, rejected, []


async def inventory(
    source: PrometheusSource, catalogue: Catalogue, at: datetime, lookback_s: float
) -> Inventory:
    """Everything recognised at ``at``; a failing source is an error entry, never an exception."""
    names = await source.metric_names(at, lookback_s)
    if isinstance(names, SourceError):
        return Inventory(errors=[names])
    found = await recognition(source, catalogue, at, lookback_s)
    if isinstance(found, SourceError):
        return Inventory(errors=[found])
    signals, resources, missed = await asyncio.gather(
        _signal_rows(source, catalogue, found, names, at, lookback_s),
        _resource_rows(source, found.resources, at),
        _unrecognised_rows(source, found, names, at),
    )
    return Inventory(
        recognised=[*signals[0], *resources[0]],
        unrecognised=missed[0],
        rejected=sorted({*missed[1], *signals[1]}, key=lambda r: (r.service, r.entry, r.reason)),
        errors=[*signals[2], *resources[1], *missed[2]],
    )
