"""``diagnose capacity grpc://...`` finds the knee of a real grpcio server with a concurrency limit.

The server handles one call at a time (an asyncio semaphore) and each takes 10 ms, so it serves
at most about 95 calls/s: below that the latency is the service time, above it the queue grows
without end. The search must put the capacity under that limit and above the rates that held.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import load_heavy, run_cli
from tests.probe.conftest import GrpcServer, start_grpc_server

pytestmark = [load_heavy]

#: One call at a time of 10 ms (plus the server's own overhead): at most 100 calls/s.
LIMIT_RPS = 100.0


@pytest.fixture(scope="module")
def limited_server(grpc_modules: tuple[Any, Any, Any]) -> Iterator[GrpcServer]:
    server = start_grpc_server(grpc_modules, "--limit", "1")
    try:
        yield server
    finally:
        server.close()


def test_capacity_finds_the_knee_of_a_concurrency_limit(limited_server: GrpcServer) -> None:
    result = run_cli(
        "capacity", limited_server.url(), "--data", '{"user_id": "u1"}', "--slo-p99-ms", "50",
        "--start-rate", "25", "--max-rate", "400", "--step-s", "2", "--precision", "0.2",
        "--warmup-s", "0.5", "--pause-s", "0.3", "--max-steps", "10", "--format", "json",
        timeout=120,
    )  # fmt: skip
    assert result.code == 1, result.stderr  # no --expect-rps, and the maximum rate did not hold
    report = json.loads(result.stdout)
    assert report["limit"] == "latency"
    assert report["target"] == limited_server.url()
    capacity = report["capacity_rps"]
    assert 25 <= capacity < LIMIT_RPS
    failed = [s for s in report["steps"] if s["counted"] and not s["held"]]
    assert failed and min(s["rate"] for s in failed) > capacity
    # Where it gave way, the server answered at most its limit, whatever the offered rate.
    assert all(s["served_rate"] is None or s["served_rate"] <= LIMIT_RPS for s in failed)
