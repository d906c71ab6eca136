"""The JSON webhook receiver: redirects, the addresses it may reach, and its secrets.

A real local HTTP receiver answers each redirect code; the sender never follows one unless
``follow_redirects`` is set, and then only on the same host (the payload POSTed again); a
redirect not followed is a refusal, never "sent". The URL's address and every address its name
resolves to are checked (public, or listed in ``allowed_addresses``; metadata and link-local
only as themselves). Through the real daemon, a webhook whose URL carries ``key=``/``token=``/
``sig=`` and a secret header, answering a redirect, leaves none of them in the state file's
errors, the log or ``/metrics``.
"""

from __future__ import annotations

import io
import json
import logging
import sqlite3
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from diagnoser.config import NotifySettings
from diagnoser.daemon import Daemon
from diagnoser.daemon.logs import configure_logging
from diagnoser.errors import WebhookSendError
from diagnoser.notify.receivers.webhook import JsonWebhookSender, WebhookConfig, WebhookMessage
from diagnoser.redact import scrub_text
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.fixtures.background_http import BackgroundHTTPServer

REDIRECTS = (301, 302, 303, 307, 308)
LOOPBACK = ["127.0.0.1", "::1"]


@dataclass
class Receiver:
    """``/redirect/<code>?to=<path or URL>`` answers that redirect; anything else takes the POST."""

    http: BackgroundHTTPServer
    received: list[tuple[str, str, dict[str, Any] | None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.http.url

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.received]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    received: list[tuple[str, str, dict[str, Any] | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            received.append((self.command, self.path, body))
            path, _, query = self.path.partition("?")
            if path.startswith("/redirect/"):
                code = int(path.split("/")[2])
                target = urllib.parse.parse_qs(query).get("to", ["/final"])[0]
                self.send_response(code)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(204)
            self.end_headers()

        do_POST = _handle
        do_GET = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    http = BackgroundHTTPServer(Handler, name="webhook-receiver").start()
    yield Receiver(http, received)
    http.stop()


def sender(url: str, **options: Any) -> JsonWebhookSender:
    options.setdefault("allowed_addresses", LOOPBACK)
    return JsonWebhookSender(url, messages_per_s=50, burst=50, **options)


@pytest.mark.parametrize("code", REDIRECTS)
async def test_a_redirect_is_a_refusal_and_is_not_followed(receiver: Receiver, code: int) -> None:
    hook = sender(f"{receiver.url}/redirect/{code}?to=/final&key=SECRETKEY")
    with pytest.raises(WebhookSendError) as caught:
        await hook.post(WebhookMessage("hello"), marker="dgn-1")
    assert caught.value.permanent and caught.value.error == f"http_{code}"
    assert "not followed" in str(caught.value) and "SECRETKEY" not in str(caught.value)
    assert receiver.paths() == [f"/redirect/{code}?to=/final&key=SECRETKEY"]  # nothing followed


@pytest.mark.parametrize("code", REDIRECTS)
async def test_follow_redirects_posts_the_payload_again_on_the_same_host(receiver: Receiver, code: int) -> None:
    hook = sender(f"{receiver.url}/redirect/{code}?to=/final", follow_redirects=True)
    await hook.post(WebhookMessage("hello"), marker="dgn-1")
    [(method, path, body)] = receiver.received[1:]
    assert (method, path) == ("POST", "/final")
    assert body is not None and body["text"] == "hello" and body["marker"] == "dgn-1"


async def test_a_redirect_to_another_host_or_a_metadata_address_is_refused(receiver: Receiver) -> None:
    port = receiver.http.port
    for elsewhere in (f"http://localhost:{port}/final", "http://169.254.169.254/latest/meta-data/"):
        hook = sender(f"{receiver.url}/redirect/307?to={urllib.parse.quote(elsewhere)}", follow_redirects=True)
        with pytest.raises(WebhookSendError, match="refused") as caught:
            await hook.post(WebhookMessage("hello"), marker="dgn-1")
        assert caught.value.permanent
    assert "/final" not in receiver.paths()


async def test_every_address_a_name_resolves_to_is_checked(receiver: Receiver) -> None:
    named = f"http://localhost:{receiver.http.port}/hook"
    with pytest.raises(WebhookSendError, match=r"resolves to .* loopback") as caught:
        await sender(named, allowed_addresses=[]).post(WebhookMessage("hello"), marker="dgn-1")
    assert caught.value.error == "address_refused" and caught.value.permanent
    assert receiver.received == []
    with pytest.raises(WebhookSendError, match="loopback"):
        await sender(f"{receiver.url}/hook", allowed_addresses=[]).post(WebhookMessage("x"), marker="dgn-2")
    assert receiver.received == []
    await sender(named).post(WebhookMessage("hello"), marker="dgn-3")
    assert receiver.paths() == ["/hook"]


@pytest.mark.parametrize(
    ("url", "allowed", "refused"),
    [
        ("http://169.254.169.254/x", [], "cloud metadata"),
        ("http://169.254.169.254/x", ["169.254.0.0/16"], "cloud metadata"),
        ("http://169.254.169.254/x", ["169.254.169.254"], None),
        ("http://[fd00:ec2::254]/x", ["fd00::/8"], "cloud metadata"),
        ("http://[::ffff:169.254.169.254]/x", ["0.0.0.0/0"], "cloud metadata"),
        ("http://10.1.2.3/x", [], "private"),
        ("http://10.1.2.3/x", ["10.0.0.0/8"], None),
        ("http://192.168.1.5/x", ["10.0.0.0/8"], "private"),
        ("http://100.64.0.9/x", [], "private"),
        ("http://127.0.0.1:9/x", [], "loopback"),
        ("http://0.0.0.0:9/x", [], "unspecified"),
        ("http://[fe80::1]/x", ["fe80::/10"], "link-local"),
        ("http://8.8.8.8/x", [], None),
    ],
)
def test_the_url_is_checked_at_load(url: str, allowed: list[str], refused: str | None) -> None:
    entry = {"name": "hook", "type": "webhook", "url": url, "allowed_addresses": allowed}
    if refused is None:
        WebhookConfig.model_validate(entry)
        return
    with pytest.raises(ValidationError, match=refused):
        WebhookConfig.model_validate(entry)


def test_the_log_redactor_masks_key_and_the_other_token_parameters() -> None:
    line = scrub_text("POST /hook?key=K1&sig=S1&token=T1&code=C1&x=1 -> https://h.example/a?key=K2 failed")
    assert not any(secret in line for secret in ("K1", "S1", "T1", "C1", "K2")), line
    assert "x=1" in line


@pytest.mark.integration
async def test_the_webhooks_secrets_reach_neither_the_state_file_nor_the_log_nor_metrics(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, receiver: Receiver
) -> None:
    job = "hook-secrets"
    secrets = ("SECRETKEY", "SECRETTOKEN", "SECRETSIG", "PATHSECRET", "HEADERSECRET")
    url = f"{receiver.url}/redirect/302/PATHSECRET?to=/final&key=SECRETKEY&token=SECRETTOKEN&sig=SECRETSIG"
    base = daemon_settings(tmp_path, live_prometheus.url, job)
    settings = base.model_copy(update={"notify": NotifySettings.model_validate({
        "delivery": {"retry_base_s": 0.2, "retry_max_s": 1.0},
        "receivers": [{"name": "bridge", "type": "webhook", "url": url, "allowed_addresses": LOOPBACK,
                       "headers": {"Authorization": "Bearer HEADERSECRET"}, "messages_per_s": 10}],
    })})  # fmt: skip
    stream = io.StringIO()
    handler = configure_logging(settings, log_format="json", level="INFO", stream=stream)
    pool_app.set(job, "orders", 0.97)
    daemon = Daemon(settings)
    await daemon.start()
    try:
        state = Path(settings.daemon.state_path)
        await wait_for(lambda: _dead_letters(state) != [], 20, "the redirect dead-lettered")
        exposition = daemon.metrics.exposition().decode()
    finally:
        await daemon.stop()
        pool_app.set(job, "orders", 0.1)
        logging.getLogger().removeHandler(handler)
    [error] = _dead_letters(state)
    assert "HTTP 302" in error and "not followed" in error
    assert receiver.paths() == [url.removeprefix(receiver.url)]  # one POST, nothing followed
    stored = "\n".join(_dead_letters(state) + _last_errors(state))
    log = stream.getvalue()
    assert "http_302" in exposition
    for secret in secrets:
        assert secret not in stored, stored
        assert secret not in log, log
        assert secret not in exposition


def _dead_letters(state: Path) -> list[str]:
    with sqlite3.connect(state) as db:
        return [str(r[0]) for r in db.execute("SELECT error FROM dead_letters")]


def _last_errors(state: Path) -> list[str]:
    with sqlite3.connect(state) as db:
        return [str(r[0]) for r in db.execute("SELECT last_error FROM outbox WHERE last_error IS NOT NULL")]
