"""The demo's Slack sink: what the daemon's Slack client gets back, what the terminal shows, and the
forward to a real webhook (here the test suite's webhook stand-in, never a real Slack)."""

from __future__ import annotations

from datetime import UTC, datetime

from slack_sdk import WebClient

from demo.slack_sink import SlackSink
from diagnoser.models import Evidence, Finding, Severity
from diagnoser.notify.slack import render_finding, render_resolved
from tests.fixtures.slack_server import SlackFixtureServer

FINDING = Finding(
    rule_id="pools/pool-exhaustion", cause="connection_pool_exhaustion", kind="cause", severity=Severity.critical,
    title="Connection pool exhausted: feature-service pool feature-store",
    summary="feature-service pool feature-store: 100% of 10 connections in use; 11 requests waiting",
    evidence=[Evidence(source="prometheus", query="q", labels={"service": "feature-service"}, value=1.0, threshold=0.95)],
    recommendation="Raise the pool from 10 to 32 connections per instance",
    runbook_url="https://github.com/diagnoser/diagnoser/blob/main/rules/pools/pool-exhaustion.md",
    labels={"service": "feature-service"},
)  # fmt: skip


def test_a_finding_and_its_resolution_printed_as_slack_shows_them_and_forwarded() -> None:
    printed: list[str] = []
    at = datetime(2026, 11, 30, 9, 23, 50, tzinfo=UTC)
    with SlackFixtureServer() as real, SlackSink(printed.append, forward_url=real.webhook_url) as sink:
        client = WebClient(token=sink.token, base_url=sink.api_url)
        new = render_finding(FINDING, at=at)
        posted = client.chat_postMessage(channel="#oncall", text=new.text, blocks=new.blocks)
        done = render_resolved(FINDING, at=at)
        client.chat_postMessage(channel="#oncall", text=done.text, blocks=done.blocks, thread_ts=posted["ts"])
        # What the daemon reads back to settle a post in doubt.
        replies = client.conversations_replies(channel=posted["channel"], ts=posted["ts"])
        assert [m["text"] for m in replies["messages"]] == [new.text, done.text]
        assert sink.wait_for(lambda m: len(real.messages) == 2, timeout_s=10) is not None
    first, second = printed
    assert "CRITICAL: CONNECTION_POOL_EXHAUSTION: CONNECTION POOL EXHAUSTED" in first
    assert "🔴 feature-service pool feature-store: 100% of 10 connections in use" in first
    assert f"[ Runbook ] → {FINDING.runbook_url}" in first
    assert f"ts {posted['ts']}" in first and "reply in thread" not in first
    assert f"↳ reply in thread {posted['ts']}" in second
    assert "✅ *Resolved*: connection_pool_exhaustion" in second
    # The webhook cannot thread: the forwarded reply says what it answers.
    assert [m.blocks for m in real.messages] == [new.blocks, done.blocks]
    assert real.messages[1].text.startswith("(in reply to: :red_circle: CRITICAL: connection_pool_exhaustion")
