"""The daemon end to end: a real Prometheus scraping a live incident, the Slack fixture server.

One message per problem, silence for its repeats, one resolution in the same thread; a 429 is
waited out and the message delivered once; while Slack is down notifications queue in the state
file and are delivered in order when it is back, across a restart of the daemon.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.daemon import Daemon
from diagnoser.daemon.state import StateStore
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.fixtures.slack_server import CHANNEL_ID, SlackFixtureServer

pytestmark = pytest.mark.integration


def _header(message_blocks: list[dict[str, object]]) -> str:
    first = message_blocks[0]
    assert first["type"] == "header"
    text = first["text"]
    assert isinstance(text, dict)
    return str(text["text"])


async def test_one_message_per_problem_none_for_repeats_one_resolution(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    pool_app.set("checkout", "orders-db", 0.97)
    pool_app.set("checkout", "sessions", 0.40)  # below the threshold: never a message
    daemon = Daemon(daemon_settings(tmp_path, live_prometheus.url, "checkout", slack=slack))
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) >= 1, what="the first message")
        first = slack.messages[0]
        assert first.via == "api"
        assert first.body["channel"] == "#oncall"
        assert first.thread_ts is None
        assert _header(first.blocks) == "CRITICAL: connection_pool_exhaustion: Pool orders-db saturated"
        assert "shop/checkout pool orders-db: 97% of connections in use (threshold 90%)" in first.text
        buttons = [b for b in first.blocks if b["type"] == "actions"]
        assert buttons[0]["elements"][0]["url"] == "https://runbooks.example/rules/test/pool-saturated.md"

        # Repeats within the cooldown: several more diagnoses see it, nobody is told again.
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 5, what="five more diagnoses")
        assert len(slack.messages) == 1

        pool_app.set("checkout", "orders-db", 0.30)
        await wait_for(lambda: len(slack.messages) >= 2, what="the resolution")
        resolved = slack.messages[1]
        assert resolved.text.startswith("Resolved: connection_pool_exhaustion")
        assert resolved.thread_ts == first.ts  # in the thread of the first message

        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 4, what="four more diagnoses")
        assert len(slack.messages) == 2
        assert daemon.state is not None
        assert daemon.state.pending_count() == 0
    finally:
        await daemon.stop()


async def test_a_429_is_waited_out_and_the_message_delivered_once(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    slack.ratelimit(1)
    pool_app.set("payments", "ledger", 0.99)
    daemon = Daemon(daemon_settings(tmp_path, live_prometheus.url, "payments", slack=slack, webhook=True))
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) >= 1, what="the message after the 429")
        statuses = [status for _, status in slack.requests]
        assert statuses[:2] == [429, 200]
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 4, what="four more diagnoses")
        assert len(slack.messages) == 1
        assert slack.messages[0].via == "webhook"
        assert daemon.metrics.notifications_sent.labels("new")._value.get() == 1
    finally:
        await daemon.stop()
        pool_app.set("payments", "ledger", 0.1)


async def test_slack_down_queues_in_order_and_delivers_after_restart(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    state_path = tmp_path / "state.sqlite3"
    slack.down()
    pool_app.set("search", "a", 0.95)
    first = Daemon(daemon_settings(tmp_path, live_prometheus.url, "search", slack=slack, state=state_path))
    await first.start()
    try:
        assert first.state is not None
        store = first.state
        await wait_for(lambda: store.pending_count() == 1, what="pool a queued")
        pool_app.set("search", "b", 0.96)
        await wait_for(lambda: store.pending_count() == 2, what="pool b queued")
        pool_app.set("search", "a", 0.2)
        # Pool a cleared before anyone was told: its stale first message is not posted as new,
        # its resolution is (the channel learns of it as it now stands).
        await wait_for(lambda: [e.kind.value for e in store.pending()] == ["new", "resolved"],
                       what="pool a's resolution queued, its first message dropped")
        # Still down: retried and kept, never dropped.
        runs = first.runs
        await wait_for(lambda: first.runs >= runs + 3, what="three more diagnoses")
        assert store.pending_count() == 2
        assert first.metrics.notifications_failed.labels("new")._value.get() >= 2
    finally:
        await first.stop()
    assert slack.messages == []

    # The queue survived the restart; Slack is back: everything, once, in order.
    slack.set_ok()
    second = Daemon(daemon_settings(tmp_path, live_prometheus.url, "search", slack=slack, state=state_path))
    await second.start()
    try:
        await wait_for(lambda: len(slack.messages) >= 2, what="the queued messages")
        texts = [m.text for m in slack.messages]
        assert "pool b:" in texts[0]
        assert _header(slack.messages[0].blocks).endswith("Pool b saturated")
        assert texts[1].startswith("Resolved: connection_pool_exhaustion: Pool a saturated")
        assert slack.messages[1].thread_ts is None
        runs = second.runs
        await wait_for(lambda: second.runs >= runs + 4, what="four more diagnoses")
        assert len(slack.messages) == 2  # b is still active: the restart did not re-send it
        assert all(m.body["channel"] == "#oncall" for m in slack.messages)
    finally:
        await second.stop()
        pool_app.set("search", "b", 0.1)
    reopened = StateStore(state_path)
    try:
        assert reopened.integrity_ok()
        assert reopened.pending_count() == 0
        assert [f.labels["pool"] for f in reopened.active_findings()] == ["b"]
        assert reopened.thread_of(next(iter(_fingerprints(reopened))))[0] == CHANNEL_ID
    finally:
        reopened.close()


def _fingerprints(store: StateStore) -> list[str]:
    from diagnoser.daemon.state import fingerprint

    return [fingerprint(f) for f in store.active_findings()]
