"""One run's clock: the deadline as the user feels it, spent by start-up, the probe and the rules.

``--deadline 3`` means the report is on screen and the process gone about three seconds after
the user pressed Enter, so interpreter start-up, rule loading and the probe all spend the same
budget as the rules. :func:`run_diagnosis <diagnoser.engine.run.run_diagnosis>` owns the one
:class:`Deadline` of a run and asks it, once the probe is done, how long the rules may take::

    deadline = Deadline.of_process(settings.deadline_s)    # diagnose now: since the process began
    deadline = Deadline.starting_now(settings.deadline_s)  # the daemon: since this run began
    deadline.for_rules()                                   # what is left, less the render reserve
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["MIN_EVALUATION_S", "RENDER_RESERVE_S", "Deadline", "process_age_s"]

#: Kept back from rule evaluation for rendering the report and interpreter exit.
RENDER_RESERVE_S = 0.2
#: Rules always get at least this long, however slow the start-up was.
MIN_EVALUATION_S = 0.5


def process_age_s() -> float:
    """Seconds since this process started (Linux ``/proc``); 0 where that cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # The command name (field 2) may hold spaces: fields after its closing parenthesis.
            fields = stat.read().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22: starttime, in clock ticks since boot
        uptime = time.clock_gettime(time.CLOCK_BOOTTIME)
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError, AttributeError):
        return 0.0


@dataclass(frozen=True)
class Deadline:
    """``seconds`` counted from ``started`` (``time.monotonic()``); see the module docstring."""

    seconds: float
    started: float
    #: Kept back for what follows the rules (printing the report, exiting).
    reserve_s: float = 0.0
    #: Rules get at least this long, however much start-up and the probe spent.
    floor_s: float = 0.0

    @classmethod
    def starting_now(cls, seconds: float) -> Deadline:
        """A budget that starts now, all of it for the run (the daemon's diagnoses)."""
        return cls(seconds, time.monotonic())

    @classmethod
    def of_process(cls, seconds: float) -> Deadline:
        """A budget that started with the process, keeping the render reserve (``diagnose now``)."""
        started = time.monotonic() - process_age_s()
        return cls(seconds, started, reserve_s=RENDER_RESERVE_S, floor_s=MIN_EVALUATION_S)

    def left_s(self) -> float:
        """Seconds left of the whole budget (0 once it is spent)."""
        return max(0.0, self.started + self.seconds - time.monotonic())

    def for_rules(self) -> float:
        """Seconds the rules may take from now: what is left, less the reserve, at least the floor."""
        return max(self.floor_s, self.left_s() - self.reserve_s)
