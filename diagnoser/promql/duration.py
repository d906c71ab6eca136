"""Durations (``90s``, ``1h30m``, ``1m2.345s``): the one parser and printer diagnoser has.

:func:`duration_seconds` reads every spelling diagnoser meets: Prometheus' (``5m``, ``1h30m``,
``500ms``, ``2d``, ``1y`` of 365 days, ``0``), as ranges, ``offset``, flags and rule files write
them, and Go's (``time.Duration.String()``: ``1m2.345s``, ``1.5h``, ``350ms``, ``1.5µs``), as
Kubernetes events write them. A duration is one or more ``<number><unit>`` parts, the number a
decimal, the unit one of ``ns``, ``us``/``µs``/``μs``, ``ms``, ``s``, ``m``, ``h``, ``d``, ``w``
and ``y``. It is a length of time: a sign is refused (``--at -30m`` reads its sign itself).

:func:`is_duration` is narrower: what PromQL accepts inside a query (whole numbers, ``ms`` to
``y``), for values that are written into one::

    duration_seconds("1h30m")     # 5400.0
    duration_seconds("1m2.345s")  # 62.345
    is_duration("1.5h")           # False: Prometheus refuses [1.5h]
    format_duration(90.0)         # "1m30s"
"""

from __future__ import annotations

import re

__all__ = ["UNIT_SECONDS", "duration_seconds", "format_duration", "is_duration"]

#: Seconds per PromQL unit, largest first (the order :func:`format_duration` writes them in).
UNIT_SECONDS: dict[str, float] = {
    "y": 31_536_000.0, "w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0, "ms": 0.001,
}  # fmt: skip
#: Every unit :func:`duration_seconds` reads: PromQL's and Go's (``µ`` and ``μ`` both mean micro).
_ANY_UNIT_SECONDS: dict[str, float] = {
    **UNIT_SECONDS, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ns": 1e-9,
}  # fmt: skip
_PROMQL = re.compile(r"(?:\d+(?:ms|s|m|h|d|w|y))+")
# ``ms`` before ``m`` and ``s``, so that ``5ms`` is not read as five minutes and a stray s.
_UNIT = r"(ns|us|\u00b5s|\u03bcs|ms|s|m|h|d|w|y)"
_NUMBER = r"(\d+\.?\d*|\.\d+)"
_ANY = re.compile(rf"(?:{_NUMBER}{_UNIT})+|0")
_PART = re.compile(_NUMBER + _UNIT)


def is_duration(text: str) -> bool:
    """True when ``text`` is a duration PromQL accepts in a query (``5m``, ``1h30m``), alone."""
    return _PROMQL.fullmatch(text) is not None


def duration_seconds(text: str) -> float:
    """``text`` (``5m``, ``1h30m``, ``1m2.345s``, ``350ms``, ``1.5h``, ``0``) in seconds.

    Surrounding blanks are ignored; anything else (no unit, a space inside, a sign, an unknown
    unit) is a ``ValueError`` naming ``text``.
    """
    value = text.strip()
    if not _ANY.fullmatch(value):
        raise ValueError(f"{text!r} is not a duration like 30s, 5m, 1h30m or 1m2.345s")
    return float(sum(float(number) * _ANY_UNIT_SECONDS[unit] for number, unit in _PART.findall(value)))


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
