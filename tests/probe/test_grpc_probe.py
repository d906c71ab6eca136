"""gRPC targets of ``diagnose probe`` and ``diagnose now --probe`` against a real grpcio server.

The server (tests/probe/grpc_server.py, in its own process) compiles its proto at start, serves
reflection, takes 10 ms per call, answers unknown users with an empty map and the user
``unavailable`` with UNAVAILABLE. Behaviour is asserted here, never timing (that is bench/probe.py).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.probe.conftest import FEATURES_PROTO, GrpcServer, start_grpc_server


def _probe_json(*args: str) -> tuple[int, dict[str, object], str]:
    result = run_cli("probe", *args, "--format", "json")
    return result.code, json.loads(result.stdout) if result.stdout else {}, result.stderr


@pytest.mark.parametrize("through", ["reflection", "proto"])
def test_probe_holds_200_per_second_through_reflection_and_proto(grpc_server: GrpcServer, through: str) -> None:
    flags = ["--proto", str(FEATURES_PROTO)] if through == "proto" else []
    code, data, stderr = _probe_json(
        grpc_server.url(), "--data", '{"user_id": "u1"}', "-r", "200", "-d", "2", *flags
    )
    assert code == 0, stderr
    # The open loop sent the schedule: 200/s for 2 s, every call answered OK, on two channels.
    assert data["sent"] == 400
    assert data["status_counts"] == {"OK": 400}
    assert data["failures"] == dict.fromkeys(data["failures"], 0)  # type: ignore[arg-type]
    assert data["connections_opened"] == 2
    assert data["phases_ms"]["connect"]["count"] == 2  # type: ignore[index]
    assert data["phases_ms"]["ttfb"]["count"] == 400  # type: ignore[index]
    assert str(data["histogram"]).startswith("HISTF")
    assert grpc_server.stats().count == 400


def test_empty_maps_are_reported_as_empty(grpc_server: GrpcServer) -> None:
    code, data, _ = _probe_json(grpc_server.url(), "--data", '{"user_id": "nobody"}', "-r", "20", "-d", "1")
    assert code == 1
    assert data["status_counts"] == {"OK": 20}
    assert data["failures"]["empty_body"] == 20  # type: ignore[index]
    assert data["examples"][0] == {  # type: ignore[index]
        "kind": "empty_body", "status": "OK", "body": "{}", "content_length": None,
        "received_bytes": None, "error": None,
    }  # fmt: skip


def test_unavailable_is_counted_by_status(grpc_server: GrpcServer, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("probe: {abort_error_ratio: 1.0}\n")
    code, data, _ = _probe_json(
        grpc_server.url(), "--data", '{"user_id": "unavailable"}', "-r", "20", "-d", "1", "-c", str(config)
    )
    assert code == 1
    assert data["status_counts"] == {"UNAVAILABLE": 20}
    assert data["failures"]["status"] == 20  # type: ignore[index]
    assert data["failures"]["connect_error"] == 0  # type: ignore[index]
    assert grpc_server.stats().unavailable == 20
    assert data["examples"][0]["error"] == "UNAVAILABLE: shedding load"  # type: ignore[index]


def test_the_deadline_ends_a_slow_call_as_deadline_exceeded(grpc_server: GrpcServer, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("probe: {abort_error_ratio: 1.0, request_timeout_s: 0.1}\n")
    code, data, _ = _probe_json(
        grpc_server.url(), "--data", '{"user_id": "u1", "delay_ms": 400}', "-r", "10", "-d", "1",
        "-c", str(config),
    )  # fmt: skip
    assert code == 1
    assert data["status_counts"] == {"DEADLINE_EXCEEDED": 10}
    assert data["failures"]["timeout"] == 10  # type: ignore[index]
    # No answer came: like HTTP timeouts they finished, with a latency, but did not complete.
    assert (data["finished"], data["completed"]) == (10, 0)
    assert data["latency_ms"]["count"] == 10  # type: ignore[index]


def test_a_server_that_is_not_there_is_a_connect_error(tmp_path: Path) -> None:
    with socket_port() as port:
        url = f"grpc://127.0.0.1:{port}/features.v1.Features/Get"
        code, data, _ = _probe_json(url, "--proto", str(FEATURES_PROTO), "-r", "20", "-d", "0.5")
    assert code == 1
    assert data["status_counts"] == {}
    assert data["failures"]["connect_error"] == data["finished"]  # type: ignore[index]
    assert "failed to connect" in str(data["examples"][0]["error"])  # type: ignore[index]


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    """A port on 127.0.0.1 that nothing listens on (bound, never listening, while in use)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield int(bound.getsockname()[1])


def test_a_probe_file_carries_metadata_and_a_json_path(grpc_server: GrpcServer, tmp_path: Path) -> None:
    (tmp_path / "protos").mkdir()
    (tmp_path / "protos" / "features.proto").write_text(FEATURES_PROTO.read_text())
    probe_file = tmp_path / "features.yaml"
    probe_file.write_text(
        f"target: {grpc_server.url()}\n"
        "body: '{\"user_id\": \"u7\"}'\n"
        "headers: {X-Tenant: blue}\n"
        "grpc: {proto: protos/features.proto, channels: 1}\n"
        "expect: {json_path: $.features.ctr}\n"
        "schedule: {rate: 20, duration_s: 0.5}\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text("probe: {allowed_hosts: ['127.0.0.1']}\n")
    code, data, stderr = _probe_json(str(probe_file), "-c", str(config))
    assert code == 0, stderr
    assert data["status_counts"] == {"OK": 10}
    assert data["connections_opened"] == 1
    assert grpc_server.stats().last_tenant == "blue"
    probe_file.write_text(probe_file.read_text().replace("$.features.ctr", "$.features.nope"))
    code, data, _ = _probe_json(str(probe_file), "-c", str(config))
    assert code == 1
    assert data["failures"]["missing_path"] == 10  # type: ignore[index]
    assert '"ctr":0.12' in str(data["examples"][0]["body"])  # type: ignore[index]


def test_metadata_on_the_command_line(grpc_server: GrpcServer) -> None:
    code, data, stderr = _probe_json(
        grpc_server.url(), "--data", '{"user_id": "u1"}', "-H", "X-Tenant: green", "-r", "10", "-d", "0.5"
    )
    assert code == 0, stderr
    assert data["status_counts"] == {"OK": 5}
    assert grpc_server.stats().last_tenant == "green"
    bad = run_cli("probe", grpc_server.url(), "--metadata", "no-colon", "-r", "10", "-d", "0.5")
    assert bad.code == 2
    assert "give it as 'key: value'" in bad.stderr


def test_a_probe_files_grpc_host_needs_the_allowlist(grpc_server: GrpcServer, tmp_path: Path) -> None:
    probe_file = tmp_path / "features.yaml"
    probe_file.write_text(f"target: {grpc_server.url()}\nschedule: {{rate: 5, duration_s: 0.5}}\n")
    result = run_cli("probe", str(probe_file))
    assert result.code == 2
    assert "not in probe.allowed_hosts" in result.stderr
    assert grpc_server.stats().count == 0


BAD_INPUT = [
    pytest.param(["--data", '{"user_id": "u1"}'], "Nope", [], "features.v1.Features has no method Nope", id="unknown-method"),
    pytest.param(["--data", '{"user": 1}'], "Get", [], "--data does not fit features.v1.GetFeaturesRequest", id="json-field"),
    pytest.param(["--data", '{"user_id": '], "Get", [], "--data does not fit", id="json-syntax"),
    pytest.param([], "Watch", [], "a streaming method", id="streaming"),
    pytest.param(["--proto", "BAD"], "Get", [], "does not compile", id="proto-syntax"),
    pytest.param(["--proto", "MISSING"], "Get", [], "no such file", id="proto-missing"),
]


@pytest.mark.parametrize(("flags", "method", "extra", "message"), BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2_before_any_call(
    grpc_server: GrpcServer, tmp_path: Path, flags: list[str], method: str, extra: list[str], message: str
) -> None:
    bad = tmp_path / "bad.proto"
    bad.write_text('syntax = "proto3";\nmessage X { int32 a = 1 }\n')
    flags = [str(bad) if f == "BAD" else str(tmp_path / "none.proto") if f == "MISSING" else f for f in flags]
    result = run_cli("probe", grpc_server.url(method), *flags, "-r", "5", "-d", "1")
    assert result.code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""
    assert grpc_server.stats().count == 0


def test_without_reflection_the_proto_is_needed(grpc_modules: tuple[object, object, object]) -> None:
    server = start_grpc_server(grpc_modules, "--reflection", "none")
    try:
        refused = run_cli("probe", server.url(), "-r", "5", "-d", "1")
        assert refused.code == 2
        assert "does not offer server reflection" in refused.stderr
        assert "--proto" in refused.stderr
        assert server.stats().count == 0
        result = run_cli("probe", server.url(), "--proto", str(FEATURES_PROTO), "--data", '{"user_id": "u1"}',
                         "-r", "20", "-d", "0.5", "--format", "json")  # fmt: skip
        assert result.code == 0, result.stderr
        assert json.loads(result.stdout)["status_counts"] == {"OK": 10}
    finally:
        server.close()


def test_now_probe_names_empty_success_response(grpc_server: GrpcServer) -> None:
    result = run_cli(
        "now", "--probe", grpc_server.url(), "--data", '{"user_id": "nobody"}',
        "--probe-rate", "20", "--probe-duration", "1", "--format", "json",
    )  # fmt: skip
    assert result.code == 1, result.stderr
    diagnosis = json.loads(result.stdout)
    assert diagnosis["findings"][0]["cause"] == "empty_success_response"
    assert "e.g. OK {}" in diagnosis["findings"][0]["summary"]
    assert diagnosis["probe"]["status_counts"] == {"OK": 20}


def test_now_refuses_grpc_flags_without_a_probe() -> None:
    result = run_cli("now", "--data", "{}")
    assert result.code == 2
    assert "--data, --proto, --import-path and --metadata go with --probe" in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["now", "--probe", "URL", "--data", '{"user_id": 1.5}'],
        ["capacity", "URL", "--data", '{"user_id": 1.5}', "--slo-p99-ms", "50"],
    ],
    ids=["now", "capacity"],
)
def test_now_and_capacity_refuse_bad_input_before_any_call(grpc_server: GrpcServer, command: list[str]) -> None:
    result = run_cli(*[grpc_server.url() if part == "URL" else part for part in command])
    assert result.code == 2
    assert "--data does not fit features.v1.GetFeaturesRequest" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert grpc_server.stats().count == 0


def test_metadata_grpc_would_refuse_is_refused_up_front(grpc_server: GrpcServer, tmp_path: Path) -> None:
    probe_file = tmp_path / "features.yaml"
    probe_file.write_text(
        f"target: {grpc_server.url()}\nheaders: {{'bad key': x}}\nschedule: {{rate: 5, duration_s: 0.5}}\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text("probe: {allowed_hosts: ['127.0.0.1']}\n")
    result = run_cli("probe", str(probe_file), "-c", str(config))
    assert result.code == 2
    assert "'bad key' is not a metadata key gRPC allows" in result.stderr
    assert grpc_server.stats().count == 0
