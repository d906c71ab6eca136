"""One worker's share of a run, and the exact merge of the shares into one :class:`ProbeResult`.

A run spread over worker processes (or pods) is still one run: each worker sends its share of
the schedule and returns a :class:`RunPart` (its counters and its HdrHistograms, encoded), and
:func:`merge_parts` adds them. HdrHistograms add bucket by bucket, so the merged percentiles
are those of the union of every worker's samples, never an average of percentiles. The tail
shares (where the slowest 1 % spent their time) need the merged p99 first: the coordinator asks
each worker for its :class:`~diagnoser.probe.result.TailSums` at that cut and adds them.
"""

from __future__ import annotations

from collections.abc import Sequence

from hdrh.histogram import HdrHistogram
from pydantic import BaseModel, ConfigDict, Field

from diagnoser.probe.result import (
    SERIES,
    PhaseShares,
    ProbeRecorder,
    ProbeResult,
    RunCounts,
    assemble_result,
    new_histogram,
    percentiles_of,
)

__all__ = ["RunPart", "latency_p99", "merge_counts", "merge_parts", "merged_histograms", "part_of"]


class RunPart(BaseModel):
    """What one worker measured of its share: counters, encoded histograms, time and CPU."""

    model_config = ConfigDict(extra="forbid")

    index: int = 0
    counts: RunCounts = Field(default_factory=RunCounts)
    #: Series name (``latency``, ``service``, ``schedule_lag``, phases) -> base64 HdrHistogram.
    histograms: dict[str, str] = Field(default_factory=dict)
    elapsed_s: float = 0.0
    aborted: bool = False
    abort_reason: str | None = None
    #: CPU seconds the worker spent during its share (user + system).
    cpu_s: float = 0.0


def part_of(
    recorder: ProbeRecorder,
    *,
    index: int,
    elapsed_s: float,
    aborted: bool,
    abort_reason: str | None,
    cpu_s: float,
) -> RunPart:
    """A worker's share, ready to send (histograms encoded; empty ones as ``""``)."""
    histograms = {
        name: histogram.encode().decode() if histogram.get_total_count() else ""
        for name, histogram in recorder.histograms().items()
    }
    return RunPart(
        index=index,
        counts=RunCounts.of(recorder),
        histograms=histograms,
        elapsed_s=elapsed_s,
        aborted=aborted,
        abort_reason=abort_reason,
        cpu_s=cpu_s,
    )


def merged_histograms(parts: Sequence[RunPart]) -> dict[str, HdrHistogram]:
    """Every series' histogram, added over the parts (exact: bucket counts add)."""
    merged = {name: new_histogram() for name in SERIES}
    for part in parts:
        for name, text in part.histograms.items():
            if text and name in merged:
                merged[name].add(HdrHistogram.decode(text.encode()))
    return merged


def merge_counts(
    parts: Sequence[RunPart], examples_per_kind: int = ProbeRecorder.MAX_EXAMPLES_PER_KIND
) -> RunCounts:
    """Counters added over the parts; at most ``examples_per_kind`` examples of each failure kind."""
    total = RunCounts()
    kept: dict[str, int] = {}
    for part in sorted(parts, key=lambda p: p.index):
        c = part.counts
        total.sent += c.sent
        total.completed += c.completed
        total.finished += c.finished
        total.connections_opened += c.connections_opened
        total.pool_waits += c.pool_waits
        for status, count in c.status_counts.items():
            total.status_counts[status] = total.status_counts.get(status, 0) + count
        for kind, count in c.failures.items():
            total.failures[kind] = total.failures.get(kind, 0) + count
        for example in c.examples:
            if kept.get(example.kind, 0) < examples_per_kind:
                kept[example.kind] = kept.get(example.kind, 0) + 1
                total.examples.append(example)
    return total


def latency_p99(parts: Sequence[RunPart]) -> float | None:
    """The merged latency p99 (ms): the cut each worker's tail sums are asked at."""
    return percentiles_of(merged_histograms(parts)["latency"]).p99


def merge_parts(
    parts: Sequence[RunPart],
    shares: PhaseShares,
    *,
    target: str,
    requested_rate: float,
    lag_limit_ms: float,
    abort_reason: str | None = None,
) -> ProbeResult:
    """One result from every worker's part. ``abort_reason`` is the coordinator's, when it
    stopped the run (the first worker to abort, a cap, Ctrl-C); else the first part's own."""
    aborted = any(p.aborted for p in parts)
    reason = abort_reason or next((p.abort_reason for p in parts if p.abort_reason), None)
    return assemble_result(
        merge_counts(parts),
        merged_histograms(parts),
        lambda _p99: shares,
        target=target,
        requested_rate=requested_rate,
        elapsed_s=max((p.elapsed_s for p in parts), default=0.0),
        aborted=aborted,
        abort_reason=reason if aborted else None,
        lag_limit_ms=lag_limit_ms,
    )
