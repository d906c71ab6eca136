"""promtool's ``input_series`` notation, turned into OpenMetrics for backfilling.

``values: '0+10x60'`` is 61 samples 0, 10, ..., 600; ``'1x3'`` is 1 1 1 1; ``'_x3'`` is three
missing samples; ``'1 2 _ 4'`` lists values one by one; ``stale`` is treated as missing.
Samples are ``interval`` apart from a start instant. Series labels are written the PromQL way:
``http_requests_total{job="api", code="500"}``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from diagnoser.errors import NotationError

__all__ = ["NotationError", "SeriesSpec", "expand_values", "parse_series", "to_openmetrics"]


_EXPANDING = re.compile(
    r"^(?P<start>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|Inf|NaN))"
    r"(?:(?P<sign>[-+])(?P<step>\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+))?x(?P<times>\d+)$"
)
_MISSING_RUN = re.compile(r"^_x(?P<times>\d+)$")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|Inf|NaN)$")


def expand_values(text: str) -> list[float | None]:
    """Expand the notation; ``None`` is a missing sample."""
    values: list[float | None] = []
    for token in str(text).split():
        if token in ("_", "stale"):
            values.append(None)
        elif match := _MISSING_RUN.match(token):
            values.extend([None] * int(match["times"]))
        elif match := _EXPANDING.match(token):
            start = float(match["start"])
            step = float(match["step"] or 0) * (-1 if match["sign"] == "-" else 1)
            values.extend(start + step * i for i in range(int(match["times"]) + 1))
        elif _NUMBER.match(token):
            values.append(float(token))
        else:
            raise NotationError(f"cannot read {token!r} in values {text!r}")
    return values


_SERIES = re.compile(r"^\s*(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(?P<labels>.*)\})?\s*$", re.S)
_LABEL = re.compile(r'\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass(frozen=True)
class SeriesSpec:
    name: str
    labels: tuple[tuple[str, str], ...]

    def openmetrics_name(self) -> str:
        if not self.labels:
            return self.name
        inner = ",".join(f'{key}="{_escape(value)}"' for key, value in self.labels)
        return f"{self.name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def parse_series(text: str) -> SeriesSpec:
    """Parse ``name{label="value", ...}``."""
    match = _SERIES.match(text)
    if not match:
        raise NotationError(f"not a series selector: {text!r}")
    labels: dict[str, str] = {}
    rest = (match["labels"] or "").strip()
    position = 0
    while position < len(rest):
        label = _LABEL.match(rest, position)
        if not label:
            raise NotationError(f"cannot read labels of {text!r} at {rest[position:]!r}")
        labels[label["key"]] = _unescape(label["value"])
        position = label.end()
    if "__name__" in labels:
        raise NotationError(f"use the metric name, not __name__, in {text!r}")
    return SeriesSpec(match["name"], tuple(sorted(labels.items())))


def to_openmetrics(samples: Iterable[tuple[SeriesSpec, float, float]]) -> str:
    """OpenMetrics text for ``(series, timestamp_s, value)`` samples, ending with ``# EOF``.

    Samples are grouped by metric family and ordered by time within a series: promtool drops
    out-of-order samples silently. Types are left unknown so any sample name is accepted.
    """
    by_family: dict[str, dict[SeriesSpec, dict[float, float]]] = {}
    for spec, timestamp, value in samples:
        by_family.setdefault(spec.name, {}).setdefault(spec, {})[timestamp] = value
    lines: list[str] = []
    for family in sorted(by_family):
        for spec in sorted(by_family[family], key=lambda s: s.labels):
            name = spec.openmetrics_name()
            for timestamp, value in sorted(by_family[family][spec].items()):
                lines.append(f"{name} {_format_value(value)} {timestamp:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
