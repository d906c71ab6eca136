"""The deadline as the user feels it: counted from the moment the command started.

``--deadline 3`` means the report is on screen and the process gone about three seconds after
the user pressed Enter, so interpreter start-up, rule loading and the probe all spend the same
budget as the rules. :func:`remaining_deadline` turns the configured deadline into what is left
for rule evaluation, keeping a small reserve for printing the report and exiting.
"""

from __future__ import annotations

import os
import time

__all__ = ["RENDER_RESERVE_S", "process_age_s", "remaining_deadline"]

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


def remaining_deadline(deadline_s: float) -> float:
    """What is left of ``deadline_s`` for evaluating rules, after start-up and the render reserve."""
    return max(MIN_EVALUATION_S, deadline_s - process_age_s() - RENDER_RESERVE_S)
