from __future__ import annotations

import math

import pytest

from diagnoser.ruleset.expressions import ExpressionError, evaluate_expression, pool_size_for, shard_count_for
from diagnoser.ruleset.templating import MissingVariable, format_text, resolve_placeholders, variables_for


@pytest.mark.parametrize(
    ("rps", "latency", "headroom", "expected"),
    [(5000, 0.004, 1.25, 25), (200, 0.05, 1.0, 10), (0, 0.1, 1.25, 1), (1, 0.0001, 1.0, 1), (333, 0.03, 1.5, 15)],
)
def test_pool_size_by_littles_law(rps: float, latency: float, headroom: float, expected: int) -> None:
    assert pool_size_for(rps, latency, headroom) == expected


@pytest.mark.parametrize(
    ("rps", "latency", "current", "expected"),
    # A full pool of 10 whose hold time reads 1 ms at 100 uses/s: 11, not 1; a pool of 5 with 90
    # uses/s demanded held 0.125 s each: 15; no demand at all still needs more than the full 5.
    [(100, 0.001, 10, 11), (90, 0.125, 5, 15), (0, 0.1, 5, 6), (5000, 0.004, 10, 25)],
)
def test_pool_size_of_a_full_pool_is_never_below_its_size_plus_one(
    rps: float, latency: float, current: float, expected: int
) -> None:
    assert pool_size_for(rps, latency, 1.25, current) == expected


def test_if_missing_and_only_if_say_which_measurement_stood_in() -> None:
    assert evaluate_expression("if_missing(used / served, hold_s)", {"used": 5, "served": 40}) == 0.125
    assert evaluate_expression("coalesce(if_missing(1, hold_s), 0)", {"hold_s": 0.2}) == 0
    assert evaluate_expression("coalesce(only_if(size, size > 10), 7)", {"size": 12}) == 12
    assert evaluate_expression("coalesce(only_if(size, size > 10), 7)", {"size": 3}) == 7
    with pytest.raises(ExpressionError) as raised:
        evaluate_expression("only_if(1, 0)", {})
    assert raised.value.missing
    # A real problem in the guard is not mistaken for a missing value.
    with pytest.raises(ExpressionError) as raised:
        evaluate_expression("if_missing(1, 1 / zero)", {"zero": 0})
    assert not raised.value.missing
    with pytest.raises(ExpressionError, match="two arguments"):
        evaluate_expression("only_if(1)", {})


def test_shard_count_for_index_size() -> None:
    assert shard_count_for(300 * 1024**3) == 10
    assert shard_count_for(1) == 1


def test_expression_uses_named_values_and_functions() -> None:
    values = {"uses": 200.0, "hold": 0.05, "used": 10.0, "pending": 30.0, "params.headroom": 1.25}
    result = evaluate_expression("max(pool_size_for(uses, hold, params.headroom), ceil((used + pending) * params.headroom))", values)
    assert result == 50


@pytest.mark.parametrize(
    "expression",
    ["__import__('os')", "open('x')", "a.__class__", "[1, 2]", "'text'", "lambda: 1", "x[0]"],
)
def test_expression_rejects_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(ExpressionError):
        evaluate_expression(expression, {"a": 1, "x": 1})


def test_expression_missing_value_and_division_by_zero() -> None:
    with pytest.raises(ExpressionError, match="has no value"):
        evaluate_expression("a * 2", {"a": None})
    with pytest.raises(ExpressionError):
        evaluate_expression("1 / a", {"a": 0})


def test_placeholders_keep_type_when_whole_and_format_inside_text() -> None:
    variables = variables_for(slo_p99_ms=250, slo_error_ratio=0.01, signals={"queue_length": "q_len"}, params={"n": 3})
    resolved = resolve_placeholders(
        {"threshold": "${slo.p99_seconds}", "query": "sum(${signals.queue_length}) > ${params.n}", "keep": 1},
        variables,
    )
    assert resolved == {"threshold": 0.25, "query": "sum(q_len) > 3", "keep": 1}
    with pytest.raises(MissingVariable, match=r"signals\.other"):
        resolve_placeholders("${signals.other}", variables)


def test_format_text_is_lenient() -> None:
    text = format_text("{job}: {value:.1%} of {max:.0f} ({missing}) {params.headroom}", {
        "job": "api", "value": 0.953, "max": 10.0, "params.headroom": 1.25,
    })
    assert text == "api: 95.3% of 10 (not measured) 1.25"
    assert format_text("{value:.2f}", {"value": math.inf}) == "unbounded"
    assert format_text("{value:.2f}", {"value": math.nan}) == "not measured"
    assert format_text("{broken", {}) == "{broken"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1.0, "1 call per request"), (1.04, "1 call per request"), (2.0, "2 calls per request"),
     (1.5, "1.5 calls per request"), (0.0, "0 calls per request"), (None, "not measured per request")],
)
def test_a_count_and_its_noun_agree_as_printed(value: float | None, expected: str) -> None:
    assert format_text("{n:.2g|call|calls} per request", {"n": value}) == expected


def test_a_noun_without_a_plural_and_a_percentage() -> None:
    assert format_text("{n:.0f|sheep} left", {"n": 3.0}) == "3 sheep left"
    assert format_text("{n:.0f|replica|replicas}", {"n": 1.0}) == "1 replica"
