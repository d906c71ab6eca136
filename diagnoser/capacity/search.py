"""Which rate to try next: climb until a step fails, then narrow the knee.

The search is pure (no I/O), so its choices can be tested on their own. It climbs geometrically
from the start rate (each step ``growth`` times the last) until a step fails or the maximum rate
holds. Then it narrows the gap between the highest rate that held and the lowest that failed
until that gap is within ``precision`` of the rate that held. A failing open-loop step still
tells where the knee is: the service answered at about its capacity while the excess queued, so
the next steps go just below and just above that served rate before falling back to plain
bisection. That lands next to the knee in one or two steps instead of several, and never
steps further into overload than the first failure did. Climbing steps may be scouting steps,
cut short once they clearly hold; the capacity is only ever a rate that held a full step, so
a rate that held only a scouting step is run again in full before it is the answer. ::

    search = RateSearch(start_rate=50, max_rate=1000)
    while (rate := search.next_rate()) is not None:
        held, served = run_step(rate)
        search.record(rate, held=held, served_rate=served)
    search.capacity                      # highest rate that held below the first that failed

With fixed steps (``steps=[1000, 2000, 3000]``) it runs them in order and stops at the first
step that fails, the way a load-test write-up's table ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RateSearch"]

#: A failing step whose served rate is below this share of its offered rate measured the knee.
_SATURATED_SHARE = 0.97


@dataclass
class RateSearch:
    start_rate: float
    max_rate: float
    growth: float = 2.0
    precision: float = 0.1
    fixed_steps: list[float] | None = None
    held: list[float] = field(default_factory=list)
    failed: list[float] = field(default_factory=list)
    #: The knee as the latest saturated step measured it (its served rate), if any.
    estimate: float | None = None
    #: Rates that held on a shortened (scouting) step: the capacity is only claimed for a rate
    #: that held a full step, so the last of these is run again in full before the answer.
    scouted: set[float] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.start_rate <= 0 or self.max_rate <= 0:
            raise ValueError("rates must be positive")
        if self.growth <= 1:
            raise ValueError("growth must be above 1")
        if not 0 < self.precision < 1:
            raise ValueError("precision must be between 0 and 1")

    @property
    def tried(self) -> list[float]:
        return [*self.held, *self.failed]

    @property
    def lowest_failure(self) -> float | None:
        return min(self.failed) if self.failed else None

    @property
    def capacity(self) -> float | None:
        """The highest rate that held below the lowest that failed; ``None`` if none did."""
        ceiling = self.lowest_failure
        below = [r for r in self.held if ceiling is None or r < ceiling]
        return max(below) if below else None

    def record(
        self, rate: float, *, held: bool, served_rate: float | None = None, scouted: bool = False
    ) -> None:
        (self.held if held else self.failed).append(rate)
        if held and scouted:
            self.scouted.add(rate)
        else:
            self.scouted.discard(rate)
        if not held and served_rate is not None and served_rate < rate * _SATURATED_SHARE:
            self.estimate = served_rate

    def next_rate(self) -> float | None:
        """The rate of the next step, or ``None`` when the answer is known."""
        if self.fixed_steps is not None:
            return self._next_fixed()
        if not self.tried:
            return _rounded(min(self.start_rate, self.max_rate))
        if not self.failed:
            top = max(self.held)
            if top >= self.max_rate:
                return self._confirm(top)
            return _rounded(min(self.max_rate, top * self.growth))
        return self._narrow()

    def _confirm(self, rate: float | None) -> float | None:
        """``rate`` again when it only held a scouting step; else ``None``: the answer is known."""
        return rate if rate is not None and rate in self.scouted else None

    def _next_fixed(self) -> float | None:
        assert self.fixed_steps is not None
        if self.failed:
            return None
        remaining = [r for r in self.fixed_steps if r not in self.tried]
        return remaining[0] if remaining else None

    def _narrow(self) -> float | None:
        low, high = self.capacity, self.lowest_failure
        assert high is not None
        if low is None or high - low <= self.precision * low:
            return self._confirm(low)
        margin = self.precision / 4
        candidates: list[float] = []
        if self.estimate is not None:
            # Just under the measured knee first (it should hold), then just over it: close enough
            # together (0.8 of the precision) that the pair closes the gap when the estimate is right.
            spread = 0.4 * self.precision
            candidates += [self.estimate * (1 - spread), self.estimate * (1 + spread)]
        candidates.append((low + high) / 2)
        for candidate in candidates:
            rate = _rounded(candidate)
            if low * (1 + margin) < rate < high * (1 - margin) and rate not in self.tried:
                return rate
        return self._confirm(low)


def _rounded(rate: float) -> float:
    """Whole requests per second (a tenth below 10 req/s): rates a person can read and repeat."""
    return float(round(rate)) if rate >= 10 else round(rate, 1)
