"""gRPC targets: parsing, the spec, message validation, both reflection versions and TLS."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest

from diagnoser.config import ProbeSettings
from diagnoser.errors import ConfigError, ProbeSafetyError
from diagnoser.probe import ProbeRun, ProbeSpec, spec_from_url
from diagnoser.probe.grpc_run import GrpcProbeRun
from diagnoser.probe.grpc_schema import resolve_grpc_spec
from diagnoser.probe.grpc_target import parse_grpc_target
from diagnoser.probe.spec import Expectations
from diagnoser.probe.validate import check_message, parse_json_path
from tests.probe.conftest import GrpcServer, start_grpc_server

SETTINGS = ProbeSettings(abort_error_ratio=1.0)


def test_a_target_names_host_port_service_and_method() -> None:
    target = parse_grpc_target("grpcs://features.internal/features.v1.Features/Get")
    assert (target.host, target.port, target.tls) == ("features.internal", 443, True)
    assert (target.service, target.method, target.path) == ("features.v1.Features", "Get", "/features.v1.Features/Get")
    assert parse_grpc_target("grpc://[::1]:50051/Svc/M").authority == "[::1]:50051"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("grpc://127.0.0.1:1", "path is /package.Service/Method"),
        ("grpc://127.0.0.1:1/features.v1.Features", "path is /package.Service/Method"),
        ("grpc://127.0.0.1:1/a/b/c", "path is /package.Service/Method"),
        ("grpc://127.0.0.1:1/a.B/C?x=1", "no query"),
        ("grpc:///a.B/C", "with a host"),
    ],
)
def test_a_bad_target_is_refused_saying_why(url: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="invalid probe") as caught:
        spec_from_url(url, rate=1, duration_s=1)
    assert fragment in str(caught.value)


def test_a_grpc_spec_gets_its_options_and_an_http_one_may_not() -> None:
    spec = spec_from_url("grpc://127.0.0.1:1/a.B/C", rate=1, duration_s=1)
    assert spec.is_grpc and spec.grpc is not None and spec.grpc.channels == 2
    with pytest.raises(ValueError, match="grpc options apply to grpc"):
        ProbeSpec.model_validate(
            {"target": "http://127.0.0.1/", "schedule": {"rate": 1, "duration_s": 1}, "grpc": {}}
        )
    # The spec stays a plain serialisable model: it goes to other processes as JSON.
    assert ProbeSpec.model_validate_json(spec.model_dump_json()) == spec


def _as_json(payload: bytes) -> Any:
    import json

    return json.loads(payload)


@pytest.mark.parametrize(
    ("expect", "path", "payload", "failure"),
    [
        ({}, None, b"", "empty_body"),
        ({"non_empty_body": False}, None, b"", None),
        ({}, None, b'{"features": {}}', "empty_json"),
        ({}, None, b'{"features": {"ctr": 0.1}}', None),
        ({}, "$.features", b'{"user": "u1"}', "missing_path"),
        ({}, "$.features", b'{"user": "u1", "features": {"a": 1}}', None),
        ({}, "$.items", b'{"user": "u1", "items": []}', "missing_path"),
        ({}, None, b"not json", "read_error"),
    ],
)
def test_message_validators(expect: dict[str, Any], path: str | None, payload: bytes, failure: str | None) -> None:
    expectations = Expectations(**expect, json_path=path)
    steps = parse_json_path(path) if path else None

    def to_json(raw: bytes) -> Any:
        try:
            return _as_json(raw)
        except ValueError as exc:
            raise ValueError("not the message") from exc

    found, body = check_message(expectations, steps, payload, to_json)
    assert found == failure
    assert (body is not None) == (failure not in (None, "read_error"))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_either_reflection_version_is_enough(grpc_modules: tuple[Any, Any, Any], version: str) -> None:
    server = start_grpc_server(grpc_modules, "--reflection", version)
    try:
        spec = spec_from_url(server.url(), rate=1, duration_s=1)
        resolved = resolve_grpc_spec(spec, SETTINGS, explicit_target=True)
        assert resolved.grpc is not None and resolved.grpc.descriptor_set
        assert base64.b64decode(resolved.grpc.descriptor_set)
        assert isinstance(ProbeRun(resolved, SETTINGS), GrpcProbeRun)
        assert server.stats().count == 0
    finally:
        server.close()


def test_a_probe_files_loopback_target_is_refused_before_reflection(grpc_server: GrpcServer) -> None:
    spec = spec_from_url(grpc_server.url(), rate=1, duration_s=1)
    with pytest.raises(ProbeSafetyError, match="loopback"):
        resolve_grpc_spec(spec, SETTINGS, explicit_target=False)


@pytest.fixture(scope="module")
def tls_grpc_server(tmp_path_factory: pytest.TempPathFactory, grpc_modules: tuple[Any, Any, Any]) -> Any:
    directory = tmp_path_factory.mktemp("grpc-tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
         "-out", str(cert), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = start_grpc_server(grpc_modules, "--tls", str(cert), str(key))
    yield server
    server.close()


async def test_grpcs_with_verify_tls_off_accepts_the_servers_certificate(tls_grpc_server: GrpcServer) -> None:
    url = tls_grpc_server.url(scheme="grpcs")
    spec = spec_from_url(url, rate=20, duration_s=0.5).model_copy(
        update={"body": '{"user_id": "u1"}', "verify_tls": False}
    )
    resolved = resolve_grpc_spec(spec, SETTINGS, explicit_target=True)
    result = await ProbeRun(resolved, SETTINGS).run()
    assert result.status_counts == {"OK": 10}
    # Verified against the system's roots, a self-signed certificate is refused: the name checks run.
    with pytest.raises(ConfigError, match="CERTIFICATE_VERIFY_FAILED"):
        resolve_grpc_spec(spec.model_copy(update={"verify_tls": True}), SETTINGS, explicit_target=True)


def test_relative_proto_paths_of_a_probe_file_are_read_beside_it(tmp_path: Path) -> None:
    from diagnoser.probe import load_probe_file

    path = tmp_path / "p.yaml"
    path.write_text(
        "target: grpc://127.0.0.1:1/a.B/C\nschedule: {rate: 1, duration_s: 1}\n"
        "grpc: {proto: protos/x.proto, import_paths: [protos, /abs]}\n"
    )
    spec = load_probe_file(path)
    assert spec.grpc is not None
    assert spec.grpc.proto == tmp_path / "protos" / "x.proto"
    assert spec.grpc.import_paths == [tmp_path / "protos", Path("/abs")]


async def test_run_probe_resolves_a_grpc_spec_itself(grpc_server: GrpcServer) -> None:
    """The daemon's way in: an unresolved spec, reflection asked off the event loop, then the run."""
    from diagnoser.probe import run_probe

    spec = spec_from_url(grpc_server.url(), rate=20, duration_s=0.5).model_copy(update={"body": '{"user_id": "u1"}'})
    result = await run_probe(spec, SETTINGS, explicit_target=True)
    assert result.status_counts == {"OK": 10}
    assert result.failures.total == 0


def test_a_proto_with_package_relative_imports_compiles_with_its_import_path(tmp_path: Path) -> None:
    from diagnoser.probe.grpc_schema import compile_proto

    package = tmp_path / "protos" / "shop" / "v1"
    package.mkdir(parents=True)
    (package / "common.proto").write_text('syntax = "proto3";\npackage shop.v1;\nmessage Money { int64 cents = 1; }\n')
    (package / "prices.proto").write_text(
        'syntax = "proto3";\npackage shop.v1;\nimport "shop/v1/common.proto";\nimport "google/protobuf/empty.proto";\n'
        "message Price { Money amount = 1; }\n"
        "service Prices { rpc Get(google.protobuf.Empty) returns (Price); }\n"
    )
    from google.protobuf import descriptor_pb2

    compiled = compile_proto(package / "prices.proto", [tmp_path / "protos"])
    names = {f.name for f in descriptor_pb2.FileDescriptorSet.FromString(compiled).file}
    assert names == {"shop/v1/prices.proto", "shop/v1/common.proto", "google/protobuf/empty.proto"}
    with pytest.raises(ConfigError, match="does not compile"):
        compile_proto(package / "prices.proto", [])  # its import is not found from its own directory
