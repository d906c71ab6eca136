"""How OpenTelemetry names reach Prometheus: the four OTLP translation strategies, as one rule.

An OpenTelemetry metric (``http.server.request.duration``, unit ``s``, a histogram) and its
attributes (``http.response.status_code``) reach Prometheus spelt by the translation strategy of
the OTLP receiver, the Collector's exporter or the SDK's Prometheus exporter (the rules of
prometheus/otlptranslator):

=================================  ==========================================  ===========================
strategy                           metric                                      label
=================================  ==========================================  ===========================
UnderscoreEscapingWithSuffixes     ``http_server_request_duration_seconds``    ``http_response_status_code``
NoUTF8EscapingWithSuffixes         ``http.server.request.duration_seconds``    ``http.response.status_code``
UnderscoreEscapingWithoutSuffixes  ``http_server_request_duration``            ``http_response_status_code``
NoTranslation                      ``http.server.request.duration``            ``http.response.status_code``
=================================  ==========================================  ===========================

Escaping turns every character outside ``[a-zA-Z0-9:]`` of a metric name into ``_`` (runs of them
into one) and every one outside ``[a-zA-Z0-9_]`` of a label name into ``_`` (a leading digit gets
``key_``); suffixes are the unit's Prometheus word (``s`` -> ``seconds``, ``By`` -> ``bytes``; none
for ``1`` or an annotation like ``{connection}``) and ``_total`` for a monotonic counter. A classic
histogram keeps ``_bucket``/``_sum``/``_count`` after all four spellings.

So the catalogue spells an OpenTelemetry convention once, any way (its forms' escaped names, with
or without the unit), and :func:`spellings` gives the escaped names every strategy leads to; a
metric in Prometheus is that form when its escaped name is one of them (:func:`escape_metric`),
and its labels are the convention's when their escaped names are (:func:`escape_label`). No name
is checked against the legacy character set: only escaped for comparison.
"""

from __future__ import annotations

import re

__all__ = ["UNIT_WORDS", "escape_label", "escape_metric", "spellings"]

#: The words otlptranslator appends for OpenTelemetry's units (``s`` -> ``seconds``...).
UNIT_WORDS = frozenset(
    {
        "days", "hours", "minutes", "seconds", "milliseconds", "microseconds", "nanoseconds",
        "bytes", "kibibytes", "mebibytes", "gibibytes", "tibibytes", "kilobytes", "megabytes",
        "gigabytes", "terabytes", "meters", "volts", "amperes", "joules", "watts", "grams",
        "celsius", "hertz", "percent",
    }
)  # fmt: skip
_NOT_METRIC_CHAR = re.compile(r"[^a-zA-Z0-9:]+")
_NOT_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")
_UNDERSCORES = re.compile(r"__+")
_HISTOGRAM_PARTS = ("_bucket", "_count", "_sum")


def escape_metric(name: str) -> str:
    """A metric name as the escaping strategies write it: ``http.server.duration_seconds`` ->
    ``http_server_duration_seconds`` (a leading digit gets ``_``)."""
    escaped = "_".join(part for part in _NOT_METRIC_CHAR.split(name) if part)
    return f"_{escaped}" if escaped[:1].isdigit() else escaped


def escape_label(name: str) -> str:
    """A label name as the escaping strategies write it: ``http.route`` -> ``http_route``.
    Reserved names (``__name__``) are kept."""
    if name.startswith("__"):
        return name
    escaped = _UNDERSCORES.sub("_", _NOT_LABEL_CHAR.sub("_", name))
    return f"key_{escaped}" if escaped[:1].isdigit() else escaped


def spellings(metric: str, unit: str = "") -> frozenset[str]:
    """The escaped names one catalogued OpenTelemetry metric has under the four strategies: with
    and without its unit word and ``_total``, a histogram part (``_count``...) kept at the end.

    ``spellings("http_server_request_duration_seconds_count")`` is
    ``{"http_server_request_duration_seconds_count", "http_server_request_duration_count"}``;
    ``unit`` (a word of :data:`UNIT_WORDS`) is the unit of a form whose name does not say it.
    """
    escaped = escape_metric(metric)
    part = next((p for p in _HISTOGRAM_PARTS if escaped.endswith(p) and len(escaped) > len(p)), "")
    stem = escaped[: len(escaped) - len(part)] if part else escaped
    words = stem.split("_")
    total = words[-1] == "total" and len(words) > 1
    if total:
        words = words[:-1]
    named = words[-1] if words[-1] in UNIT_WORDS and len(words) > 1 else ""
    core = words[:-1] if named else words
    unit = named or (unit if unit in UNIT_WORDS else "")
    found = {"_".join(core) + part}
    with_suffixes = [*core, *([unit] if unit else []), *(["total"] if total else [])]
    found.add("_".join(with_suffixes) + part)
    return frozenset(found)
