"""A gRPC probe over worker processes: the same open loop in each, one merged result.

The worker boundary carries the spec (its resolved message types included), so a ``grpc://``
target needs nothing of its own to run on workers: a second of light load through two of them.
"""

from __future__ import annotations

import json

from tests.conftest import run_cli
from tests.probe.conftest import GrpcServer


def test_a_grpc_probe_runs_on_two_workers_and_merges_as_one(grpc_server: GrpcServer) -> None:
    result = run_cli("probe", grpc_server.url(), "--data", '{"user_id": "u1"}', "-r", "200", "-d", "1",
                     "--workers", "2", "--format", "json", timeout=90)  # fmt: skip
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["sent"] == 200 and data["status_counts"] == {"OK": 200}
    assert data["latency_ms"]["count"] == 200
    assert data["connections_opened"] == 4  # two channels in each worker
    assert data["phases_ms"]["body"]["count"] == 0  # a unary answer has no download phase, as in one process
    assert grpc_server.stats().count == 200
