"""PromQL durations (``90s``, ``1h30m``, ``500ms``): the one parser and printer diagnoser has.

A duration is one or more ``<integer><unit>`` parts, units ``ms``, ``s``, ``m``, ``h``, ``d``,
``w`` and ``y`` (365 days), as Prometheus writes them in ranges, ``offset`` and flags::

    duration_seconds("1h30m")   # 5400.0
    format_duration(90.0)       # "1m30s"
"""

from __future__ import annotations

import re

__all__ = ["UNIT_SECONDS", "duration_seconds", "format_duration", "is_duration"]

#: Seconds per unit, largest first (the order :func:`format_duration` writes them in).
UNIT_SECONDS: dict[str, float] = {
    "y": 31_536_000.0, "w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0, "ms": 0.001,
}  # fmt: skip
_WHOLE = re.compile(r"(?:\d+(?:ms|s|m|h|d|w|y))+")
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def is_duration(text: str) -> bool:
    """True when ``text`` is a PromQL duration (``5m``, ``1h30m``), with nothing around it."""
    return _WHOLE.fullmatch(text) is not None


def duration_seconds(text: str) -> float:
    """``text`` in seconds; ``ValueError`` naming it when it is not a PromQL duration."""
    if not is_duration(text):
        raise ValueError(f"{text!r} is not a PromQL duration like 30s, 5m or 1h30m")
    return sum(int(number) * UNIT_SECONDS[unit] for number, unit in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """A positive number of seconds as Prometheus writes it: ``1m30s``, ``1h``, ``250ms``."""
    millis = round(seconds * 1000)
    if millis <= 0:
        raise ValueError(f"{seconds!r} s is not a positive duration")
    parts = []
    for unit, size in UNIT_SECONDS.items():
        count, millis = divmod(millis, round(size * 1000))
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
