"""Instants on the command line: RFC 3339 with a zone, unix seconds, or a time ago (``-30m``, ``2h``).

``--at`` looks back: an instant in the future is refused (Prometheus would answer with the latest
samples and the report would silently describe now), and so is a time without a zone, which
would otherwise be read in some zone the user did not mean.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from diagnoser.promql import duration_seconds, is_duration

__all__ = ["parse_instant"]

#: Clocks disagree a little: an instant this far ahead of ours still counts as now.
_CLOCK_SKEW = timedelta(seconds=5)


def parse_instant(text: str, *, now: datetime | None = None) -> datetime:
    """Parse ``text`` as a time ago (``-30m``, ``2h``: before ``now``), unix seconds or RFC 3339.

    Raises ValueError, with a hint, for anything else, a time without a zone, or the future.
    """
    now = now or datetime.now(UTC)
    value = text.strip()
    # A time ago is a PromQL duration, signed or not: ``-30m`` and ``30m`` both look back.
    sign, ago = (value[0], value[1:]) if value.startswith(("+", "-")) else ("", value)
    if is_duration(ago):
        if sign == "+":
            raise ValueError(f"{text!r} is in the future: --at looks back (-30m or 30m: thirty minutes ago)")
        try:
            return now - timedelta(seconds=duration_seconds(ago))
        except (OverflowError, ValueError):  # further back than a datetime reaches
            raise ValueError(f"{text!r} is further back than any time diagnoser can read") from None
    try:
        parsed = datetime.fromtimestamp(float(value), UTC)
    except ValueError:
        parsed = _rfc3339(text, value)
    except (OverflowError, OSError) as exc:
        raise ValueError(f"{text!r} is out of range for a unix time") from exc
    if parsed > now + _CLOCK_SKEW:
        ahead = parsed.strftime("%Y-%m-%dT%H:%M:%SZ")
        raise ValueError(f"{ahead} is in the future (now is {now:%Y-%m-%dT%H:%M:%SZ}): --at looks back")
    return parsed


def _rfc3339(text: str, value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise ValueError(
            f"{text!r} is neither RFC 3339 (2026-11-29T20:00:00Z), unix seconds nor a time ago (-30m, 2h)"
        ) from exc
    if parsed.tzinfo is None:
        raise ValueError(
            f"{text!r} has no time zone: add Z for UTC ({value}Z) or an offset ({value}+01:00)"
        )
    return parsed.astimezone(UTC)
