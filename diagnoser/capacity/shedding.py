"""A server that sheds load: the failing step's errors were refusals, at a rate it still answered.

A rate limiter, an admission controller or a load balancer's connection limit answers the excess
at once with HTTP 503 or 429 (gRPC ``UNAVAILABLE`` or ``RESOURCE_EXHAUSTED``) and shows no
saturation anywhere: no pool fills, no queue grows. When the rule pack names no cause at the knee
(or no Prometheus was read), such a step still says what the limit is: the rate of the answers
that were fine, which is about the limit the server enforces. Read from the probe's own counters,
so it needs no Prometheus.
"""

from __future__ import annotations

from diagnoser.capacity.report import Bottleneck
from diagnoser.models import Evidence
from diagnoser.probe import ProbeResult

__all__ = ["SHED_STATUSES", "load_shedding"]

#: Statuses a server answers when it refuses work it could otherwise do.
SHED_STATUSES = ("503", "429", "UNAVAILABLE", "RESOURCE_EXHAUSTED")
#: Refusals must be at least this share of the step's failures.
_MOSTLY = 0.5


def load_shedding(rate: float, result: ProbeResult) -> Bottleneck | None:
    """The load-shedding bottleneck of the failing step at ``rate``, or ``None`` when its failures
    were not mostly refusals."""
    failures = result.failures.total
    # A refusal is a status failure: a 503 the probe file expects is an answer, and a gRPC
    # RESOURCE_EXHAUSTED for a message too large is counted as ``too_large``, not here.
    refused = min(result.failures.status, sum(result.status_counts.get(code, 0) for code in SHED_STATUSES))
    if not failures or refused < _MOSTLY * failures or result.duration_s <= 0:
        return None
    ok_rate = round((result.finished - failures) / result.duration_s, 1)
    codes = ", ".join(
        f"{code} x{result.status_counts[code]}" for code in SHED_STATUSES if result.status_counts.get(code)
    )
    share = refused / result.finished if result.finished else 0.0
    rough = ""
    if result.aborted_on_errors:
        # Cut after a fraction of a second, the step's average leans on the limiter's burst.
        rough = (
            f" (over {result.duration_s:.1f} s only: the probe's abort rule stopped the step, so the rate "
            "is rough; raise probe.abort_error_ratio to measure it over the whole step)"
        )
    return Bottleneck(
        kind="load_shedding",
        cause="load_shedding",
        summary=(
            f"the server sheds load at ~{ok_rate:g} req/s: at {rate:g} req/s it refused {share:.0%} of the "
            f"requests ({codes}) and answered the rest, with no saturation signal{rough}"
        ),
        recommendation=(
            f"If ~{ok_rate:g} req/s is a limit someone set (a rate limiter, an admission or concurrency "
            "limit, a load balancer's), that is the capacity as configured: raise it only if the service "
            "behind it holds the SLO above it (run again with the limit lifted). If nobody set one, find "
            "what answers the refusals: the service, a sidecar or the proxy in front of it."
        ),
        first_seen_at_rate=rate,
        evidence=[
            Evidence(source="probe", query="answers that passed per second", value=ok_rate, name="ok_rate"),
            Evidence(
                source="probe",
                query=f"refusals ({', '.join(SHED_STATUSES)}) over finished requests",
                value=round(share, 4),
                threshold=_MOSTLY,
                name="refused_share",
            ),
        ],
    )
