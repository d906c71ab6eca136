"""The probe rules on real gRPC runs: findings name the status codes and map to the existing causes."""

from __future__ import annotations

import pytest

from diagnoser.config import ProbeSettings
from diagnoser.engine import DiagnosisConfig, diagnose
from diagnoser.errors import ConfigError
from diagnoser.models import Diagnosis
from diagnoser.probe import ProbeResult, ProbeRun, build_spec
from diagnoser.probe.entry import GrpcRequest, resolve_target
from diagnoser.ruleset import load_rules
from diagnoser.sources import Sources
from tests.probe.conftest import GrpcServer

PROBE_RULES = [r for r in load_rules([], include_builtin=True) if r.id.startswith("probe/")]
SETTINGS = ProbeSettings(abort_error_ratio=1.0, request_timeout_s=0.1)


async def _probe(server: GrpcServer, data: str, rate: float = 60, duration_s: float = 0.5) -> ProbeResult:
    spec, explicit = build_spec(server.url(), rate=rate, duration_s=duration_s, grpc=GrpcRequest(data=data))
    spec = resolve_target(spec, SETTINGS, explicit_target=explicit)
    return await ProbeRun(spec, SETTINGS).run()


async def _diagnose(result: ProbeResult) -> Diagnosis:
    return await diagnose(PROBE_RULES, DiagnosisConfig(), Sources(probe=result))


def _fired(diagnosis: Diagnosis) -> dict[str, str]:
    return {f.rule_id: f.summary for f in diagnosis.findings}


async def test_healthy_calls_fire_nothing(grpc_server: GrpcServer) -> None:
    result = await _probe(grpc_server, '{"user_id": "u1"}')
    assert result.status_counts == {"OK": 30}
    assert (await _diagnose(result)).findings == []


async def test_unavailable_is_load_shedding_naming_the_status(grpc_server: GrpcServer) -> None:
    result = await _probe(grpc_server, '{"user_id": "unavailable"}')
    diagnosis = await _diagnose(result)
    fired = _fired(diagnosis)
    assert set(fired) == {"probe/probe-grpc-load-shedding", "probe/probe-error-rate-breach"}
    assert diagnosis.findings[0].cause == "load_shedding"
    assert "status codes: UNAVAILABLE 30 of 30 calls" in fired["probe/probe-grpc-load-shedding"]
    # The symptom names the status codes too.
    assert "UNAVAILABLE 30" in fired["probe/probe-error-rate-breach"]


async def test_slow_calls_are_deadline_exceeded(grpc_server: GrpcServer) -> None:
    result = await _probe(grpc_server, '{"user_id": "u1", "delay_ms": 400}', rate=40)
    assert result.status_counts == {"DEADLINE_EXCEEDED": 20}
    diagnosis = await _diagnose(result)
    fired = _fired(diagnosis)
    assert "probe/probe-grpc-deadline-exceeded" in fired
    assert "probe/probe-grpc-load-shedding" not in fired
    assert diagnosis.findings[0].cause == "deadline_exceeded"
    assert "DEADLINE_EXCEEDED 20 of 20 calls" in fired["probe/probe-grpc-deadline-exceeded"]


async def test_empty_maps_are_empty_success_response(grpc_server: GrpcServer) -> None:
    result = await _probe(grpc_server, '{"user_id": "nobody"}')
    diagnosis = await _diagnose(result)
    assert diagnosis.findings[0].cause == "empty_success_response"
    assert "e.g. OK {}" in diagnosis.findings[0].summary


def test_a_status_field_is_any_status_and_zero_when_absent() -> None:
    from diagnoser.checks.probe import ProbeParams, read_field

    result = ProbeResult(
        target="grpc://h:1/a.B/C", requested_rate=1, achieved_rate=1, duration_s=1, sent=4, completed=4,
        status_counts={"OK": 3, "UNAVAILABLE": 1},
    )  # fmt: skip
    assert read_field(result, "status_counts.UNAVAILABLE+status_counts.RESOURCE_EXHAUSTED") == 1
    assert read_field(result, "status_counts.503") == 0
    ProbeParams(field="status_counts.DEADLINE_EXCEEDED", threshold=0)
    with pytest.raises(ValueError, match="not a number"):
        ProbeParams(field="status_counts", threshold=0)


def test_grpc_flags_on_an_http_target_are_refused() -> None:
    with pytest.raises(ConfigError, match="apply to grpc"):
        build_spec("http://127.0.0.1:1/x", grpc=GrpcRequest(data="{}"))
