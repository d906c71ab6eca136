"""Structured logs: JSON lines with extras, and secrets masked even when something logs them."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from diagnoser.config import load_settings
from diagnoser.daemon.logs import MASK, configure_logging, secret_values

SECRETS = {
    "slack": {"token": "xoxb-1234-abcdef-secret", "channel": "#oncall"},
    "prometheus": {"url": "http://p:9090", "basic_auth": {"username": "u", "password": "prom-password-1"}},
    "elasticsearch": {"urls": ["http://es:9200"], "api_key": "ZXMtYXBpLWtleQ=="},
    "daemon": {"alertmanager_token": "am-token-secret"},
}


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_secret_values_finds_every_secret_field_and_webhook_paths() -> None:
    settings = load_settings(None, overrides={
        **SECRETS, "slack": {"webhook_url": "https://hooks.slack.com/services/T1/B2/verysecretpath"}})
    found = secret_values(settings)
    assert {"prom-password-1", "ZXMtYXBpLWtleQ==", "am-token-secret"} <= found
    assert "https://hooks.slack.com/services/T1/B2/verysecretpath" in found
    assert "/services/T1/B2/verysecretpath" in found
    assert "u" not in found and "#oncall" not in found


def test_json_lines_carry_extras_and_mask_secrets(restore_logging: None) -> None:
    settings = load_settings(None, overrides=SECRETS)
    out = io.StringIO()
    configure_logging(settings, log_format="json", level="DEBUG", stream=out)
    log = logging.getLogger("some.library")
    log.debug("POST with Authorization: Bearer %s", "xoxb-1234-abcdef-secret", extra={"attempt": 2})
    try:
        raise ValueError("auth failed for password prom-password-1")
    except ValueError:
        log.exception("call failed")
    logging.getLogger("diagnoser").info("settings: %r", settings)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["level"] == "debug"
    assert lines[0]["logger"] == "some.library"
    assert lines[0]["attempt"] == 2
    assert lines[0]["message"] == f"POST with Authorization: Bearer {MASK}"
    assert "exception" in lines[1]
    text = out.getvalue()
    for secret in ("xoxb-1234-abcdef-secret", "prom-password-1", "ZXMtYXBpLWtleQ==", "am-token-secret"):
        assert secret not in text


def test_text_format_masks_too(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(load_settings(None, overrides=SECRETS), log_format="text", stream=out)
    logging.getLogger("x").warning("token is %s", "am-token-secret", extra={"queued": 3})
    line = out.getvalue().strip()
    assert line.endswith(f"WARNING x: token is {MASK} queued=3")
