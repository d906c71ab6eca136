"""A fix confirmed by the probe: one open-loop run at a given rate, judged against the SLO.

``diagnose verify`` and the daemon's confirm probe (an incident resolved: is the service healthy
again at the load it failed under?) both come through here. The run is an ordinary probe run
(:class:`~diagnoser.probe.entry.PreparedProbe`): the probe's caps (``probe.max_rate``,
``probe.max_duration_s``, the request timeout, the connections), the allowlist for a target
nobody typed and the address rule all apply as they do to ``diagnose probe`` and the daemon's
probe job. A rate above ``probe.max_rate`` is either refused (:func:`confirm_spec` with
``cap=False``: a rate someone typed) or lowered to the cap and said so (``cap=True``: the rate
the daemon read from Prometheus). The verdict (:func:`judge`) is the one a capacity step uses:
held when the run was not aborted, its error ratio is within the SLO's and its p99 (from each
request's intended send time) is within the SLO's p99. ::

    spec, explicit = build_spec("probes/checkout.yaml")
    planned = confirm_spec(spec, rate=95, duration_s=10, settings=settings.probe, cap=True)
    confirmation = await confirm(planned, settings.probe, explicit_target=explicit,
                                 slo_p99_ms=300, slo_error_ratio=0.01, before_p99_ms=2400)
    confirmation.text()   # 'p99 at 95 req/s: 2.4 s -> 140 ms, confirmed'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from diagnoser.config import ProbeSettings
from diagnoser.errors import ConfigError
from diagnoser.numbers import format_measure, format_number
from diagnoser.probe.caps import probe_caps
from diagnoser.probe.open_loop import INTERRUPTED
from diagnoser.probe.result import ProbeResult
from diagnoser.probe.spec import ConstantSchedule, ProbeSpec

__all__ = ["ConfirmPlan", "Confirmation", "FailedOn", "confirm", "confirm_spec", "judge"]

#: Why a confirm probe did not confirm: its p99, its errors, an abort, or no answer at all.
FailedOn = Literal["latency", "errors", "aborted", "no_answers", "interrupted"]


class Confirmation(BaseModel):
    """What one confirm probe measured, and whether the SLO held (the JSON of ``diagnose verify``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    target: str
    #: The rate sent; ``requested_rate`` the one asked for (higher when ``capped_by`` lowered it).
    rate: float
    requested_rate: float
    #: The setting that lowered the rate (``probe.max_rate``), else ``None``.
    capped_by: str | None = None
    duration_s: float
    sent: int
    finished: int
    achieved_rate: float
    #: From each request's intended send time (no coordinated omission); ``None``: no answer.
    p99_ms: float | None
    error_ratio: float
    slo_p99_ms: float
    slo_error_ratio: float
    #: The p99 before the fix (the incident's, or ``--before-p99-ms``), when known.
    before_p99_ms: float | None = None
    confirmed: bool
    failed_on: FailedOn | None = None
    abort_reason: str | None = None

    def rate_text(self) -> str:
        """``95 req/s``, or ``50 req/s (capped from 95 by probe.max_rate)``."""
        text = f"{format_number(self.rate)} req/s"
        if self.capped_by is not None:
            text += f" (capped from {format_number(self.requested_rate)} by {self.capped_by})"
        return text

    def text(self) -> str:
        """The one line a thread or a terminal shows.

        ``p99 at 95 req/s: 2.4 s -> 140 ms, confirmed``; without a before, ``p99 at 95 req/s:
        140 ms, confirmed (SLO 300 ms)``; ``not confirmed: p99 still 1.9 s at 95 req/s (SLO
        300 ms; 2.4 s before)``; ``not confirmed: 12 % of requests failed at 95 req/s (SLO 1 %);
        p99 140 ms, 2.4 s before``.
        """
        slo = f"SLO {_ms(self.slo_p99_ms)}"
        at = self.rate_text()
        if self.confirmed:
            assert self.p99_ms is not None
            if self.before_p99_ms is not None:
                return f"p99 at {at}: {_ms(self.before_p99_ms)} -> {_ms(self.p99_ms)}, confirmed"
            return f"p99 at {at}: {_ms(self.p99_ms)}, confirmed ({slo})"
        before = f"{_ms(self.before_p99_ms)} before" if self.before_p99_ms is not None else ""
        if self.failed_on == "latency":
            assert self.p99_ms is not None
            if before:
                return f"not confirmed: p99 still {_ms(self.p99_ms)} at {at} ({slo}; {before})"
            return f"not confirmed: p99 {_ms(self.p99_ms)} at {at} ({slo})"
        if self.failed_on == "errors":
            share = format_measure(self.error_ratio, "ratio")
            p99 = "" if self.p99_ms is None else f"; p99 {_ms(self.p99_ms)}"
            p99 += f", {before}" if p99 and before else ""
            return (
                f"not confirmed: {share} of requests failed at {at}"
                f" (SLO {format_measure(self.slo_error_ratio, 'ratio')}){p99}"
            )
        if self.failed_on == "aborted":
            why = f" ({self.abort_reason})" if self.abort_reason else ""
            return f"not confirmed: the probe stopped at {at} after {self.sent} requests{why}"
        if self.failed_on == "interrupted":
            return f"not confirmed: the probe at {at} was interrupted after {self.sent} requests"
        return f"not confirmed: no answer to {self.sent} requests at {at}"


def _ms(value: float) -> str:
    return format_measure(value, "ms")


@dataclass(frozen=True)
class ConfirmPlan:
    """A spec with the confirm probe's constant schedule, and the rate asked for."""

    spec: ProbeSpec
    requested_rate: float
    capped_by: str | None = None


def confirm_spec(
    spec: ProbeSpec, *, rate: float, duration_s: float, settings: ProbeSettings, cap: bool
) -> ConfirmPlan:
    """``spec`` sent at a constant ``rate`` for ``duration_s``, its request and checks kept.

    With ``cap``, a rate or a duration over the probe's caps is lowered to them (the rate's
    setting is named in the line); without, it is left for :func:`~diagnoser.probe.spec.enforce_safety`
    to refuse, as ``diagnose probe`` refuses it.
    """
    caps = probe_caps(settings)
    requested, capped_by = rate, None
    if cap and rate > caps.max_rate:
        rate, capped_by = caps.max_rate, caps.rate_setting
    if cap:
        duration_s = min(duration_s, caps.max_duration_s)
    try:
        schedule = ConstantSchedule(rate=rate, duration_s=duration_s)
    except ValidationError as exc:
        raise ConfigError(f"confirm probe of {spec.target}: {exc.errors()[0]['msg']}") from exc
    return ConfirmPlan(spec.model_copy(update={"schedule": schedule}), requested, capped_by)


async def confirm(
    plan: ConfirmPlan,
    settings: ProbeSettings,
    *,
    explicit_target: bool,
    slo_p99_ms: float,
    slo_error_ratio: float,
    before_p99_ms: float | None = None,
) -> Confirmation:
    """Run the plan once, as the daemon's probe job runs a probe file (``ProbeSafetyError``
    before any request when it is refused; a gRPC target's types resolved off the loop), and
    judge it."""
    from diagnoser.probe.entry import run_probe

    result = await run_probe(plan.spec, settings, explicit_target=explicit_target)
    return judge(
        result, plan, slo_p99_ms=slo_p99_ms, slo_error_ratio=slo_error_ratio, before_p99_ms=before_p99_ms
    )


def judge(
    result: ProbeResult,
    plan: ConfirmPlan,
    *,
    slo_p99_ms: float,
    slo_error_ratio: float,
    before_p99_ms: float | None = None,
) -> Confirmation:
    """Whether ``result`` holds the SLO: not aborted, errors within the ratio, p99 within the SLO."""
    p99 = result.latency_ms.p99
    if p99 is not None and (math.isnan(p99) or math.isinf(p99)):
        p99 = None
    failed_on: FailedOn | None = None
    if result.aborted and result.abort_reason == INTERRUPTED:
        failed_on = "interrupted"
    elif result.aborted:
        failed_on = "aborted"  # the probe's own abort rule (the error ratio) or a stop of its own
    elif result.error_ratio > slo_error_ratio:
        failed_on = "errors"
    elif p99 is None or result.finished == 0:
        failed_on = "no_answers"
    elif p99 > slo_p99_ms:
        failed_on = "latency"
    return Confirmation(
        target=result.target,
        rate=plan.spec.peak_rate,
        requested_rate=plan.requested_rate,
        capped_by=plan.capped_by,
        duration_s=round(result.duration_s, 3),
        sent=result.sent,
        finished=result.finished,
        achieved_rate=result.achieved_rate,
        p99_ms=p99,
        error_ratio=result.error_ratio,
        slo_p99_ms=slo_p99_ms,
        slo_error_ratio=slo_error_ratio,
        before_p99_ms=before_p99_ms,
        confirmed=failed_on is None,
        failed_on=failed_on,
        abort_reason=result.abort_reason,
    )
