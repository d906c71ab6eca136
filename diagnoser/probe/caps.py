"""Which caps a run is held to: the probe's (background, safe for production) or a load test's.

``diagnose probe``, ``diagnose now --probe`` and the daemon run under :func:`probe_caps`
(``probe.max_rate`` and ``probe.max_duration_s``, up to the ``PROBE_*_CEILING`` constants).
``diagnose capacity`` and ``diagnose probe --load-test`` are explicit load tests and run under
:func:`capacity_caps` (``capacity.*``, up to ``CAPACITY_*_CEILING``): the aggregate rate over every
worker. The allowlist and the address rule are the same for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.config import (
    CAPACITY_MAX_DURATION_CEILING_S,
    CAPACITY_MAX_RATE_CEILING,
    PROBE_MAX_CONNECTIONS_CEILING,
    PROBE_MAX_DURATION_CEILING_S,
    PROBE_MAX_RATE_CEILING,
    PROBE_REQUEST_TIMEOUT_CEILING_S,
    CapacitySettings,
    ProbeSettings,
)

__all__ = ["LoadCaps", "capacity_caps", "effective_caps", "probe_caps"]


@dataclass(frozen=True)
class LoadCaps:
    """A run's rate and duration caps, and the settings and ceilings a refusal names."""

    max_rate: float
    max_duration_s: float
    rate_setting: str
    rate_ceiling: float
    duration_setting: str
    duration_ceiling: float


def probe_caps(settings: ProbeSettings) -> LoadCaps:
    """The probe's caps: the config's, never above the probe's hard ceilings."""
    return LoadCaps(
        max_rate=min(settings.max_rate, PROBE_MAX_RATE_CEILING),
        max_duration_s=min(settings.max_duration_s, PROBE_MAX_DURATION_CEILING_S),
        rate_setting="probe.max_rate",
        rate_ceiling=PROBE_MAX_RATE_CEILING,
        duration_setting="probe.max_duration_s",
        duration_ceiling=PROBE_MAX_DURATION_CEILING_S,
    )


def capacity_caps(settings: CapacitySettings) -> LoadCaps:
    """A load test's caps: ``capacity.*``, never above the capacity ceilings (aggregate rate)."""
    return LoadCaps(
        max_rate=min(settings.max_rate, CAPACITY_MAX_RATE_CEILING),
        max_duration_s=min(settings.max_duration_s, CAPACITY_MAX_DURATION_CEILING_S),
        rate_setting="capacity.max_rate",
        rate_ceiling=CAPACITY_MAX_RATE_CEILING,
        duration_setting="capacity.max_duration_s",
        duration_ceiling=CAPACITY_MAX_DURATION_CEILING_S,
    )


def effective_caps(settings: ProbeSettings) -> tuple[float, float, float, int]:
    """``(rate, duration_s, timeout_s, connections)`` caps: the config's, never above the ceilings.

    The config is validated against the ceilings already; this holds even for settings built
    without validation.
    """
    return (
        min(settings.max_rate, PROBE_MAX_RATE_CEILING),
        min(settings.max_duration_s, PROBE_MAX_DURATION_CEILING_S),
        min(settings.request_timeout_s, PROBE_REQUEST_TIMEOUT_CEILING_S),
        min(settings.max_connections, PROBE_MAX_CONNECTIONS_CEILING),
    )
