"""Numbers to act on: the formulas recommendations use, and a tiny safe expression evaluator.

A rule computes values in its ``compute`` block from the named values of its evidence::

    compute:
      pool_size: pool_size_for(peak_rps, hold_seconds, params.headroom)

Expressions allow numbers, names, ``+ - * / // % **``, comparisons, ``a if c else b`` and the
functions below; nothing else (no attribute access, no calls to arbitrary Python).
``coalesce(a, b, ...)`` is the first argument that has a value (a missing measurement is skipped);
``if_missing(a, b)`` is ``a`` only when ``b`` has no value, and ``only_if(a, c)`` is ``a`` only when
``c`` holds: both have no value otherwise, so a ``{?name text?}`` clause can say which of several
measurements stood in for a missing one.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from typing import Any

from diagnoser.errors import ExpressionError

__all__ = [
    "ExpressionError",
    "evaluate_expression",
    "parse_expression",
    "pool_size_for",
    "replicas_for",
    "shard_count_for",
]


def pool_size_for(rps: float, latency_s: float, headroom: float = 1.25, current: float = 0) -> int:
    """Connections a pool needs by Little's law: ``ceil(rps x latency_s x headroom)``, at least 1,
    and, given the ``current`` size of a pool that is exhausted, at least ``current + 1``: a pool
    found full needs more connections whatever a hold time measured elsewhere says.

    ``rps`` is the demand (served plus refused or timed out), never a queue's length: in an
    open-loop overload the queue grows without bound, and its length says nothing of the rate.

    >>> pool_size_for(5000, 0.004, 1.25)
    25
    >>> pool_size_for(100, 0.001, 1.25, current=10)
    11
    """
    floor = max(1, math.floor(current) + 1 if current > 0 else 1)
    if rps <= 0 or latency_s <= 0:
        return floor
    return max(floor, math.ceil(rps * latency_s * headroom - 1e-9))


def replicas_for(backlog: float, per_replica_rate: float, drain_seconds: float, current: float) -> int:
    """Replicas needed to drain ``backlog`` within ``drain_seconds`` on top of the current intake.

    Each replica processes ``per_replica_rate`` items/s; ``current`` replicas already exist.
    """
    if per_replica_rate <= 0 or drain_seconds <= 0:
        return max(1, math.ceil(current))
    extra = backlog / (per_replica_rate * drain_seconds)
    return max(1, math.ceil(current + extra))


def shard_count_for(index_bytes: float, target_shard_bytes: float = 30 * 1024**3) -> int:
    """Primary shards that keep each shard near ``target_shard_bytes`` (default 30 GiB)."""
    if index_bytes <= 0 or target_shard_bytes <= 0:
        return 1
    return max(1, math.ceil(index_bytes / target_shard_bytes))


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "ceil": math.ceil,
    "floor": math.floor,
    "round": round,
    "abs": abs,
    "min": min,
    "max": max,
    "pool_size_for": pool_size_for,
    "replicas_for": replicas_for,
    "shard_count_for": shard_count_for,
    "coalesce": lambda *args: next(a for a in args if a is not None),
    # Special forms, evaluated by _guarded (their arguments may have no value).
    "if_missing": lambda value, other: value,
    "only_if": lambda value, condition: value,
}
_GUARDS = frozenset({"if_missing", "only_if"})


def _guarded(name: str, args: list[ast.expr], values: Mapping[str, Any]) -> Any:
    """``if_missing(a, b)``: ``a`` when ``b`` has no value; ``only_if(a, c)``: ``a`` when ``c`` holds.

    Otherwise no value (a missing one, not a problem), as for a measurement not exported.
    """
    if len(args) != 2:
        raise ExpressionError(f"{name} takes two arguments")
    if name == "if_missing":
        try:
            _evaluate(args[1], values)
        except ExpressionError as exc:
            if not exc.missing:
                raise
            return _evaluate(args[0], values)
        raise ExpressionError(f"{name}: the second argument has a value", missing=True)
    if _evaluate(args[1], values):
        return _evaluate(args[0], values)
    raise ExpressionError(f"{name}: the condition does not hold", missing=True)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
}


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def parse_expression(text: str) -> ast.expr:
    """Parse and check ``text``; raises :class:`ExpressionError` for anything not allowed."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ExpressionError(f"not a valid expression: {text!r} ({exc.msg})") from exc
    _check(tree)
    return tree


def _check(node: ast.expr) -> None:
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, int | float) or isinstance(node.value, bool):
            raise ExpressionError(f"only numbers are allowed as constants, not {node.value!r}")
    elif isinstance(node, ast.Name | ast.Attribute):
        if _dotted_name(node) is None:
            raise ExpressionError("attribute access is allowed only on names such as params.headroom")
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise ExpressionError(f"operator {type(node.op).__name__} is not allowed")
        _check(node.left)
        _check(node.right)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        _check(node.operand)
    elif isinstance(node, ast.Compare):
        if any(type(op) not in _COMPARE for op in node.ops):
            raise ExpressionError("only <, <=, >, >=, ==, != comparisons are allowed")
        _check(node.left)
        for comparator in node.comparators:
            _check(comparator)
    elif isinstance(node, ast.IfExp):
        _check(node.test)
        _check(node.body)
        _check(node.orelse)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords:
            allowed = ", ".join(sorted(_FUNCTIONS))
            raise ExpressionError(f"only these functions may be called, positionally: {allowed}")
        for arg in node.args:
            _check(arg)
    else:
        raise ExpressionError(f"{type(node).__name__} is not allowed in an expression")


def evaluate_expression(text: str, values: Mapping[str, Any]) -> Any:
    """Evaluate ``text`` with ``values`` (flat names, dotted ones like ``params.headroom``)."""
    return _evaluate(parse_expression(text), values)


def _evaluate(node: ast.expr, values: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name | ast.Attribute):
        name = _dotted_name(node) or ""
        value = values.get(name)
        if value is None:
            raise ExpressionError(f"{name} has no value", missing=True)
        return value
    if isinstance(node, ast.BinOp):
        try:
            return _BINARY[type(node.op)](_evaluate(node.left, values), _evaluate(node.right, values))
        except (ZeroDivisionError, OverflowError) as exc:
            raise ExpressionError(str(exc)) from exc
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, values)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, values)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(comparator, values)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        test = _evaluate(node.test, values)
        return _evaluate(node.body, values) if test else _evaluate(node.orelse, values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "coalesce":
        # The first argument that has a value: a hold time measured by the pool, else the server's.
        for arg in node.args:
            try:
                return _evaluate(arg, values)
            except ExpressionError:
                continue
        raise ExpressionError("coalesce: none of its arguments has a value", missing=True)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _GUARDS:
        return _guarded(node.func.id, node.args, values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = [_evaluate(arg, values) for arg in node.args]
        try:
            return _FUNCTIONS[node.func.id](*args)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ExpressionError(f"{node.func.id}: {exc}") from exc
    raise ExpressionError(f"{type(node).__name__} is not allowed in an expression")
