"""Instants on the command line: RFC 3339 with a zone, unix seconds, or a time ago (``-30m``, ``2h``).

``--at`` looks back: an instant in the future is refused (Prometheus would answer with the latest
samples and the report would silently describe now), and so is a time without a zone, which
would otherwise be read in some zone the user did not mean.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = ["parse_instant"]

_AGO = re.compile(r"([+-]?)((?:\d+(?:ms|s|m|h|d|w))+)")
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: Clocks disagree a little: an instant this far ahead of ours still counts as now.
_CLOCK_SKEW = timedelta(seconds=5)


def parse_instant(text: str, *, now: datetime | None = None) -> datetime:
    """Parse ``text`` as a time ago (``-30m``, ``2h``: before ``now``), unix seconds or RFC 3339.

    Raises ValueError, with a hint, for anything else, a time without a zone, or the future.
    """
    now = now or datetime.now(UTC)
    value = text.strip()
    ago = _AGO.fullmatch(value)
    if ago:
        if ago.group(1) == "+":
            raise ValueError(f"{text!r} is in the future: --at looks back (-30m or 30m: thirty minutes ago)")
        seconds = sum(int(n) * _UNIT_S[unit] for n, unit in _PART.findall(ago.group(2)))
        return now - timedelta(seconds=seconds)
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
