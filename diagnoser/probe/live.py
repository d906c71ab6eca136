"""What a running probe shows while it runs: the progress view's numbers and a step's tally.

:class:`LiveStats` is the progress line (``diagnose probe``, ``diagnose capacity``).
:class:`Tally` is what a capacity step's watcher judges by (answers, failures, answers slower
than the SLO, requests in flight, how far the sender is behind its schedule); :class:`SlowCounter`
keeps it for one run, scanning only the answers new since its last call, so a step of thousands
of requests is read once, not on every tick. A worker process keeps both and sends them to its
coordinator, which adds them up (the send lag: it keeps the worst worker's).
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.probe.result import ProbeRecorder

__all__ = ["LiveStats", "SlowCounter", "Tally"]


@dataclass
class LiveStats:
    """What the live progress view shows; read it with ``ProbeRun.live()``."""

    elapsed_s: float
    planned_s: float
    sent: int
    finished: int
    failures: int
    achieved_rate: float
    recent_p99_ms: float | None
    in_flight: int


@dataclass
class Tally:
    """Answers, failures and answers slower than the step's limit, so far; what is in flight."""

    completed: int = 0
    failures: int = 0
    slow: int = 0
    #: Finished requests whose latency was scanned (0: no answer yet).
    scanned: int = 0
    #: Requests sent, and finished (an answer, a timeout, a failure): their difference is in flight.
    sent: int = 0
    finished: int = 0
    #: The worst schedule lag (seconds) of the sends since the previous tally (over workers: the
    #: worst worker's): how far the open-loop sender is behind its schedule.
    send_lag_s: float = 0.0

    @property
    def in_flight(self) -> int:
        return self.sent - self.finished


class SlowCounter:
    """Counts one run's answers slower than ``limit_ms`` (``None``: counts none)."""

    def __init__(self, recorder: ProbeRecorder, limit_ms: float | None) -> None:
        self.recorder = recorder
        self.limit_ms = limit_ms
        self.slow = 0
        self._scanned = 0

    def tally(self) -> Tally:
        recorder = self.recorder
        latencies = recorder.values["latency"]
        limit = self.limit_ms
        if limit is not None:
            self.slow += sum(1 for v in latencies[self._scanned :] if v > limit)
        self._scanned = len(latencies)
        return Tally(
            completed=recorder.completed,
            failures=sum(recorder.failures.values()),
            slow=self.slow,
            scanned=self._scanned,
            sent=recorder.sent,
            finished=recorder.finished,
            send_lag_s=recorder.take_send_lag(),
        )
