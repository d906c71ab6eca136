"""Numbers as a person reads them: the one formatter behind every finding text and renderer.

Python's ``g`` format switches to scientific notation past its precision (``f"{17923:.3g}"`` is
``1.79e+04``), which nobody on call wants to decode at 3 a.m. Here a count in the thousands is
grouped (``17,923``), a larger one takes a suffix (``1.79M``), a small share keeps its zeros
(``0.00012``) and a value that is not a number says so in words::

    format_number(17923.4)          # "17,923"
    format_number(2_450_000)        # "2.45M"
    format_number(0.000123)         # "0.000123"
    format_number(139.46, digits=4) # "139.5"
    format_measure(0.973, "ratio")  # "97.3 %"
    format_measure(0.2286, "s")     # "228.6 ms"
"""

from __future__ import annotations

import math

__all__ = ["NOT_MEASURED", "format_measure", "format_number"]

#: What a NaN reads as: a measurement that did not give a number.
NOT_MEASURED = "not measured"
_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"))
_BYTE_SCALES = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def _significant(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits in plain decimal notation, trailing zeros cut."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{round(value, decimals):.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def format_number(value: float, digits: int = 3) -> str:
    """``value`` without scientific notation: ``17,923``, ``2.45M``, ``0.5``, ``0.000123``.

    ``digits`` significant digits below 1,000 and for suffixed values; whole numbers, grouped,
    from 1,000 to a million. NaN reads ``not measured``, infinities ``unbounded``.
    """
    if math.isnan(value):
        return NOT_MEASURED
    if math.isinf(value):
        return "unbounded" if value > 0 else "-unbounded"
    size = abs(value)
    for scale, suffix in _SUFFIXES:
        if size >= scale:
            return _significant(value / scale, digits) + suffix
    text = _significant(value, digits)
    if size >= 1000 or abs(float(text)) >= 1000:  # 999.96 rounds up to the thousands
        return f"{round(value):,}"
    return text


def format_measure(value: float, unit: str) -> str:
    """``97 %``, ``228.6 ms``, ``3.2 min``, ``1.5 GiB``, ``12/s``; the number alone for no known unit."""
    if math.isnan(value) or math.isinf(value):
        return format_number(value)
    if unit == "ratio":
        return f"{format_number(value * 100)} %"
    if unit in ("s", "ms"):
        seconds = value / 1000 if unit == "ms" else value
        if abs(seconds) < 1:
            return f"{format_number(seconds * 1000, 4)} ms"
        return f"{format_number(seconds / 60)} min" if abs(seconds) >= 120 else f"{format_number(seconds)} s"
    if unit == "bytes":
        for scale, name in _BYTE_SCALES:
            if abs(value) >= scale:
                return f"{format_number(value / scale)} {name}"
        return f"{value:.0f} B"
    text = format_number(value, 4)
    return text + (unit if unit == "/s" else f" {unit}" if unit else "")
