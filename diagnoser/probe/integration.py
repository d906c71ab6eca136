"""The probe inside ``diagnose now --probe``: a runner built (and checked) before anything runs.

``diagnose now --probe probes/x.yaml`` or ``--probe URL --probe-rate N --probe-duration S``::

    runner = probe_runner_for(target, rate=N, duration_s=S, settings=settings)  # may raise
    result = await runner()                                                  # a ProbeResult

The definition is validated and the safety rules (caps, the allowlist for probe files) are
applied when the runner is built, so a refused probe is a usage error (exit 2) before any
source is queried or any request sent. For a probe file the rate and duration come from the
file; ``rate``/``duration_s`` apply to a typed URL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from diagnoser.config import Settings
from diagnoser.probe.entry import build_spec, is_url
from diagnoser.probe.open_loop import ProbeRun
from diagnoser.probe.result import ProbeResult
from diagnoser.probe.spec import check_resolved_addresses, enforce_safety

__all__ = ["probe_runner_for"]


def probe_runner_for(
    target: str, *, rate: float, duration_s: float, settings: Settings
) -> Callable[[], Awaitable[ProbeResult]]:
    """Validate ``target`` (URL or probe file) and return a coroutine function that runs it once.

    Raises :class:`~diagnoser.errors.ConfigError` for a bad definition and
    :class:`~diagnoser.errors.ProbeSafetyError` for a probe over its caps or outside the allowlist.
    """
    if is_url(target):
        spec, explicit = build_spec(target, rate=rate, duration_s=duration_s)
    else:
        spec, explicit = build_spec(target)
    enforce_safety(spec, settings.probe, explicit_target=explicit)

    async def run() -> ProbeResult:
        await check_resolved_addresses(spec, settings.probe, explicit_target=explicit)
        return await ProbeRun(spec, settings.probe, explicit_target=explicit).run()

    return run
