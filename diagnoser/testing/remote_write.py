"""Samples into a running Prometheus through its remote-write receiver, native histograms included.

OpenMetrics text, which ``promtool tsdb create-blocks-from openmetrics`` reads, has no notation for
native histograms (promtool 3.5 reads them neither from OpenMetrics nor from any other backfill
format), so a test that needs them writes them the way a Prometheus agent would: Remote-Write 1.0
(``prometheus.WriteRequest``, protobuf, snappy-compressed) to ``/api/v1/write`` of a server started
with ``--web.enable-remote-write-receiver`` (:class:`~diagnoser.testing.prometheus.LocalPrometheus`
on 3.x is). The messages are built with the protobuf library from the schema Prometheus publishes
(``prompb/types.proto``: field numbers are the wire contract); a histogram goes as a float
histogram (absolute bucket counts). Samples are sent oldest first, in slices of time across every
series, so the head never sees a sample older than it accepts::

    write(prom.url, [FloatSeries(labels, [(t, 1.0), ...]), HistogramSeries(labels, [(t, h), ...])])
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from diagnoser.errors import LocalPrometheusError

__all__ = ["FloatSeries", "HistogramSeries", "NativeSample", "native_from_api", "write"]

#: Samples per request, and how much time one slice covers (well inside the head's hour of slack).
_SLICE_S = 600.0


@dataclass(frozen=True)
class NativeSample:
    """A native histogram in an exponential schema: counts per bucket index (absolute)."""

    count: float
    sum: float
    schema: int
    zero_threshold: float = 0.0
    zero_count: float = 0.0
    #: Bucket index -> count, for positive and negative observations.
    positive: tuple[tuple[int, float], ...] = ()
    negative: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class FloatSeries:
    labels: dict[str, str]
    samples: Sequence[tuple[float, float]]


@dataclass(frozen=True)
class HistogramSeries:
    labels: dict[str, str]
    samples: Sequence[tuple[float, NativeSample]]


_F = descriptor_pb2.FieldDescriptorProto


def _field(
    name: str,
    number: int,
    kind: Any,
    label: Any = _F.LABEL_OPTIONAL,
    type_name: str = "",
    oneof: int | None = None,
) -> Any:
    return _F(
        name=name, number=number, type=kind, label=label, type_name=type_name or None, oneof_index=oneof
    )


@cache
def _messages() -> dict[str, Any]:
    """The Remote-Write 1.0 messages diagnoser sends (a subset of ``prompb``: no exemplars, metadata)."""
    rep = _F.LABEL_REPEATED
    schema = descriptor_pb2.FileDescriptorProto(
        name="diagnoser_prompb.proto", package="prometheus", syntax="proto3"
    )
    spec = {
        "Label": [_field("name", 1, _F.TYPE_STRING), _field("value", 2, _F.TYPE_STRING)],
        "Sample": [_field("value", 1, _F.TYPE_DOUBLE), _field("timestamp", 2, _F.TYPE_INT64)],
        "BucketSpan": [_field("offset", 1, _F.TYPE_SINT32), _field("length", 2, _F.TYPE_UINT32)],
        "Histogram": [
            # In oneofs (as in prompb), so that a zero count is sent and marks a float histogram.
            _field("count_float", 2, _F.TYPE_DOUBLE, oneof=0),
            _field("sum", 3, _F.TYPE_DOUBLE),
            _field("schema", 4, _F.TYPE_SINT32),
            _field("zero_threshold", 5, _F.TYPE_DOUBLE),
            _field("zero_count_float", 7, _F.TYPE_DOUBLE, oneof=1),
            _field("negative_spans", 8, _F.TYPE_MESSAGE, rep, ".prometheus.BucketSpan"),
            _field("negative_counts", 10, _F.TYPE_DOUBLE, rep),
            _field("positive_spans", 11, _F.TYPE_MESSAGE, rep, ".prometheus.BucketSpan"),
            _field("positive_counts", 13, _F.TYPE_DOUBLE, rep),
            _field("timestamp", 15, _F.TYPE_INT64),
        ],
        "TimeSeries": [
            _field("labels", 1, _F.TYPE_MESSAGE, rep, ".prometheus.Label"),
            _field("samples", 2, _F.TYPE_MESSAGE, rep, ".prometheus.Sample"),
            _field("histograms", 4, _F.TYPE_MESSAGE, rep, ".prometheus.Histogram"),
        ],
        "WriteRequest": [_field("timeseries", 1, _F.TYPE_MESSAGE, rep, ".prometheus.TimeSeries")],
    }
    for name, fields in spec.items():
        message = schema.message_type.add(name=name, field=fields)
        if name == "Histogram":
            message.oneof_decl.add(name="count")
            message.oneof_decl.add(name="zero_count")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{name}"))
        for name in spec
    }


def _spans(buckets: Iterable[tuple[int, float]], message: Any) -> tuple[list[Any], list[float]]:
    """Consecutive bucket indexes as spans (offset from the previous span's end) and their counts."""
    spans: list[Any] = []
    counts: list[float] = []
    previous_end: int | None = None
    for index, count in sorted(buckets):
        if previous_end is not None and index == previous_end:
            spans[-1].length += 1
        else:
            offset = index if previous_end is None else index - previous_end
            spans.append(message(offset=offset, length=1))
        previous_end = index + 1
        counts.append(count)
    return spans, counts


def _histogram(t: float, h: NativeSample) -> Any:
    m = _messages()
    positive_spans, positive_counts = _spans(h.positive, m["BucketSpan"])
    negative_spans, negative_counts = _spans(h.negative, m["BucketSpan"])
    return m["Histogram"](
        count_float=h.count, sum=h.sum, schema=h.schema, zero_threshold=h.zero_threshold,
        zero_count_float=h.zero_count, positive_spans=positive_spans, positive_counts=positive_counts,
        negative_spans=negative_spans, negative_counts=negative_counts, timestamp=round(t * 1000),
    )  # fmt: skip


def _snappy_literal(data: bytes) -> bytes:
    """``data`` as a snappy block of literals only: valid snappy, decoded by any reader, just not
    smaller (test payloads are small; no compression library is needed for it)."""
    out = bytearray()
    length = len(data)
    while True:  # the uncompressed length, as a varint
        byte = length & 0x7F
        length >>= 7
        out.append(byte | (0x80 if length else 0))
        if not length:
            break
    for start in range(0, len(data), 65536):
        chunk = data[start : start + 65536]
        size = len(chunk) - 1
        if size < 60:
            out.append(size << 2)
        elif size < 256:
            out += bytes([60 << 2, size])
        else:
            out += bytes([61 << 2, size & 0xFF, size >> 8])
        out += chunk
    return bytes(out)


def write(url: str, series: Sequence[FloatSeries | HistogramSeries], timeout_s: float = 30.0) -> None:
    """Send every sample of ``series`` to ``url``'s ``/api/v1/write``, oldest slice first.

    Raises :class:`LocalPrometheusError` with the server's words when it refuses a request.
    """
    times = [sample[0] for one in series for sample in one.samples]
    if not times:
        return
    m = _messages()
    start = min(times)
    slices = math.floor((max(times) - start) / _SLICE_S) + 1
    for number in range(slices):
        low, high = start + number * _SLICE_S, start + (number + 1) * _SLICE_S
        request = m["WriteRequest"]()
        for one in series:
            labels = [m["Label"](name=k, value=v) for k, v in sorted(one.labels.items())]
            if isinstance(one, HistogramSeries):
                histograms = [_histogram(t, h) for t, h in one.samples if low <= t < high]
                if histograms:
                    request.timeseries.append(m["TimeSeries"](labels=labels, histograms=histograms))
            else:
                samples = [
                    m["Sample"](value=v, timestamp=round(t * 1000)) for t, v in one.samples if low <= t < high
                ]
                if samples:
                    request.timeseries.append(m["TimeSeries"](labels=labels, samples=samples))
        if request.timeseries:
            _post(url, _snappy_literal(request.SerializeToString()), timeout_s)


def _post(url: str, body: bytes, timeout_s: float) -> None:
    headers = {
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
    request = urllib.request.Request(f"{url}/api/v1/write", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace").strip()[:500]
        raise LocalPrometheusError(f"remote write refused: HTTP {error.code}: {detail}") from error
    except (urllib.error.URLError, OSError) as error:
        raise LocalPrometheusError(f"remote write to {url} failed: {error}") from error


def native_from_api(data: dict[str, Any], schema: int | None = None) -> NativeSample:
    """A native histogram from the query API's form (``count``, ``sum``, ``buckets`` of
    ``[boundaries, lower, upper, count]``), its schema read from the bucket widths (or
    ``schema`` when it has no bucket to read it from)."""
    zero_threshold = zero_count = 0.0
    positive: list[tuple[float, float]] = []
    negative: list[tuple[float, float]] = []
    for _, lower_text, upper_text, count_text in data.get("buckets") or ():
        lower, upper, count = float(lower_text), float(upper_text), float(count_text)
        if lower <= 0 <= upper:
            zero_threshold, zero_count = upper, count
        elif lower > 0:
            positive.append((upper, count))
        else:
            negative.append((-lower, count))
    widths = [(float(b[2]) / float(b[1])) for b in data.get("buckets") or () if float(b[1]) > 0]
    if widths:
        schema = round(-math.log2(math.log2(widths[0])))
    if schema is None:
        schema = 3  # no bucket at all: any schema holds an empty histogram
    scale = 2.0**schema

    def index(upper: float) -> int:
        return round(math.log2(upper) * scale)

    return NativeSample(
        count=float(data["count"]), sum=float(data["sum"]), schema=schema,
        zero_threshold=zero_threshold, zero_count=zero_count,
        positive=tuple((index(u), c) for u, c in positive),
        negative=tuple((index(u), c) for u, c in negative),
    )  # fmt: skip
