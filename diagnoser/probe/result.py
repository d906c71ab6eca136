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

import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterable

from hdrh.histogram import HdrHistogram
from pydantic import BaseModel, ConfigDict, Field

from diagnoser.probe.validate import FAILURE_KINDS
from diagnoser.redact import redact_url

__all__ = [
    "ERROR_RATIO_ABORT",
    "HISTOGRAM_MAX_US",
    "SERIES",
    "Failures",
    "Percentiles",
    "PhaseShares",
    "ProbeRecorder",
    "ProbeResult",
    "ResponseExample",
    "RunCounts",
    "TailSums",
    "assemble_result",
    "merge_histograms",
    "new_histogram",
    "percentiles_of",
    "shares_from",
]

HISTOGRAM_MAX_US = 60_000_000
_PHASES = ("connect", "tls", "ttfb", "body")
#: What the recorder keeps per request; ``schedule_lag`` and the phases are PhaseShares' names.
SERIES = ("latency", "service", "schedule_lag", *_PHASES)


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


#: How the reason of a run stopped on its error ratio begins (:class:`~diagnoser.probe.open_loop.ProbeRun`
#: writes it; a worker's abort carries it to the merged result; the probe rules read it).
ERROR_RATIO_ABORT = "error ratio "


class ResponseExample(BaseModel):
    """A sampled failed response (body truncated) so a report can show what was wrong."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    #: The HTTP status, or the gRPC status name (``OK``, ``UNAVAILABLE``).
    status: int | str | None = None
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

    @property
    def aborted_on_errors(self) -> bool:
        """The run stopped early because too many of its requests failed: itself a verdict."""
        return self.aborted and (self.abort_reason or "").startswith(ERROR_RATIO_ABORT)

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


_NONE = math.nan


class ProbeRecorder:
    """Accumulates one run's measurements.

    Per request it appends a few floats to arrays (4 bytes each, ~30 bytes a request: 18 MB for
    the longest run the default caps allow) instead of recording into HdrHistograms: a
    ``record_value`` costs about 2.5 us of pure Python and a request has six values, which is
    a tenth of the probe's CPU per request. The histograms are built once, in :meth:`build`, and
    the arrays also explain the tail (:meth:`tail_shares`). ``nan`` marks a value that a request
    does not have (no connect on a reused connection, no latency without an answer).
    """

    MAX_EXAMPLES_PER_KIND = 3
    MAX_EXAMPLE_BODY = 512

    def __init__(self) -> None:
        #: HTTP status codes, or gRPC status names: one run has one kind.
        self.status_counts: dict[int | str, int] = {}
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_KINDS, 0)
        self.examples: list[ResponseExample] = []
        self._examples_per_kind: dict[str, int] = {}
        self.sent = 0
        self.completed = 0
        self.finished = 0
        self.connections_opened = 0
        self.pool_waits = 0
        #: The latest send whose intended time had passed by the most (seconds) since the last
        #: :meth:`take_send_lag`: how far the sender is behind its schedule, sampled while it runs.
        self.send_lag_max_s = 0.0
        #: Per finished request, in milliseconds.
        self.values: dict[str, array[float]] = {name: array("f") for name in SERIES}
        self._recent_from = 0

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
        status: int | str | None,
        failure: str | None,
    ) -> None:
        """Record one finished request; ``latency_s`` is ``None`` when no response and no timeout."""
        self.finished += 1
        if status is not None:
            self.completed += 1
            self.status_counts[status] = self.status_counts.get(status, 0) + 1
        if failure is not None:
            self.failures[failure] += 1
        if opened_connection:
            self.connections_opened += 1
        values = self.values
        values["latency"].append(_NONE if latency_s is None else latency_s * 1e3)
        values["service"].append(_NONE if latency_s is None else service_s * 1e3)
        values["schedule_lag"].append(lag_s * 1e3)
        values["connect"].append(_NONE if connect_s is None else connect_s * 1e3)
        values["tls"].append(_NONE if tls_s is None else tls_s * 1e3)
        values["ttfb"].append(_NONE if ttfb_s is None or latency_s is None else ttfb_s * 1e3)
        values["body"].append(_NONE if body_s is None or latency_s is None else body_s * 1e3)

    def take_send_lag(self) -> float:
        """The worst schedule lag (seconds) of the requests sent since the last call; resets it.

        The per-request lag series is recorded when a request finishes; this one is kept as it is
        sent, so a sender falling behind shows while its answers are still outstanding.
        """
        lag, self.send_lag_max_s = self.send_lag_max_s, 0.0
        return lag

    def recent_p99_ms(self) -> float | None:
        """p99 latency of the requests finished since the last call (for a live view)."""
        latency = self.values["latency"]
        recent = sorted(v for v in latency[self._recent_from :] if v == v)
        self._recent_from = len(latency)
        if not recent:
            return None
        return recent[min(len(recent) - 1, math.ceil(0.99 * len(recent)) - 1)]

    def histogram(self, name: str) -> HdrHistogram:
        """The HdrHistogram (microseconds) of one series: ``latency``, ``service``, ``connect``..."""
        histogram = new_histogram()
        # Counting first: distinct microsecond values are far fewer than requests.
        counts = Counter(int(v * 1e3) for v in self.values[name] if v == v)
        for value, count in counts.items():
            histogram.record_value(min(HISTOGRAM_MAX_US, max(1, value)), count)
        return histogram

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

    def tail_sums(self, p99_ms: float | None) -> TailSums:
        """The sums behind :meth:`tail_shares`: latency and each share's series over the requests at
        or above ``p99_ms``. Sums add up across workers, so shares merge exactly."""
        if p99_ms is None:
            return TailSums()
        values = self.values
        latency = values["latency"]
        # The histogram's p99 is rounded to its bucket; compare with a hair of slack.
        cut = p99_ms * 0.999
        rows = [i for i, value in enumerate(latency) if value >= cut]
        sums = {
            name: sum(values[name][i] for i in rows if values[name][i] == values[name][i])
            for name in PhaseShares.model_fields
        }
        return TailSums(rows=len(rows), total=sum(latency[i] for i in rows), sums=sums)

    def tail_shares(self, p99_ms: float | None) -> PhaseShares:
        """Average split of latency among requests at or above the p99."""
        return shares_from([self.tail_sums(p99_ms)])

    def histograms(self) -> dict[str, HdrHistogram]:
        """Every series' HdrHistogram (microseconds), by name."""
        return {name: self.histogram(name) for name in SERIES}

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
        return assemble_result(
            RunCounts.of(self),
            self.histograms(),
            self.tail_shares,
            target=target,
            requested_rate=requested_rate,
            elapsed_s=elapsed_s,
            aborted=aborted,
            abort_reason=abort_reason,
            lag_limit_ms=lag_limit_ms,
        )


class TailSums(BaseModel):
    """Sums over the requests at or above a latency cut (milliseconds), to merge tail shares."""

    model_config = ConfigDict(extra="forbid")

    rows: int = 0
    total: float = 0.0
    sums: dict[str, float] = Field(default_factory=dict)


def shares_from(parts: Iterable[TailSums]) -> PhaseShares:
    """Tail shares of one run from the sums of its parts (one part for a single process)."""
    parts = list(parts)
    total = sum(p.total for p in parts)
    if not sum(p.rows for p in parts) or total <= 0:
        return PhaseShares()
    return PhaseShares(
        **{
            name: round(min(1.0, sum(p.sums.get(name, 0.0) for p in parts) / total), 4)
            for name in PhaseShares.model_fields
        }
    )


class RunCounts(BaseModel):
    """The counters of a run (or of one worker's share of it): they add up across workers."""

    model_config = ConfigDict(extra="forbid")

    sent: int = 0
    completed: int = 0
    finished: int = 0
    connections_opened: int = 0
    pool_waits: int = 0
    #: By status as text (an HTTP code, or another transport's status name), as in the report.
    status_counts: dict[str, int] = Field(default_factory=dict)
    failures: dict[str, int] = Field(default_factory=lambda: dict.fromkeys(FAILURE_KINDS, 0))
    examples: list[ResponseExample] = Field(default_factory=list)

    @classmethod
    def of(cls, recorder: ProbeRecorder) -> RunCounts:
        return cls(
            sent=recorder.sent,
            completed=recorder.completed,
            finished=recorder.finished,
            connections_opened=recorder.connections_opened,
            pool_waits=recorder.pool_waits,
            status_counts={str(k): v for k, v in recorder.status_counts.items()},
            failures=dict(recorder.failures),
            examples=list(recorder.examples),
        )


def assemble_result(
    counts: RunCounts,
    histograms: dict[str, HdrHistogram],
    tail_shares: Callable[[float | None], PhaseShares],
    *,
    target: str,
    requested_rate: float,
    elapsed_s: float,
    aborted: bool,
    abort_reason: str | None,
    lag_limit_ms: float,
) -> ProbeResult:
    """The :class:`ProbeResult` of a run from its counters and histograms (one process or merged)."""
    latency_histogram = histograms["latency"]
    latency = percentiles_of(latency_histogram)
    lag = percentiles_of(histograms["schedule_lag"])
    warnings: list[str] = []
    bottleneck: str | None = None
    if counts.pool_waits:
        bottleneck = "connection_pool"
        warnings.append(
            f"{counts.pool_waits} requests waited for a free connection: the pool limited the load; "
            "raise max_connections (the latencies include that wait)"
        )
    # A handful of samples makes p99 the single worst one: judge only runs of some size.
    if lag.p99 is not None and lag.p99 > lag_limit_ms and lag.count >= 100:
        bottleneck = "scheduler"
        warnings.append(
            f"schedule lag p99 {lag.p99:.2f} ms exceeds {lag_limit_ms:g} ms: the probe could not keep "
            "its schedule (its CPU was busy); lower the rate or run it on a less busy machine"
        )
    achieved = counts.sent / elapsed_s if elapsed_s > 0 else 0.0
    return ProbeResult(
        target=redact_url(target),  # the report may be posted to Slack: no credentials
        requested_rate=round(requested_rate, 3),
        achieved_rate=round(achieved, 3),
        duration_s=round(elapsed_s, 3),
        sent=counts.sent,
        completed=counts.completed,
        aborted=aborted,
        abort_reason=abort_reason,
        latency_ms=latency,
        service_time_ms=percentiles_of(histograms["service"]),
        schedule_lag_ms=lag,
        phases_ms=Phases(**{name: percentiles_of(histograms[name]) for name in _PHASES}),
        # Three-digit HTTP codes sort as text as they do as numbers.
        status_counts=dict(sorted(counts.status_counts.items())),
        failures=Failures(**counts.failures),
        examples=list(counts.examples),
        histogram=latency_histogram.encode().decode() if latency.count else "",
        finished=counts.finished,
        connections_opened=counts.connections_opened,
        pool_waits=counts.pool_waits,
        phase_share_p99=tail_shares(latency.p99),
        bottleneck=bottleneck,
        warnings=warnings,
    )
