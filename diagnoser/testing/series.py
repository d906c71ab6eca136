"""promtool's ``input_series`` notation, turned into OpenMetrics for backfilling.

``values: '0+10x60'`` is 61 samples 0, 10, ..., 600; ``'1x3'`` is 1 1 1 1; ``'_x3'`` is three
missing samples; ``'1 2 _ 4'`` lists values one by one; ``stale`` is treated as missing.
Native histograms are written as promtool writes them,
``{{schema:3 sum:0.5 count:10 z_bucket:0 z_bucket_w:0.001 buckets:[6 4] offset:-45 n_buckets:[]}}``
(``buckets`` the counts of consecutive buckets from index ``offset``), repeated with ``x3`` or
grown with ``{{...}}+{{...}}x3`` (bucket by bucket); they become
:class:`~diagnoser.testing.remote_write.NativeSample` values, written by remote write.
Samples are ``interval`` apart from a start instant. Series labels are written the PromQL way:
``http_requests_total{job="api", code="500"}``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from diagnoser.errors import NotationError
from diagnoser.testing.remote_write import NativeSample

__all__ = [
    "NotationError",
    "SeriesSpec",
    "expand_native",
    "expand_values",
    "grown",
    "parse_series",
    "to_openmetrics",
]


_EXPANDING = re.compile(
    r"^(?P<start>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|Inf|NaN))"
    r"(?:(?P<sign>[-+])(?P<step>\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+))?x(?P<times>\d+)$"
)
_MISSING_RUN = re.compile(r"^_x(?P<times>\d+)$")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|Inf|NaN)$")


_NATIVE = re.compile(r"\{\{(?P<first>[^}]*)\}\}(?:\+\{\{(?P<step>[^}]*)\}\})?(?:x(?P<times>\d+))?")
_NATIVE_FIELD = re.compile(r"(\w+):(\[[^\]]*\]|\S+)")


def _native(text: str) -> NativeSample:
    fields = {key: value for key, value in _NATIVE_FIELD.findall(text)}
    unknown = set(fields) - {
        "schema",
        "sum",
        "count",
        "z_bucket",
        "z_bucket_w",
        "buckets",
        "offset",
        "n_buckets",
        "n_offset",
    }
    if unknown:
        raise NotationError(f"unknown native histogram field(s) {sorted(unknown)} in {{{{{text}}}}}")

    def counts(key: str, offset_key: str) -> tuple[tuple[int, float], ...]:
        listed = fields.get(key, "[]").strip("[]").split()
        start = int(fields.get(offset_key, "0"))
        return tuple((start + i, float(c)) for i, c in enumerate(listed))

    try:
        return NativeSample(
            count=float(fields.get("count", "0")), sum=float(fields.get("sum", "0")),
            schema=int(fields.get("schema", "0")), zero_threshold=float(fields.get("z_bucket_w", "0")),
            zero_count=float(fields.get("z_bucket", "0")), positive=counts("buckets", "offset"),
            negative=counts("n_buckets", "n_offset"),
        )  # fmt: skip
    except ValueError as exc:
        raise NotationError(f"cannot read native histogram {{{{{text}}}}}: {exc}") from exc


def grown(first: NativeSample, step: NativeSample, times: float) -> NativeSample:
    """``first + times * step``, bucket by bucket (``times`` may be negative: a difference)."""

    def add(
        a: tuple[tuple[int, float], ...], b: tuple[tuple[int, float], ...]
    ) -> tuple[tuple[int, float], ...]:
        merged = dict(a)
        for index, count in b:
            merged[index] = merged.get(index, 0.0) + times * count
        return tuple(sorted(merged.items()))

    return NativeSample(
        count=first.count + times * step.count, sum=first.sum + times * step.sum, schema=first.schema,
        zero_threshold=first.zero_threshold, zero_count=first.zero_count + times * step.zero_count,
        positive=add(first.positive, step.positive), negative=add(first.negative, step.negative),
    )  # fmt: skip


def expand_native(text: str) -> list[NativeSample | None] | None:
    """Expand a native-histogram ``values`` text; ``None`` when it holds no ``{{...}}``."""
    if "{{" not in text:
        return None
    values: list[NativeSample | None] = []
    position = 0
    text = text.strip()
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        match = _NATIVE.match(text, position)
        if match is None:
            token = text[position:].split()[0]
            if token in ("_", "stale"):
                values.append(None)
                position += len(token)
                continue
            if missing := _MISSING_RUN.match(token):
                values.extend([None] * int(missing["times"]))
                position += len(token)
                continue
            raise NotationError(f"cannot read {token!r} in native histogram values {text!r}")
        first = _native(match["first"])
        times = int(match["times"] or 0)
        if match["step"] is not None:
            step = _native(match["step"])
            values.extend(grown(first, step, i) for i in range(times + 1))
        else:
            values.extend([first] * (times + 1))
        position = match.end()
    return values


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
    """A series by name and sorted labels; its hash is computed once (a backfill of millions of
    samples keys dictionaries by series, and a tuple of label pairs re-hashes on every lookup)."""

    name: str
    labels: tuple[tuple[str, str], ...]
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.labels)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[SeriesSpec], tuple[str, tuple[tuple[str, str], ...]]]:
        # String hashes differ between processes: a copy sent to another one hashes anew.
        return SeriesSpec, (self.name, self.labels)

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


def to_openmetrics(
    samples: Iterable[tuple[SeriesSpec, float, float]], labels: Mapping[str, str] | None = None
) -> str:
    """OpenMetrics text for ``(series, timestamp_s, value)`` samples, ending with ``# EOF``.

    Samples are grouped by metric family and ordered by time within a series: promtool drops
    out-of-order samples silently. Types are left unknown so any sample name is accepted.
    ``labels`` are set on every series as it is written (another ``job`` for a copy of a bed),
    which costs a lookup per sample rather than a new series per sample.
    """
    renamed: dict[SeriesSpec, SeriesSpec] = {}
    by_series: dict[SeriesSpec, dict[float, float]] = {}
    for spec, timestamp, value in samples:
        if labels:
            target = renamed.get(spec)
            if target is None:
                merged = tuple(sorted({**dict(spec.labels), **labels}.items()))
                target = renamed[spec] = SeriesSpec(spec.name, merged)
            spec = target
        points = by_series.get(spec)
        if points is None:
            points = by_series[spec] = {}
        points[timestamp] = value
    lines: list[str] = []
    for spec in sorted(by_series, key=lambda s: (s.name, s.labels)):
        prefix = spec.openmetrics_name() + " "
        lines.extend(
            f"{prefix}{value!r} {timestamp:.3f}"
            if math.isfinite(value)
            else f"{prefix}{_format_value(value)} {timestamp:.3f}"
            for timestamp, value in sorted(by_series[spec].items())
        )
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


#: What ``repr`` spells differently from OpenMetrics.
_SPECIAL_VALUES = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}


def _format_value(value: float) -> str:
    text = repr(float(value))
    return _SPECIAL_VALUES.get(text, text)
