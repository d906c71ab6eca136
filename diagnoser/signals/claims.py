"""Which catalogued conventions claim which families: decided by the families' labels, not their names.

A metric name says little on its own: ``http_request_duration_seconds`` is client_golang's promhttp
(``code``, ``handler``), prom-client's (``status_code``, ``route``), prometheus-fastapi-instrumentator's
(``handler``, no status) or a hand-written one (``status``); ``http_client_request_duration_seconds``
is OpenTelemetry's (``server_address``) or client_golang's curried round tripper (``peer``);
``grpc_client_handling_seconds`` is go-grpc-prometheus's (``grpc_type="unary"``) or
py-grpc-prometheus's (``grpc_type="UNARY"``). A convention that fits a family's name and not its
labels reads nothing useful from it (no peer, no errors) and, by claiming it, used to hide it from
recognition by shape, which would have read it right.

So a convention's form claims its family only when the family's labels fit it:

* every label the form's matchers select on has a value that they match (a matcher allowing the
  empty value, ``code=""``, is met by series without the label); values that are words, such as
  ``grpc_type`` and gRPC codes, are compared ignoring case and underscores, and where only that
  comparison matches, the convention's word matchers are rewritten to match either spelling;
* the label a client convention names its peer by exists on the family, unless the form selects
  its absence (``net_peer_name=""``).

Outcome labels (HTTP status, gRPC codes) are not required to match: a healthy service has no 5xx,
and its errors signal is there all the same. :func:`claims` reads the values with one query per
instant (shared by every rule and by recognition), and gives the fitting conventions, in catalogue
order, and a :class:`~diagnoser.signals.infer.Rejection` for each form that fits a name and not
its labels; its family falls through to recognition by shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from diagnoser.models import SourceError
from diagnoser.promql import held, label_name, quote
from diagnoser.signals.catalogue import Catalogue, Convention, Form
from diagnoser.signals.holdings import Holdings, holdings, resolve_all
from diagnoser.signals.infer import Rejection
from diagnoser.signals.otlp import escape_label
from diagnoser.signals.shapes import STATUS_LABELS
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["Claims", "claims", "fit_conventions", "probes", "values_query"]

#: Normalised labels a family must carry for a convention mapping them to claim it: the peer, which
#: a client convention is about (OpenTelemetry's server_address on client_golang's curried {peer}
#: histogram names nobody: go-http-peer-slow). Others may be missing on a convention's own series
#: (promhttp labels a handler only where the service curries one; RabbitMQ's /metrics aggregates
#: queues per node, without a queue label).
_REQUIRED_MAPPED = frozenset({"peer"})
#: A matcher value that is a word or an alternation of words: an enum (``unary``, ``DeadlineExceeded``).
_WORDS = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\|[A-Za-z][A-Za-z0-9_]*)*$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
#: The label the values query writes each answer's label name into.
_LABEL = "diagnoser_claim_label"


@dataclass(frozen=True)
class Claims:
    """The conventions as they claim the families held at an instant."""

    #: Catalogued conventions (resolved to the server's spellings) with only the forms that fit.
    conventions: tuple[Convention, ...] = ()
    #: Forms that fit a name and not its labels.
    rejected: tuple[Rejection, ...] = ()
    #: The series names the fitting forms read: their families are claimed.
    claimed: frozenset[str] = frozenset()
    #: Per family series read by a fitting form, the signals its claimants supply there (every
    #: one of the claimant's forms for that signal present): what recognition need not add.
    supplied: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def catalogue(self, catalogue: Catalogue) -> Catalogue:
        """``catalogue`` with these conventions in place of its own."""
        return Catalogue(
            signals=catalogue.signals,
            conventions=list(self.conventions),
            resources=catalogue.resources,
            expanded=catalogue.expanded,
        )


def _is_outcome(label: str) -> bool:
    """A status or result code: not required to match, since a healthy service has no errors."""
    own = escape_label(label)
    return own in STATUS_LABELS or own.endswith(("_code", "_status")) or own in ("status", "code")


def _probed_series(form: Form, names: frozenset[str] | set[str]) -> str:
    """The series whose labels stand for the form's family: a histogram's ``_count``, else its own."""
    if f"{form.metric}_count" in names:
        return f"{form.metric}_count"
    return form.metric


def _matches_empty(op: str, value: str) -> bool:
    return _matches(op, value, "")


def _matches(op: str, value: str, candidate: str) -> bool:
    if op == "=":
        return candidate == value
    if op == "!=":
        return candidate != value
    try:
        found = re.fullmatch(value, candidate) is not None
    except re.error:
        return True  # Prometheus would have refused it: not ours to judge
    return found if op == "=~" else not found


def _word_key(word: str) -> str:
    return word.replace("_", "").casefold()


def _loose_word(word: str) -> str:
    """``DeadlineExceeded`` and ``DEADLINE_EXCEEDED`` -> ``deadline_?exceeded``."""
    parts = [part for chunk in word.split("_") for part in _CAMEL.split(chunk) if part]
    return "_?".join(re.escape(part.casefold()) for part in parts)


def _loose(op: str, value: str) -> tuple[str, str]:
    """A word matcher that matches either spelling of its words: ``unary`` and ``UNARY``,
    ``DeadlineExceeded`` and ``DEADLINE_EXCEEDED`` (``(?i)deadline_?exceeded``)."""
    words = [_loose_word(word) for word in value.split("|")]
    pattern = "(?i)" + (words[0] if len(words) == 1 else "(" + "|".join(words) + ")")
    return ("=~" if op in ("=", "=~") else "!~"), pattern


def _required(convention: Convention, form: Form) -> list[tuple[str, str, str]]:
    """The checks a form's family must pass: its matchers, and a non-empty value of each mapped
    identifying label the form does not select the absence of."""
    checks = list(form.matchers)
    allowed_empty = {label for label, op, value in form.matchers if _matches_empty(op, value)}
    for normalised, own in convention.labels.items():
        if normalised not in _REQUIRED_MAPPED or own in allowed_empty:
            continue
        if not any(label == own for label, _, _ in form.matchers):
            checks.append((own, "!=", ""))
    return checks


def _present_forms(
    convention: Convention, catalogue: Catalogue, names: frozenset[str]
) -> list[tuple[str, Form]]:
    return [
        (signal, form)
        for signal, form in convention.forms.items()
        if signal in catalogue.signals and held(_probed_series(form, names), names)
    ]


def probes(catalogue: Catalogue, held_now: Holdings) -> dict[str, set[str]]:
    """Per present series a catalogued form reads, the labels whose values decide its claims."""
    wanted: dict[str, set[str]] = {}
    for catalogued in catalogue.conventions:
        for convention in resolve_all(catalogued, held_now):
            for _, form in _present_forms(convention, catalogue, held_now.names):
                labels = {label for label, _, _ in _required(convention, form)}
                if labels:
                    wanted.setdefault(_probed_series(form, held_now.names), set()).update(labels)
    return wanted


def values_query(wanted: Mapping[str, Iterable[str]]) -> str | None:
    """One query for the values of each wanted label on each series (``""`` where a series lacks
    it), each answer tagged with its label's name; ``None`` when nothing is wanted."""
    by_label: dict[str, set[str]] = {}
    for series, labels in wanted.items():
        for label in labels:
            by_label.setdefault(label, set()).add(series)
    parts = []
    for label, held_by in sorted(by_label.items()):
        selector = "{__name__=~" + quote("|".join(sorted(held_by))) + "}"
        grouped = f"group by (__name__, {label_name(label)}) ({selector})"
        parts.append(f'label_replace({grouped}, "{_LABEL}", {quote(label)}, "__name__", ".*")')
    return " or ".join(parts) if parts else None


Values = Mapping[tuple[str, str], frozenset[str]]


def read_values(samples: Iterable[Mapping[str, str]]) -> dict[tuple[str, str], frozenset[str]]:
    """The answer of :func:`values_query` as (series, label) -> values."""
    found: dict[tuple[str, str], set[str]] = {}
    for labels in samples:
        label = labels.get(_LABEL)
        if label is not None:
            found.setdefault((labels.get("__name__", ""), label), set()).add(labels.get(label, ""))
    return {key: frozenset(values) for key, values in found.items()}


def _verdict(
    form: Form, checks: list[tuple[str, str, str]], series: str, values: Values
) -> tuple[bool, bool, str]:
    """(fits, fits only loosely, why not) for one form against its family's label values."""
    loose = False
    for label, op, value in checks:
        held_values = values.get((series, label))
        if held_values is None:
            continue  # not read (the query failed): the name decides, as before
        if _is_outcome(label) and not _matches_empty(op, value) and op in ("=", "=~"):
            if any(v for v in held_values):
                continue  # errors may be absent today; the label is there
            return False, False, f"no {label} label, which it reads the outcome from"
        if any(_matches(op, value, v) for v in held_values):
            continue
        if _WORDS.match(value):
            keys = {_word_key(w) for w in value.split("|")}
            if (op in ("=", "=~")) == any(_word_key(v) in keys for v in held_values if v):
                loose = True
                continue
        shown = ", ".join(sorted(repr(v) for v in held_values if v)[:4]) or "none"
        if not any(held_values - {""}) and not _matches_empty(op, value):
            return False, False, f"no {label} label, which it reads"
        return False, False, f"it selects {label}{op}{quote(value)}; the series have {label} {shown}"
    return True, loose, ""


def fit_conventions(catalogue: Catalogue, held_now: Holdings, values: Values) -> Claims:
    """The catalogue's conventions with only the forms whose families' labels fit them."""
    names = held_now.names
    fitted: list[Convention] = []
    rejected: list[Rejection] = []
    claimed: set[str] = set()
    supplied: dict[str, set[str]] = {}
    for catalogued in catalogue.conventions:
        # Judged as the server holds it (its OTLP spelling, each whole when services write two),
        # kept as catalogued: expansion resolves it again, and tells a convention that names the
        # series as they are from one that reaches them by another spelling. A form is unfit when
        # it fits in no spelling held.
        spelt = resolve_all(catalogued, held_now)
        verdicts: list[tuple[set[str], list[tuple[str, Rejection]]]] = []
        loosen = False
        for convention in spelt:
            unfit_here: set[str] = set()
            why_here: list[tuple[str, Rejection]] = []
            for signal, form in _present_forms(convention, catalogue, names):
                series = _probed_series(form, names)
                fits, loose, why = _verdict(form, _required(convention, form), series, values)
                if not fits:
                    unfit_here.add(signal)
                    reason = f"fits the name, not the labels: {why}"
                    why_here.append((signal, Rejection(convention.name, form.metric, reason)))
                loosen = loosen or loose
            verdicts.append((unfit_here, why_here))
        unfit = set.intersection(*(u for u, _ in verdicts))
        rejected.extend(r for _, why in verdicts for signal, r in why if signal in unfit)
        if not unfit and not loosen:
            fitted.append(catalogued)
        else:
            forms = {s: f for s, f in catalogued.forms.items() if s not in unfit}
            if not forms:
                continue
            if loosen:
                forms = {s: replace(f, matchers=_loosened(f.matchers)) for s, f in forms.items()}
            fitted.append(replace(catalogued, forms=forms))
        for convention in spelt:
            present = [(s, f) for s, f in _present_forms(convention, catalogue, names) if s not in unfit]
            for _, form in present:
                series = _probed_series(form, names)
                claimed.update(
                    {form.metric, series, *(f"{form.metric}{p}" for p in ("_bucket", "_sum", "_count"))}
                )
                supplied.setdefault(form.metric.removesuffix("_count"), set()).update(s for s, _ in present)
    return Claims(
        conventions=tuple(fitted),
        rejected=tuple(rejected),
        claimed=frozenset(claimed),
        supplied={k: frozenset(v) for k, v in supplied.items()},
    )


def _loosened(matchers: tuple[tuple[str, str, str], ...]) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (label, *_loose(op, value))
        if _WORDS.match(value) and op in ("=", "!=", "=~", "!~")
        else (label, op, value)
        for label, op, value in matchers
    )


async def claims(
    source: PrometheusSource, catalogue: Catalogue, at: datetime, lookback_s: float
) -> Claims | SourceError:
    """The claims of the instant ``at`` (one query, shared by every caller at that instant)."""

    async def ask() -> Claims | SourceError:
        names = await source.metric_names(at, lookback_s)
        if isinstance(names, SourceError):
            return names
        held_now = await holdings(source, catalogue, names, at, lookback_s)
        query = values_query(probes(catalogue, held_now))
        values: Values = {}
        if query is not None:
            samples = await source.query(query, at)
            # A failed query decides nothing: every convention claims by name, as without labels.
            values = {} if isinstance(samples, SourceError) else read_values(s.labels for s in samples)
        return fit_conventions(catalogue, held_now, values)

    return await source.shared(("claims", at.timestamp(), lookback_s, id(catalogue)), ask)
