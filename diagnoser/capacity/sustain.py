"""Whether a step was sustainable: an open-loop step that piles up work has no p99 to report.

A step's p99 describes a rate only when the step reached a steady state. When the service
answers more slowly than requests arrive, the requests in flight grow through the step (a
backlog), and every percentile grows with the step's length: a 30 s step reports a p99 ten
times a 3 s step's, and neither is the latency of that rate. When the sender itself cannot keep
its schedule (its CPU is short), its sends fall further behind their intended times, and the
step measures the load generator. Either way the step is *unsustainable*: it fails, and the
report says why instead of quoting a p99.

Both are judged from the watcher's samples (every quarter second while the step sends, from
the probe's live tally): the requests in flight (sent minus finished) and the worst lag of the
sends since the previous sample. The step's sending time is split in quarters; the second
quarter (the first is the ramp to a steady state: a request in flight for its latency) is
compared with the last one. A quantity *grows* when every sample of the last quarter is above
every sample of the second (one stall of the host raises a few samples, not all of them) and
its median rose by a material amount:

- the backlog: by at least :data:`MIN_BACKLOG_GROWTH` of the offered rate per second (the
  service answers below nine tenths of what it is sent) and :data:`MIN_BACKLOG` requests;
- the send schedule: by at least :data:`MIN_LAG_GROWTH` seconds per second, to a lag of at least
  :data:`MIN_LAG_S` at the step's end.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from diagnoser.capacity.report import Unsustainable

__all__ = ["MIN_BACKLOG", "MIN_BACKLOG_GROWTH", "MIN_LAG_GROWTH", "MIN_LAG_S", "StepSample", "judge_sustain"]

#: The backlog must grow by this share of the offered rate per second...
MIN_BACKLOG_GROWTH = 0.1
#: ...and by at least this many requests, so that a few slow answers at a low rate are not one.
MIN_BACKLOG = 10
#: The send lag must grow by this many seconds per second of the step...
MIN_LAG_GROWTH = 0.05
#: ...and end at least this far behind.
MIN_LAG_S = 0.1
#: Fewest samples (a quarter second each) a step needs for a judgement.
_MIN_SAMPLES = 6


@dataclass(frozen=True)
class StepSample:
    """One reading of a running step's tally."""

    elapsed_s: float
    completed: int
    #: Requests sent so far.
    sent: int
    in_flight: int
    #: The worst lag of the sends since the previous reading (seconds).
    send_lag_s: float


def judge_sustain(samples: Sequence[StepSample], rate: float) -> Unsustainable | None:
    """``None`` when the step reached a steady state (or ran too briefly to tell); else why not.

    A late schedule is named before a backlog: a sender whose event loop cannot keep up also reads
    its answers late, so what it has in flight grows too, and the service is not why. A service
    that answers too slowly leaves the sender on time.
    """
    samples = _while_sending(samples)
    if len(samples) < _MIN_SAMPLES:
        return None
    span = samples[-1].elapsed_s
    early = [s for s in samples if span / 4 <= s.elapsed_s < span / 2]
    late = [s for s in samples if s.elapsed_s >= 3 * span / 4]
    if len(early) < 2 or len(late) < 2:
        return None
    dt = statistics.mean(s.elapsed_s for s in late) - statistics.mean(s.elapsed_s for s in early)
    if dt <= 0:
        return None
    lag = _growth([s.send_lag_s for s in early], [s.send_lag_s for s in late], dt)
    end_lag = max(s.send_lag_s for s in late)
    if lag is not None and lag >= MIN_LAG_GROWTH and end_lag >= MIN_LAG_S:
        return Unsustainable(cause="schedule", behind_s=round(end_lag, 2), growth_per_s=round(lag, 3))
    backlog = _growth([s.in_flight for s in early], [s.in_flight for s in late], dt)
    if backlog is not None and backlog >= MIN_BACKLOG_GROWTH * rate and backlog * dt >= MIN_BACKLOG:
        return Unsustainable(cause="backlog", in_flight=samples[-1].in_flight, growth_per_s=round(backlog, 1))
    return None


def _while_sending(samples: Sequence[StepSample]) -> Sequence[StepSample]:
    """The samples up to the last one with a send since the one before: a reading taken once the
    schedule was over (the watcher reads until just past the step's planned end) sees no send
    late and the backlog draining, which describes no rate."""
    end = len(samples)
    while end > 1 and samples[end - 1].sent <= samples[end - 2].sent:
        end -= 1
    return samples[:end]


def _growth(early: Sequence[float], late: Sequence[float], dt: float) -> float | None:
    """The rise per second of the medians when every late value is above every early one; else ``None``."""
    if min(late) <= max(early):
        return None
    return (statistics.median(late) - statistics.median(early)) / dt
