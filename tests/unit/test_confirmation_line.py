"""The confirm probe's one line, per verdict: what a thread and ``diagnose verify`` print."""

from __future__ import annotations

from typing import Any

import pytest

from diagnoser.probe.confirm import Confirmation


def _found(**changes: Any) -> Confirmation:
    values: dict[str, Any] = {
        "target": "http://checkout.shop.svc:8080/v1/quote", "rate": 95.0, "requested_rate": 95.0,
        "duration_s": 10.0, "sent": 950, "finished": 950, "achieved_rate": 95.0, "p99_ms": 140.0,
        "error_ratio": 0.0, "slo_p99_ms": 300.0, "slo_error_ratio": 0.01, "before_p99_ms": 2400.0,
        "confirmed": True,
    }  # fmt: skip
    values.update(changes)
    return Confirmation(**values)


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({}, "p99 at 95 req/s: 2.4 s -> 140 ms, confirmed"),
        ({"before_p99_ms": None}, "p99 at 95 req/s: 140 ms, confirmed (SLO 300 ms)"),
        ({"rate": 50.0, "capped_by": "probe.max_rate"},
         "p99 at 50 req/s (capped from 95 by probe.max_rate): 2.4 s -> 140 ms, confirmed"),
        ({"confirmed": False, "failed_on": "latency", "p99_ms": 1900.0, "before_p99_ms": 2400.0},
         "not confirmed: p99 still 1.9 s at 95 req/s (SLO 300 ms; 2.4 s before)"),
        ({"confirmed": False, "failed_on": "latency", "p99_ms": 1900.0, "before_p99_ms": None},
         "not confirmed: p99 1.9 s at 95 req/s (SLO 300 ms)"),
        ({"confirmed": False, "failed_on": "errors", "error_ratio": 0.12},
         "not confirmed: 12 % of requests failed at 95 req/s (SLO 1 %); p99 140 ms, 2.4 s before"),
        ({"confirmed": False, "failed_on": "errors", "error_ratio": 0.12, "before_p99_ms": None},
         "not confirmed: 12 % of requests failed at 95 req/s (SLO 1 %); p99 140 ms"),
        ({"confirmed": False, "failed_on": "aborted", "sent": 11,
          "abort_reason": "error ratio 100% over the last 5 s"},
         "not confirmed: the probe stopped at 95 req/s after 11 requests (error ratio 100% over the last 5 s)"),
        ({"confirmed": False, "failed_on": "no_answers", "p99_ms": None, "finished": 0},
         "not confirmed: no answer to 950 requests at 95 req/s"),
    ],
)  # fmt: skip
def test_the_line_says_the_verdict_the_rate_and_the_numbers(changes: dict[str, Any], line: str) -> None:
    assert _found(**changes).text() == line
