"""Authentication to a PromQL endpoint behind a proxy: bearer token and basic auth reach it."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from diagnoser.config import BasicAuth, PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.sources.prometheus import PrometheusSource

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
