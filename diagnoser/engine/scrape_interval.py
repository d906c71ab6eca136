"""The confirmation window a diagnosis uses, at least so many scrapes long.

Rules confirm a problem over ``${confirm_window}`` (2m by default): a share of scrapes at a
limit, a peak, a ``rate()`` of refusals. At 15 s scrapes 2m holds 8 samples; at 60 s it holds 2,
so a share is one scrape in two, a peak is whichever of two scrapes happened to land, and a
``rate()`` has no second sample when one scrape is missing. So the window is widened to hold
:data:`SAMPLES_PER_CONFIRM_WINDOW` scrapes at the instant's scrape interval, up to ``${window}``,
measured from the ``up`` series themselves (Prometheus writes one per scrape, failed or not)::

    config = await with_scrape_floor(config, prometheus, at)   # 2m at 15 s, 4m at 30 s, 5m at 60 s

The interval is the finest one any target is scraped at (the most samples of ``up`` in
:data:`PROBE_WINDOW_S`, of the targets already scraped before it), so an estate with some targets
at 15 s keeps today's window for all, and an instant with under 5 minutes of history keeps it too.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from datetime import datetime

from diagnoser.engine.config import DiagnosisConfig
from diagnoser.models import SourceError
from diagnoser.promql import duration_seconds, format_duration
from diagnoser.sources.prometheus import PrometheusSource

__all__ = [
    "PROBE_WINDOW_S",
    "SAMPLES_PER_CONFIRM_WINDOW",
    "confirm_floor_s",
    "scrape_interval",
    "with_scrape_floor",
]

log = logging.getLogger(__name__)

#: The range the scrapes of ``up`` are counted over.
PROBE_WINDOW_S = 300.0
#: Scrapes a confirmation window holds at least: the 8 that the default 2m holds at 15 s scrapes,
#: so nothing changes at 15 s. The false positive it protects against is a 60 s scrape that
#: lands on a burst (a peak or a share of scrapes at a limit read from two samples); the misses
#: it fixes are the variation harness's 30 s and 60 s replays of the unseen beds
#: (node-open-fds-limit, pool and connection-limit beds), whose healthy instants stay quiet.
SAMPLES_PER_CONFIRM_WINDOW = 8
#: Widened windows are rounded up to whole multiples of this (a readable ``4m``, not ``3m38s``).
ROUND_S = 30.0


async def scrape_interval(source: PrometheusSource, at: datetime) -> float | None:
    """The finest scrape interval of any target at ``at`` (seconds), or ``None`` when unknown."""
    # Only targets scraped before the range began (a sample in the 5 minutes before it): a target
    # with 4 minutes of history holds 16 samples at 15 s, which would read as 19 s scrapes.
    window = format_duration(PROBE_WINDOW_S)
    query = f"max(count_over_time(up[{window}]) and up offset {window})"
    samples = await source.query(query, at)
    if isinstance(samples, SourceError) or not samples:
        return None
    count = samples[0].value
    if not math.isfinite(count) or count < 2:
        return None
    return PROBE_WINDOW_S / count


def confirm_floor_s(interval_s: float) -> float:
    """The shortest confirmation window at ``interval_s`` scrapes, rounded up to :data:`ROUND_S`
    but for a quarter of it: a target at 15 s with a scrape or two missing from the count
    (300 / 19 = 15.8 s) keeps 2m rather than 2m30s."""
    return math.ceil(SAMPLES_PER_CONFIRM_WINDOW * interval_s / ROUND_S - 0.25) * ROUND_S


async def with_scrape_floor(
    config: DiagnosisConfig, source: PrometheusSource | None, at: datetime
) -> DiagnosisConfig:
    """``config`` with its confirmation window widened to hold enough scrapes, if it must be."""
    if source is None:
        return config
    interval = await scrape_interval(source, at)
    if interval is None:
        interval = config.assumed_scrape_interval_s
    if interval is None:
        return config
    current = config.variables.confirm_window
    # Never longer than ``${window}``: a longer confirmation remembers transients the rules'
    # own window has forgotten (a process' slow first minutes woke the latency rule at the last
    # healthy instant of node-otel-http-stable-semconv-slow at 60 s with an 8m window).
    floor = min(confirm_floor_s(interval), duration_seconds(config.variables.window))
    if floor <= duration_seconds(current):
        return config
    widened = format_duration(floor)
    log.info("scrapes every %.0f s: confirmation window %s, not %s", interval, widened, current)
    return replace(config, variables=replace(config.variables, confirm_window=widened))
