"""The two calls the rest of diagnoser uses: build a spec from what the user gave, and run it.

``diagnose now --probe probes/x.yaml`` and ``--probe URL --probe-rate N --probe-duration S``::

    spec, explicit = build_spec("probes/x.yaml")                  # a file: allowlist applies
    spec, explicit = build_spec("http://host/x", rate=20, duration_s=10)  # typed URL: no allowlist
    result = await run_probe(spec, settings.probe, explicit_target=explicit)
"""

from __future__ import annotations

from pathlib import Path

from diagnoser.config import ProbeSettings
from diagnoser.errors import ConfigError
from diagnoser.probe.open_loop import ProbeRun
from diagnoser.probe.result import ProbeResult
from diagnoser.probe.spec import (
    ProbeSpec,
    check_resolved_addresses,
    enforce_safety,
    load_probe_file,
    spec_from_url,
)

__all__ = ["DEFAULT_URL_DURATION_S", "DEFAULT_URL_RATE", "build_spec", "is_url", "run_probe"]

#: A URL typed without --rate/--duration gets a gentle probe.
DEFAULT_URL_RATE = 10.0
DEFAULT_URL_DURATION_S = 10.0


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def build_spec(
    target: str,
    *,
    rate: float | None = None,
    duration_s: float | None = None,
    ramp_s: float | None = None,
) -> tuple[ProbeSpec, bool]:
    """A spec from a URL or a probe file path, and whether the target was typed explicitly.

    For a file, ``rate``/``duration_s`` (when given) replace its schedule with a constant one, so
    ``diagnose probe probes/x.yaml --rate 5`` is a gentler run of the same definition.
    Raises :class:`ConfigError` for a bad file or values.
    """
    if is_url(target):
        return (
            spec_from_url(
                target,
                rate=rate if rate is not None else DEFAULT_URL_RATE,
                duration_s=duration_s if duration_s is not None else DEFAULT_URL_DURATION_S,
                ramp_s=ramp_s,
            ),
            True,
        )
    path = Path(target)
    if not path.exists():
        raise ConfigError(f"{target}: neither an http(s):// URL nor an existing probe file")
    spec = load_probe_file(path)
    if rate is not None or duration_s is not None or ramp_s is not None:
        override = spec_from_url(
            spec.target,
            rate=rate if rate is not None else spec.peak_rate,
            duration_s=duration_s if duration_s is not None else spec.duration_s,
            ramp_s=ramp_s,
        )
        spec = spec.model_copy(update={"schedule": override.schedule})
    return spec, False


async def run_probe(spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool) -> ProbeResult:
    """Check the safety rules (``ProbeSafetyError`` before any request), then run the probe."""
    enforce_safety(spec, settings, explicit_target=explicit_target)
    await check_resolved_addresses(spec, settings, explicit_target=explicit_target)
    return await ProbeRun(spec, settings, explicit_target=explicit_target).run()
