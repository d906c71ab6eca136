"""The probe's measurements: HdrHistograms while it runs, a :class:`ProbeResult` at the end.

Latency is measured from each request's *intended* send time (so a server stall shows in full,
without coordinated omission), service time from the actual send, and schedule lag is their
difference. Values are recorded in microseconds into HdrHistograms (1 us .. 60 s, 3 significant
digits); percentiles are computed once, at the end: computing them per request is slow.

``ProbeResult.model_dump(mode="json")`` is the probe JSON contract (``diagnose probe --format
json`` and ``probe`` in a diagnosis). ``histogram`` is the latency histogram, HdrHistogram-
encoded and base64, so runs can be merged with :func:`merge_histograms`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from hdrh.histogram import HdrHistogram
from pydantic import BaseModel, ConfigDict, Field

from diagnoser.probe.validate import FAILURE_KINDS

__all__ = [
    "HISTOGRAM_MAX_US",
    "Failures",
    "Percentiles",
    "PhaseShares",
    "ProbeRecorder",
    "ProbeResult",
    "ResponseExample",
    "merge_histograms",
    "new_histogram",
    "percentiles_of",
]

HISTOGRAM_MAX_US = 60_000_000
_PHASES = ("connect", "tls", "ttfb", "body")


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, HISTOGRAM_MAX_US, 3)


class Percentiles(BaseModel):
    """Percentiles in milliseconds; ``None`` when nothing was recorded."""

    model_config = ConfigDict(extra="forbid")

    count: int = 0
    p50: float | None = None
    p75: float | None = None
    p90: float | None = None
    p99: float | None = None
    p999: float | None = None
    p9999: float | None = None
    max: float | None = None


def percentiles_of(histogram: HdrHistogram) -> Percentiles:
    count = int(histogram.get_total_count())
    if count == 0:
        return Percentiles()
    values = histogram.get_percentile_to_value_dict([50, 75, 90, 99, 99.9, 99.99])

    def ms(us: int) -> float:
        return round(us / 1000.0, 3)

    return Percentiles(
        count=count,
        p50=ms(values[50]),
        p75=ms(values[75]),
        p90=ms(values[90]),
        p99=ms(values[99]),
        p999=ms(values[99.9]),
        p9999=ms(values[99.99]),
        max=ms(histogram.get_max_value()),
    )


class Phases(BaseModel):
    model_config = ConfigDict(extra="forbid")

    connect: Percentiles = Field(default_factory=Percentiles)
    tls: Percentiles = Field(default_factory=Percentiles)
    ttfb: Percentiles = Field(default_factory=Percentiles)
    body: Percentiles = Field(default_factory=Percentiles)


class PhaseShares(BaseModel):
    """Where the slowest 1 % of requests spent their time, as shares of their latency (sum 1)."""

    model_config = ConfigDict(extra="forbid")

    schedule_lag: float = 0.0
    connect: float = 0.0
    tls: float = 0.0
    ttfb: float = 0.0
    body: float = 0.0


class Failures(BaseModel):
    """Requests that failed, by kind; each request counts under at most one kind."""

    model_config = ConfigDict(extra="forbid")

    status: int = 0
    empty_body: int = 0
    empty_json: int = 0
    missing_path: int = 0
    truncated: int = 0
    too_large: int = 0
    timeout: int = 0
    connect_error: int = 0
    read_error: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, kind) for kind in FAILURE_KINDS)


class ResponseExample(BaseModel):
    """A sampled failed response (body truncated) so a report can show what was wrong."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    status: int | None = None
    body: str | None = None
    content_length: int | None = None
    received_bytes: int | None = None
    error: str | None = None


class ProbeResult(BaseModel):
    """Everything one probe run measured. Field names are the probe JSON contract."""

    model_config = ConfigDict(extra="forbid")

    target: str
    requested_rate: float
    achieved_rate: float
    duration_s: float
    sent: int
    completed: int
    aborted: bool = False
    abort_reason: str | None = None
    latency_ms: Percentiles = Field(default_factory=Percentiles)
    service_time_ms: Percentiles = Field(default_factory=Percentiles)
    schedule_lag_ms: Percentiles = Field(default_factory=Percentiles)
    phases_ms: Phases = Field(default_factory=Phases)
    status_counts: dict[str, int] = Field(default_factory=dict)
    failures: Failures = Field(default_factory=Failures)
    examples: list[ResponseExample] = Field(default_factory=list)
    histogram: str = ""
    #: Requests that ended with a response or a failure (``sent`` minus those cut off at the end).
    finished: int = 0
    #: New connections opened (TCP, plus TLS for https): about ``sent`` when nothing is reused.
    connections_opened: int = 0
    #: Requests sent while every pooled connection was busy (they queued inside the client).
    pool_waits: int = 0
    phase_share_p99: PhaseShares = Field(default_factory=PhaseShares)
    #: ``scheduler`` or ``connection_pool`` when the probe itself limited the measurement.
    bottleneck: str | None = None
    warnings: list[str] = Field(default_factory=list)

    @property
    def error_ratio(self) -> float:
        """Failed requests of every kind over requests that finished."""
        return self.failures.total / self.finished if self.finished else 0.0

    def latency_histogram(self) -> HdrHistogram:
        """The decoded latency histogram (microseconds)."""
        return HdrHistogram.decode(self.histogram.encode()) if self.histogram else new_histogram()


def merge_histograms(encoded: Iterable[str]) -> HdrHistogram:
    """Merge base64 latency histograms from several runs or probes into one."""
    merged = new_histogram()
    for text in encoded:
        if text:
            merged.add(HdrHistogram.decode(text.encode()))
    return merged


class ProbeRecorder:
    """Accumulates one run's measurements; cheap per request (a few ``record_value`` calls)."""

    MAX_EXAMPLES_PER_KIND = 3
    MAX_EXAMPLE_BODY = 512

    def __init__(self) -> None:
        self.latency = new_histogram()
        self.service = new_histogram()
        self.lag = new_histogram()
        self.phases = {name: new_histogram() for name in _PHASES}
        #: Latency of requests finished since the live view last looked (for a live p99).
        self.recent = new_histogram()
        self.status_counts: dict[int, int] = {}
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_KINDS, 0)
        self.examples: list[ResponseExample] = []
        self._examples_per_kind: dict[str, int] = {}
        self.sent = 0
        self.completed = 0
        self.finished = 0
        self.connections_opened = 0
        self.pool_waits = 0
        # Per-request phase times in ms, kept to explain the tail after the run (4 bytes each).
        self._tail: dict[str, array[float]] = {
            name: array("f") for name in ("latency", "schedule_lag", "connect", "tls", "ttfb", "body")
        }

    @staticmethod
    def _record(histogram: HdrHistogram, seconds: float) -> None:
        histogram.record_value(min(HISTOGRAM_MAX_US, max(1, int(seconds * 1e6))))

    def record(
        self,
        *,
        latency_s: float | None,
        service_s: float,
        lag_s: float,
        opened_connection: bool,
        connect_s: float | None,
        tls_s: float | None,
        ttfb_s: float | None,
        body_s: float | None,
        status: int | None,
        failure: str | None,
    ) -> None:
        """Record one finished request; ``latency_s`` is ``None`` when no response and no timeout."""
        self.finished += 1
        self._record(self.lag, lag_s)
        if status is not None:
            self.completed += 1
            self.status_counts[status] = self.status_counts.get(status, 0) + 1
        if failure is not None:
            self.failures[failure] += 1
        if opened_connection:
            self.connections_opened += 1
        if connect_s is not None:
            self._record(self.phases["connect"], connect_s)
            if tls_s is not None:
                self._record(self.phases["tls"], tls_s)
        if latency_s is None:
            return
        self._record(self.latency, latency_s)
        self._record(self.recent, latency_s)
        self._record(self.service, service_s)
        if ttfb_s is not None:
            self._record(self.phases["ttfb"], ttfb_s)
        if body_s is not None:
            self._record(self.phases["body"], body_s)
        tail = self._tail
        tail["latency"].append(latency_s * 1e3)
        tail["schedule_lag"].append(lag_s * 1e3)
        tail["connect"].append((connect_s or 0.0) * 1e3)
        tail["tls"].append((tls_s or 0.0) * 1e3)
        tail["ttfb"].append((ttfb_s or 0.0) * 1e3)
        tail["body"].append((body_s or 0.0) * 1e3)

    def sample(self, example: ResponseExample) -> None:
        """Keep a few examples of each failure kind."""
        seen = self._examples_per_kind.get(example.kind, 0)
        if seen >= self.MAX_EXAMPLES_PER_KIND:
            return
        self._examples_per_kind[example.kind] = seen + 1
        if example.body is not None and len(example.body) > self.MAX_EXAMPLE_BODY:
            example.body = example.body[: self.MAX_EXAMPLE_BODY] + "..."
        self.examples.append(example)

    def wants_example(self, kind: str) -> bool:
        return self._examples_per_kind.get(kind, 0) < self.MAX_EXAMPLES_PER_KIND

    def tail_shares(self, p99_ms: float | None) -> PhaseShares:
        """Average split of latency among requests at or above the p99."""
        if p99_ms is None:
            return PhaseShares()
        latency = self._tail["latency"]
        # The histogram's p99 is rounded to its bucket; compare with a hair of slack.
        cut = p99_ms * 0.999
        rows = [i for i, value in enumerate(latency) if value >= cut]
        total = sum(latency[i] for i in rows)
        if not rows or total <= 0:
            return PhaseShares()
        sums = {name: sum(self._tail[name][i] for i in rows) for name in PhaseShares.model_fields}
        return PhaseShares(**{name: round(min(1.0, value / total), 4) for name, value in sums.items()})

    def build(
        self,
        *,
        target: str,
        requested_rate: float,
        elapsed_s: float,
        aborted: bool,
        abort_reason: str | None,
        lag_limit_ms: float,
    ) -> ProbeResult:
        latency = percentiles_of(self.latency)
        lag = percentiles_of(self.lag)
        warnings: list[str] = []
        bottleneck: str | None = None
        if self.pool_waits:
            bottleneck = "connection_pool"
            warnings.append(
                f"{self.pool_waits} requests waited for a free connection: the pool limited the load; "
                "raise max_connections (the latencies include that wait)"
            )
        # A handful of samples makes p99 the single worst one: judge only runs of some size.
        if lag.p99 is not None and lag.p99 > lag_limit_ms and lag.count >= 100:
            bottleneck = "scheduler"
            warnings.append(
                f"schedule lag p99 {lag.p99:.2f} ms exceeds {lag_limit_ms:g} ms: the probe could not keep "
                "its schedule (its CPU was busy); lower the rate or run it on a less busy machine"
            )
        achieved = self.sent / elapsed_s if elapsed_s > 0 else 0.0
        return ProbeResult(
            target=target,
            requested_rate=round(requested_rate, 3),
            achieved_rate=round(achieved, 3),
            duration_s=round(elapsed_s, 3),
            sent=self.sent,
            completed=self.completed,
            aborted=aborted,
            abort_reason=abort_reason,
            latency_ms=latency,
            service_time_ms=percentiles_of(self.service),
            schedule_lag_ms=lag,
            phases_ms=Phases(**{name: percentiles_of(h) for name, h in self.phases.items()}),
            status_counts={str(k): v for k, v in sorted(self.status_counts.items())},
            failures=Failures(**self.failures),
            examples=list(self.examples),
            histogram=self.latency.encode().decode() if self.latency.get_total_count() else "",
            finished=self.finished,
            connections_opened=self.connections_opened,
            pool_waits=self.pool_waits,
            phase_share_p99=self.tail_shares(latency.p99),
            bottleneck=bottleneck,
            warnings=warnings,
        )
