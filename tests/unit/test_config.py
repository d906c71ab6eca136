from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from diagnoser.cli.timeparse import parse_instant
from diagnoser.config import load_settings
from diagnoser.errors import ConfigError


def test_file_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "prometheus: {url: http://file:9090, bearer_token: s3cret}\n"
        "slo: {p99_ms: 300, error_ratio: 0.02}\n"
        "signals: {queue_length: volga_compute_queue_length}\n"
        "metrics: {hikaricp_connections_max: app_hikari_max}\n"
        "runbook_base_url: https://runbooks.example/rules\n"
    )
    monkeypatch.setenv("DIAGNOSER_SLO__P99_MS", "250")
    monkeypatch.setenv("DIAGNOSER_PROMETHEUS__QUERY_TIMEOUT_S", "3")
    settings = load_settings(config, overrides={"slo": {"error_ratio": 0.05}})
    assert settings.prometheus.url == "http://file:9090"
    assert settings.prometheus.query_timeout_s == 3
    assert settings.slo.p99_ms == 250  # environment beats the file
    assert settings.slo.error_ratio == 0.05  # flags beat both
    assert settings.signals == {"queue_length": "volga_compute_queue_length"}
    assert settings.runbook_base_url == "https://runbooks.example/rules/"
    assert "s3cret" not in repr(settings)
    assert settings.prometheus.bearer_token is not None
    assert settings.prometheus.bearer_token.get_secret_value() == "s3cret"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slo: {p99_ms: -1}\n", "slo.p99_ms"),
        ("prometheus: {urll: x}\n", "prometheus.urll"),
        ("- a\n", "must be a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=r"c\.yaml") as info:
        load_settings(config)
    assert message in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_settings(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2026-11-29T20:00:00Z", 1795982400),
        ("2026-11-29T21:00:00+01:00", 1795982400),
        ("1795982400", 1795982400),
        ("1795982400.5", 1795982400.5),
        ("-30m", 1795982400 + 86400 - 1800),
        ("2h", 1795982400 + 86400 - 7200),
        ("1h30m", 1795982400 + 86400 - 5400),
    ],
)
def test_parse_instant(text: str, epoch: float) -> None:
    now = datetime.fromtimestamp(1795982400 + 86400, UTC)
    assert parse_instant(text, now=now).timestamp() == epoch


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("yesterday", "neither RFC 3339"),
        ("2026-13-01T00:00:00Z", "neither RFC 3339"),
        ("1e400", "out of range"),
        ("2026-11-29T20:00:00", "has no time zone: add Z for UTC (2026-11-29T20:00:00Z)"),
        ("2026-12-01T00:00:00Z", "is in the future"),
        ("+5m", "is in the future"),
    ],
)
def test_parse_instant_rejects(text: str, says: str) -> None:
    now = datetime.fromtimestamp(1795982400 + 86400, UTC)
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_instant(text, now=now)
