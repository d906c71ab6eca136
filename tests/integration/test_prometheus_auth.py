"""Authentication to a PromQL endpoint behind a proxy: bearer token and basic auth reach it."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from diagnoser.config import BasicAuth, PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.sources.prometheus import PrometheusSource
from tests.conftest import unavailable

ANSWER = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {"job": "a"}, "value": [1, "3"]}]}}
GOOD = {"Bearer t0ken", "Basic " + base64.b64encode(b"sre:pa55").decode()}


class _AuthProxy(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers))
        if self.headers.get("Authorization") in GOOD:
            status, body = 200, ANSWER
        else:
            status, body = 401, {"status": "error", "errorType": "unauthorized", "error": "missing or bad credentials"}
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def proxy_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AuthProxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _ask(settings: PrometheusSettings) -> object:
    source = PrometheusSource(settings)
    try:
        return asyncio.run(source.query("up", datetime.now(UTC)))
    finally:
        source.close()


def test_bearer_token_and_extra_headers(proxy_url: str) -> None:
    result = _ask(PrometheusSettings(url=proxy_url, bearer_token="t0ken", headers={"X-Scope-OrgID": "team-a"}))
    assert isinstance(result, list) and result[0].value == 3.0
    assert _AuthProxy.seen[-1]["X-Scope-OrgID"] == "team-a"


def test_basic_auth(proxy_url: str) -> None:
    result = _ask(PrometheusSettings(url=proxy_url, basic_auth=BasicAuth(username="sre", password="pa55")))
    assert isinstance(result, list) and result[0].labels == {"job": "a"}


def test_wrong_credentials_are_a_source_error(proxy_url: str) -> None:
    result = _ask(PrometheusSettings(url=proxy_url, bearer_token="wrong"))
    assert isinstance(result, SourceError)
    assert result.message.startswith("HTTP 401: missing or bad credentials")
    assert "wrong" not in result.message


@pytest.fixture
def tls_prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS endpoint with a certificate of its own CA (openssl, as on any Debian with ca-certificates)."""
    if shutil.which("openssl") is None:
        unavailable("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AuthProxy)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert
    server.shutdown()
    server.server_close()


def test_tls_with_a_ca_file_or_verification_off(tls_prometheus: tuple[str, Path]) -> None:
    url, ca = tls_prometheus
    trusted = _ask(PrometheusSettings(url=url, bearer_token="t0ken", ca_file=ca))
    assert isinstance(trusted, list) and trusted[0].value == 3.0
    unverified = _ask(PrometheusSettings(url=url, bearer_token="t0ken", verify_tls=False))
    assert isinstance(unverified, list)
    untrusted = _ask(PrometheusSettings(url=url, bearer_token="t0ken"))
    assert isinstance(untrusted, SourceError)
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.message or "certificate" in untrusted.message.lower()
