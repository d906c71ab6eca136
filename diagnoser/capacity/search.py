"""Which rate to try next: climb until a step fails, then narrow the knee.

The search is pure (no I/O), so its choices can be tested on their own. It climbs geometrically
from the start rate (each step ``growth`` times the last) until a step fails or the maximum rate
holds. Then it narrows the gap between the highest rate that held and the lowest that failed
until that gap is within ``precision`` of the rate that held. A failing open-loop step still
tells where the knee is: the service answered at about its capacity while the excess queued, so
the next steps go just below and just above that served rate before falling back to plain
bisection. That lands next to the knee in one or two steps instead of several, and never
steps further into overload than the first failure did. ::

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

    def record(self, rate: float, *, held: bool, served_rate: float | None = None) -> None:
        (self.held if held else self.failed).append(rate)
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
                return None
            return _rounded(min(self.max_rate, top * self.growth))
        return self._narrow()

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
            return None
        margin = self.precision / 4
        candidates: list[float] = []
        if self.estimate is not None:
            # Just under the measured knee first (it should hold), then just over it.
            candidates += [self.estimate * (1 - self.precision / 2), self.estimate * (1 + self.precision / 2)]
        candidates.append((low + high) / 2)
        for candidate in candidates:
            rate = _rounded(candidate)
            if low * (1 + margin) < rate < high * (1 - margin) and rate not in self.tried:
                return rate
        return None


def _rounded(rate: float) -> float:
    """Whole requests per second (a tenth below 10 req/s): rates a person can read and repeat."""
    return float(round(rate)) if rate >= 10 else round(rate, 1)
