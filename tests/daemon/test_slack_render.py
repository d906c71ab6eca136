"""Block Kit rendering: golden snapshots of each message, and the limits Slack enforces.

Snapshots live in ``tests/daemon/snapshots/``; after an intended change of layout, regenerate them
with ``DIAGNOSER_UPDATE_SNAPSHOTS=1 pytest tests/daemon/test_slack_render.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from diagnoser.models import Diagnosis, Evidence, Finding, Severity, SourceError
from diagnoser.notify.slack import (
    SlackMessage,
    render_alert_report,
    render_finding,
    render_repeat,
    render_resolved,
    render_severity_change,
)

SNAPSHOTS = Path(__file__).parent / "snapshots"
AT = datetime(2026, 11, 29, 20, 15, 0, tzinfo=UTC)


def pool_finding(severity: Severity = Severity.critical) -> Finding:
    return Finding(
        rule_id="pools/pool-exhaustion",
        cause="connection_pool_exhaustion",
        kind="cause",
        severity=severity,
        title="Connection pool exhausted: orders-db",
        summary="shop/checkout pool orders-db: 100% of 10 connections in use, 30.0 requests waiting for one",
        evidence=[
            Evidence(source="prometheus", query="max by (...) (used / max)",
                     labels={"namespace": "shop", "job": "checkout", "db_client_connection_pool_name": "orders-db"},
                     value=1.0, threshold=0.95),
            Evidence(source="prometheus", query="pending", labels={"job": "checkout"}, value=30.0, threshold=0.0),
            Evidence(source="prometheus", query="max", labels={"job": "checkout"}, value=10.0),
            Evidence(source="prometheus", query="uses", labels={"job": "checkout"}, value=200.0),
        ],
        recommendation="Raise the pool from 10 to 50 connections per instance (Little's law: 200 uses/s x 0.050s "
                       "held, plus 30.0 waiting, x 1.25)",
        runbook_url="https://github.com/diagnoser/diagnoser/blob/main/rules/pools/pool-exhaustion.md",
        labels={"cluster": "prod-eu-1", "namespace": "shop", "job": "checkout",
                "db_client_connection_pool_name": "orders-db"},
    )


def snapshot(name: str, message: SlackMessage) -> None:
    path = SNAPSHOTS / f"{name}.json"
    rendered = json.dumps(message.payload(), indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    if os.environ.get("DIAGNOSER_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(rendered, encoding="utf-8")
        if os.environ.get("DIAGNOSER_UPDATE_SNAPSHOTS") != "1":
            pytest.fail(f"snapshot {path.name} was missing and has been written: review it and rerun")
    assert rendered == path.read_text(encoding="utf-8"), f"{name} differs from {path}"


def test_new_finding_snapshot() -> None:
    snapshot("new_finding", render_finding(pool_finding(), at=AT))


def test_repeat_snapshot() -> None:
    snapshot("repeat", render_repeat(pool_finding(), at=AT))


def test_severity_change_snapshot() -> None:
    snapshot("severity_change", render_severity_change(pool_finding(), previous="warning", at=AT))


def test_resolved_snapshot() -> None:
    snapshot("resolved", render_resolved(pool_finding(), at=AT))


def test_alert_report_snapshot() -> None:
    diagnosis = Diagnosis(
        evaluated_at=AT,
        findings=[pool_finding()],
        errors=[SourceError(source="elasticsearch", message="connection refused")],
    )
    snapshot("alert_report", render_alert_report(diagnosis, alert="CheckoutLatencyHigh",
                                                 scope={"namespace": "shop", "job": "checkout"}))


def _blocks_of(message: SlackMessage, kind: str) -> list[dict[str, Any]]:
    return [b for b in message.blocks if b["type"] == kind]


def test_the_parts_the_on_call_engineer_needs_are_there() -> None:
    message = render_finding(pool_finding(), at=AT)
    header = message.blocks[0]["text"]["text"]
    assert header.startswith("CRITICAL: connection_pool_exhaustion")
    summary = message.blocks[1]["text"]["text"]
    assert "Measured: *100 % (threshold 95 %) · db_client_connection_pool_name orders-db" not in summary
    assert "Measured: *100 % (threshold 95 %) [prometheus]*" in summary
    button = _blocks_of(message, "actions")[0]["elements"][0]
    assert (button["text"]["text"], button["url"]) == ("Runbook", pool_finding().runbook_url)
    context = _blocks_of(message, "context")[0]["elements"][0]["text"]
    assert "cluster: *prod-eu-1*" in context
    assert "namespace: *shop*" in context
    assert "2026-11-29 20:15:00Z" in context
    evidence = [b["text"]["text"] for b in _blocks_of(message, "section") if b["text"]["text"].startswith("*Evidence*")]
    assert evidence and "_and 1 more_" in evidence[0]  # top three rows, then a count


def test_limits_and_escaping_hold_for_hostile_text() -> None:
    finding = pool_finding().model_copy(update={
        "title": "x" * 400,
        "summary": "<!channel> & <https://evil.example|click> " + "y" * 5000,
        "recommendation": "z" * 5000,
        "runbook_url": "javascript:alert(1)",
    })
    message = render_finding(finding, at=AT)
    assert len(message.blocks[0]["text"]["text"]) <= 150
    for block in _blocks_of(message, "section"):
        assert len(block["text"]["text"]) <= 3000
    assert "<!channel>" not in json.dumps(message.blocks)
    assert "&lt;!channel&gt; &amp;" in message.blocks[1]["text"]["text"]
    assert _blocks_of(message, "actions") == []  # no button to a non-http(s) URL
    assert len(message.text) <= 3000


def test_a_finding_without_evidence_or_runbook_still_renders() -> None:
    bare = Finding(rule_id="x/y", cause="queue_backlog", kind="cause", severity=Severity.warning,
                   title="Queue growing", summary="queue grows")
    message = render_finding(bare, at=AT)
    assert [b["type"] for b in message.blocks] == ["header", "section", "context"]
    assert message.text == ":large_orange_circle: WARNING: queue_backlog: queue grows"


@pytest.mark.parametrize("path", sorted(SNAPSHOTS.glob("*.json")), ids=lambda p: p.stem)
def test_snapshots_are_valid_block_kit(path: Path) -> None:
    # slack-sdk's own Block Kit models check types and Slack's documented field limits.
    from slack_sdk.models.blocks import Block

    payload = json.loads(path.read_text(encoding="utf-8"))
    for raw in payload["blocks"]:
        block = Block.parse(raw)
        assert block is not None, raw
        block.validate_json()
        assert block.to_dict() == raw


def test_evidence_lines_say_only_what_was_measured() -> None:
    rows = [
        Evidence(source="kubernetes", query="events", labels={"pod": "p"}, detail="FailedMount: secret missing"),
        Evidence(source="prometheus", query="q", value=0.5),
        Evidence(source="elasticsearch", query="q", labels={"node": "n1"}, value=2.0, threshold=1.0, detail="hot"),
    ]
    finding = Finding(rule_id="x/y", cause="config_mount_failure", kind="cause", severity=Severity.critical,
                      title="t", summary="s", evidence=rows)
    (evidence,) = [b["text"]["text"] for b in render_finding(finding, at=AT).blocks
                   if b["type"] == "section" and b["text"]["text"].startswith("*Evidence*")]
    assert evidence.splitlines()[1:] == [
        "• FailedMount: secret missing · pod p [kubernetes]",
        "• 0.5 [prometheus]",
        "• 2 hot (threshold 1) · node n1 [elasticsearch]",
    ]


def test_evidence_lines_name_what_they_measure_with_units_and_say_labels_once() -> None:
    rows = [
        Evidence(source="prometheus", name="waiting", query="max(avg_over_time(pool_pending[5m]))",
                 labels={"job": "feature-service", "pool": "feature-store"}, value=139.5, threshold=0.0,
                 detail="requests waiting for a connection"),
        Evidence(source="prometheus", name="hold_s", query="hold", labels={"job": "feature-service"}, value=0.2286),
        Evidence(source="prometheus", name="value", query="max(used) / max(limit)", value=1.0, threshold=0.95),
    ]
    finding = Finding(rule_id="x/y", cause="connection_pool_exhaustion", kind="cause", severity=Severity.critical,
                      title="t", summary="s", evidence=rows, labels={"job": "feature-service"})
    (evidence,) = [b["text"]["text"] for b in render_finding(finding, at=AT).blocks
                   if b["type"] == "section" and b["text"]["text"].startswith("*Evidence*")]
    assert evidence.splitlines()[1:] == [
        "• waiting: 139.5 requests waiting for a connection (threshold 0) · pool feature-store [prometheus]",
        "• hold time: 228.6 ms [prometheus]",
        "• 100 % (threshold 95 %) [prometheus]",
    ]
