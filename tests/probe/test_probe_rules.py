"""The probe rules through the real engine, on results of real probe runs (one firing, one silent each)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from diagnoser.checks.probe import ProbeParams, probe_check, read_field
from diagnoser.config import ProbeSettings, Settings
from diagnoser.engine import DiagnosisConfig, diagnose
from diagnoser.models import Diagnosis
from diagnoser.probe import ProbeResult, ProbeRun, build_spec, prepare_probe, spec_from_url
from diagnoser.ruleset import load_rules
from diagnoser.sources import Sources
from tests.probe.conftest import DelayServer

PROBE_RULES = [r for r in load_rules([], include_builtin=True) if r.id.startswith("probe/")]


async def _probe(url: str, rate: float = 60, duration_s: float = 0.5) -> ProbeResult:
    spec = spec_from_url(url, rate=rate, duration_s=duration_s)
    return await ProbeRun(spec, ProbeSettings(abort_error_ratio=1.0)).run()


async def _diagnose(result: ProbeResult | None, **slo: float) -> Diagnosis:
    settings = Settings.model_validate({"slo": slo} if slo else {})
    # The diagnosis carries the probe result it read, as diagnose now and the daemon report it.
    return await diagnose(PROBE_RULES, DiagnosisConfig.from_settings(settings), Sources(probe=result))


def _fired(diagnosis: Diagnosis) -> dict[str, str]:
    return {f.rule_id: f.summary for f in diagnosis.findings}


def test_all_eight_rules_load() -> None:
    assert sorted(r.id for r in PROBE_RULES) == [
        "probe/probe-empty-success-response",
        "probe/probe-error-rate-breach",
        "probe/probe-grpc-deadline-exceeded",
        "probe/probe-grpc-load-shedding",
        "probe/probe-latency-slo-breach",
        "probe/probe-target-unreachable",
        "probe/probe-tls-handshake-overhead",
        "probe/probe-truncated-response",
    ]


async def test_a_healthy_target_fires_nothing(server: DelayServer) -> None:
    result = await _probe(server.url + "/delay?ms=5")
    diagnosis = await _diagnose(result, p99_ms=500)
    assert diagnosis.findings == []
    assert diagnosis.errors == []
    assert diagnosis.probe is not None
    assert diagnosis.probe["sent"] == 30


async def test_without_a_probe_run_the_rules_are_skipped() -> None:
    diagnosis = await _diagnose(None)
    assert diagnosis.findings == []
    assert diagnosis.errors == []


async def test_latency_over_the_slo(server: DelayServer) -> None:
    result = await _probe(server.url + "/delay?ms=30")
    fired = _fired(await _diagnose(result, p99_ms=20))
    assert set(fired) == {"probe/probe-latency-slo-breach"}
    summary = fired["probe/probe-latency-slo-breach"]
    assert f"{result.latency_ms.p99:.1f} ms over the SLO of 20 ms" in summary
    assert _fired(await _diagnose(result, p99_ms=200)) == {}


async def test_empty_answers_are_empty_success_response_with_the_body(server: DelayServer) -> None:
    result = await _probe(server.url + "/empty-object")
    diagnosis = await _diagnose(result)
    fired = _fired(diagnosis)
    assert set(fired) == {"probe/probe-empty-success-response", "probe/probe-error-rate-breach"}
    assert "e.g. 200 {}" in fired["probe/probe-empty-success-response"]
    # The cause that explains the symptom is ranked first.
    assert diagnosis.findings[0].cause == "empty_success_response"
    evidence = diagnosis.findings[0].evidence[0]
    assert evidence.source == "probe"
    assert evidence.value == 1.0
    assert evidence.detail is not None
    assert "200 {}" in evidence.detail


async def test_a_probe_file_with_a_json_path_reports_an_empty_features_map(
    tmp_path: Path, server: DelayServer
) -> None:
    path = tmp_path / "features.yaml"
    path.write_text(
        f"target: {server.url}/empty-features\n"
        "schedule: {rate: 40, duration_s: 0.5}\n"
        "expect: {json_path: $.features, non_empty_json: false}\n"
    )
    settings = Settings.model_validate({"probe": {"allowed_hosts": ["127.0.0.1"], "abort_error_ratio": 1.0}})
    probe = prepare_probe(str(path), rate=10, duration_s=10, settings=settings.probe)
    result = await probe()
    assert result.sent == 20  # the file's schedule, not the flags' defaults
    diagnosis = await diagnose(PROBE_RULES, DiagnosisConfig.from_settings(settings), Sources(probe=result))
    finding = next(f for f in diagnosis.findings if f.cause == "empty_success_response")
    assert '200 {"features": {}}' in finding.summary
    assert "missing_path 20 of 20 requests" in finding.summary


async def test_a_probe_file_outside_the_allowlist_is_refused_when_the_probe_is_prepared(tmp_path: Path) -> None:
    from diagnoser.errors import ProbeSafetyError

    path = tmp_path / "p.yaml"
    path.write_text("target: http://10.1.2.3/\nschedule: {rate: 1, duration_s: 1}\n")
    with pytest.raises(ProbeSafetyError, match="allowed_hosts"):
        prepare_probe(str(path), rate=10, duration_s=10, settings=Settings().probe)


async def test_truncated_bodies(server: DelayServer) -> None:
    result = await _probe(server.url + "/truncated")
    fired = _fired(await _diagnose(result))
    assert "probe/probe-truncated-response" in fired
    assert "Content-Length 100 but 20 bytes received" in fired["probe/probe-truncated-response"]
    assert "probe/probe-truncated-response" not in _fired(
        await _diagnose(await _probe(server.url + "/delay?ms=1"))
    )


async def test_503s_are_an_error_rate_breach(server: DelayServer) -> None:
    result = await _probe(server.url + "/unavailable")
    fired = _fired(await _diagnose(result, error_ratio=0.05))
    assert set(fired) == {"probe/probe-error-rate-breach"}
    assert "100.00% of probe requests failed (SLO 5.00%)" in fired["probe/probe-error-rate-breach"]


async def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = await _probe(f"http://127.0.0.1:{port}/", rate=20)
    fired = _fired(await _diagnose(result))
    assert "probe/probe-target-unreachable" in fired
    assert "Connection refused" in fired["probe/probe-target-unreachable"]


async def _tls_probe(url: str) -> ProbeResult:
    spec = spec_from_url(url, rate=50, duration_s=1).model_copy(update={"verify_tls": False})
    return await ProbeRun(spec, ProbeSettings(abort_error_ratio=1.0)).run()


async def test_no_connection_reuse_over_tls_is_handshake_overhead(tls_server: DelayServer) -> None:
    # The server answers at once but closes every connection: each request pays a TLS handshake.
    result = await _tls_probe(tls_server.url + "/close?ms=0")
    assert result.failures.total == 0, result.examples
    assert result.connections_opened == result.finished == 50
    assert result.phases_ms.tls.count == 50
    assert result.phases_ms.tls.p50 is not None
    assert result.phases_ms.connect.p50 is not None
    assert result.phases_ms.tls.p50 > result.phases_ms.connect.p50  # the handshake, not the TCP connect
    fired = _fired(await _diagnose(result))
    assert "probe/probe-tls-handshake-overhead" in fired, result.phase_share_p99
    assert "100% of requests opened a new connection" in fired["probe/probe-tls-handshake-overhead"]
    reused = await _tls_probe(tls_server.url + "/delay?ms=0")
    # Kept alive, most requests ride an open connection; a new one opens only while all are busy
    # (a few, more while a busy machine slows the handshakes).
    assert reused.connections_opened < reused.finished / 2, reused.connections_opened
    assert "probe/probe-tls-handshake-overhead" not in _fired(await _diagnose(reused))


async def test_the_phases_account_for_the_slowest_requests_latency(tls_server: DelayServer) -> None:
    # Set-up work of the run (the TLS context loads the CA certificates) must not land on the first
    # request: it is no phase, and it made the p99 a time the phases do not explain.
    result = await _tls_probe(tls_server.url + "/close?ms=0")
    shares = result.phase_share_p99
    explained = shares.schedule_lag + shares.connect + shares.tls + shares.ttfb + shares.body
    assert explained >= 0.9, shares


async def test_check_fields_are_validated_at_load_time() -> None:
    with pytest.raises(ValueError, match="not a field of the probe result"):
        ProbeParams(field="latency_ms.p98", threshold=1)
    with pytest.raises(ValueError, match="not a number"):
        ProbeParams(field="latency_ms", threshold=1)


async def test_check_reads_sums_ratios_and_derived_fields(server: DelayServer) -> None:
    result = await _probe(server.url + "/empty-object", rate=40)
    assert read_field(result, "failures.empty_json+failures.empty_body") == 20
    assert read_field(result, "error_ratio") == 1.0
    from datetime import UTC, datetime

    from diagnoser.checks import CheckContext

    ctx = CheckContext(at=datetime.now(UTC), sources=Sources(probe=result))
    rows = await probe_check(
        ProbeParams(field="failures.empty_json", per="completed", op=">=", threshold=1), ctx
    )
    assert isinstance(rows, list)
    assert len(rows) == 1
    assert rows[0].query.endswith("failures.empty_json / completed >= 1")
    assert rows[0].labels == {"target": result.target, "host": "127.0.0.1"}
    assert (
        await probe_check(ProbeParams(field="failures.empty_json", threshold=1, min_requests=100), ctx) == []
    )
    # The dict form (as carried in a Diagnosis) works too.
    ctx.sources.probe = result.model_dump(mode="json")
    assert await probe_check(ProbeParams(field="latency_ms.p50", op=">", threshold=0), ctx)


async def test_build_spec_from_url_flags() -> None:
    spec, explicit = build_spec("http://127.0.0.1:9/", rate=7, duration_s=3)
    assert explicit
    assert spec.peak_rate == 7
