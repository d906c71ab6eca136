"""The comparisons rule conditions may use, shared by every check kind."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Literal

from diagnoser.promql import format_number

__all__ = ["Comparison", "compare", "filtered", "unfiltered"]

#: How a measured value is compared with its threshold in a rule.
Comparison = Literal[">", ">=", "<", "<=", "==", "!="]

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


def compare(value: float, op: Comparison, threshold: float) -> bool:
    """``value op threshold``; NaN never passes (a NaN ratio means no traffic, not a breach)."""
    if math.isnan(value):
        return False
    return _OPERATORS[op](value, threshold)


def filtered(query: str, op: Comparison | None, threshold: float | None) -> str:
    """``query`` with its comparison applied by the server, ``(query) > 0.95``: only the rows that
    may hold come back. At a million series most rows of a condition hold nowhere (every service's
    p99, one in twenty over its SLO); sent whole, they are what both the server and diagnoser
    spend their time encoding and decoding. The check still compares each row (:func:`compare`:
    PromQL keeps a NaN under ``!=``). Without a comparison, or with a threshold PromQL cannot
    write, the query is sent as it is."""
    if op is None or threshold is None or not math.isfinite(threshold):
        return query
    return f"({query}){_suffix(op, threshold)}"


def _suffix(op: Comparison, threshold: float) -> str:
    return f" {op} {format_number(threshold)}"


def unfiltered(sent: str, op: Comparison | None, threshold: float | None) -> str:
    """What :func:`filtered` wrapped, from the query as it was sent (its histograms read as the
    server holds them): what evidence shows, and what is asked again to read a cause's value once
    it no longer holds (``daemon.readings``)."""
    if op is None or threshold is None or not math.isfinite(threshold):
        return sent
    suffix = f"){_suffix(op, threshold)}"
    if sent.startswith("(") and sent.endswith(suffix):
        return sent[1 : -len(suffix)]
    return sent
