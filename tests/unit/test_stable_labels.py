"""Which labels a finding's identity keeps: its subject's, never what changes between scrapes."""

from __future__ import annotations

import pytest

from diagnoser.models import Finding, Severity
from diagnoser.stable_labels import looks_volatile, stable_labels


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # redis_exporter 1.45 against Redis 7.0 at maxclients, as recorded (three spellings).
        ("err", "write tcp 127.0.0.1:37908->127.0.0.1:6379: write: broken pipe"),
        ("last_scrape_error", "read tcp 127.0.0.1:41232->127.0.0.1:6379: read: connection reset by peer"),
        ("reason", "dial redis: unknown network tcp"),
        ("peer", "10.1.2.3:51234"),
        ("exception.message", "Timeout"),
        ("started", "2026-11-29T20:00:00Z"),
        ("at", "1764446400"),
        ("took", "0.0123s"),
    ],
)
def test_error_texts_ephemeral_ports_timestamps_and_durations_are_volatile(name: str, value: str) -> None:
    assert looks_volatile(name, value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("instance", "127.0.0.1:45678"),  # a subject, whatever port it is on
        ("job", "redis"),
        ("pool", "orders-db"),
        ("error_type", "timeout"),
        ("grpc_code", "UNAVAILABLE"),
        ("le", "0.25"),
        ("server", "db.internal:5432"),
        ("reason", "OOMKilled"),
        ("state", "used"),
    ],
)
def test_subjects_and_stable_classes_stay(name: str, value: str) -> None:
    assert not looks_volatile(name, value)


def test_a_finding_keyed_by_its_subject_keeps_its_identity_whatever_the_error_text() -> None:
    def finding(err: str) -> Finding:
        labels = stable_labels({"job": "redis", "instance": "127.0.0.1:9121", "err": err})
        return Finding(rule_id="r", cause="connection_limit_reached", kind="cause", severity=Severity.critical,
                       title="t", summary="s", labels=labels)  # fmt: skip

    a = finding("write tcp 127.0.0.1:37908->127.0.0.1:6379: write: broken pipe")
    b = finding("write tcp 127.0.0.1:37915->127.0.0.1:6379: write: broken pipe")
    assert a.identity == b.identity and a.labels == {"job": "redis", "instance": "127.0.0.1:9121"}
