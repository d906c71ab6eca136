"""Fixtures for probe tests: the delay server in its own process (so it does not share the probe's CPU)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SERVER_SCRIPT = Path(__file__).with_name("delay_server.py")


@dataclass
class DelayServer:
    """A running delay_server.py: its base URL and its own measurements."""

    url: str
    process: subprocess.Popen[str]

    def _call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(
            self.url + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/stats")
        return result

    def reset(self) -> None:
        self._call("POST", "/stats/reset")

    def stall(self, ms: float, after_s: float) -> None:
        self._call("POST", f"/control/stall?ms={ms:g}&after_s={after_s:g}")


def start_server_process(script: Path, *args: str) -> tuple[int, subprocess.Popen[str]]:
    """A test server script started in its own process, once it says ``PORT <n>``: its port and process."""
    process = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("PORT "):
        process.kill()
        raise RuntimeError(f"{script.name} did not start: {line!r}")
    return int(line.split()[1]), process


def start_delay_server(*extra: str) -> DelayServer:
    port, process = start_server_process(SERVER_SCRIPT, "--port", "0", *extra)
    return DelayServer(url=f"http://127.0.0.1:{port}", process=process)


@pytest.fixture
def listener() -> Iterator[tuple[str, socket.socket]]:
    """A target that records whether anything connected to it: nothing may, for a refused run."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/", sock
    finally:
        sock.close()


def connected(sock: socket.socket) -> bool:
    """Whether anything connected to ``listener``'s socket."""
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


@pytest.fixture(scope="session")
def delay_server() -> Iterator[DelayServer]:
    server = start_delay_server()
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(timeout=5)


@pytest.fixture(scope="session")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DelayServer]:
    """The delay server over https with a throw-away self-signed certificate for 127.0.0.1."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
         "-out", str(cert), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = start_delay_server("--tls", str(cert), str(key))
    server.url = server.url.replace("http://", "https://")
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(timeout=5)


@pytest.fixture
def server(delay_server: DelayServer) -> DelayServer:
    """The shared server with its own histogram reset and no stall armed."""
    delay_server.reset()
    delay_server.stall(0, 0)
    return delay_server


GRPC_SERVER_SCRIPT = Path(__file__).with_name("grpc_server.py")
FEATURES_PROTO = Path(__file__).with_name("protos") / "features.proto"


@dataclass
class GrpcServer:
    """A running grpc_server.py: its address, and its own counters read over its Control service."""

    port: int
    process: subprocess.Popen[str]
    pb: Any
    pb_grpc: Any
    empty: Any

    def url(self, method: str = "Get", scheme: str = "grpc") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/features.v1.Features/{method}"

    def stats(self) -> Any:
        import grpc

        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            return self.pb_grpc.ControlStub(channel).Stats(self.empty.Empty(), timeout=5)

    def reset(self) -> None:
        import grpc

        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            self.pb_grpc.ControlStub(channel).Reset(self.empty.Empty(), timeout=5)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=5)


@pytest.fixture(scope="session")
def grpc_modules(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    """The test service's messages and stubs, generated from features.proto for the tests' own use."""
    sys.path.insert(0, str(Path(__file__).parent))
    from grpc_server import compile_features

    return compile_features(tmp_path_factory.mktemp("features_pb"))  # type: ignore[no-any-return]


def start_grpc_server(modules: tuple[Any, Any, Any], *extra: str) -> GrpcServer:
    port, process = start_server_process(GRPC_SERVER_SCRIPT, "--port", "0", *extra)
    return GrpcServer(port, process, *modules)


@pytest.fixture(scope="session")
def grpc_feature_server(grpc_modules: tuple[Any, Any, Any]) -> Iterator[GrpcServer]:
    """The feature service with reflection (v1 and v1alpha), no concurrency limit."""
    server = start_grpc_server(grpc_modules)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def grpc_server(grpc_feature_server: GrpcServer) -> GrpcServer:
    """The shared gRPC server with its counters reset."""
    grpc_feature_server.reset()
    return grpc_feature_server
