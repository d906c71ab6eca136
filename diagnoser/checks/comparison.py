"""The comparisons rule conditions may use, shared by every check kind."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Literal

__all__ = ["Comparison", "compare"]

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
