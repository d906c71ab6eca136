"""Slack misbehaving while the daemon runs: late answers, 429 storms, refusals, lost threads, outages.

Each case drives the real daemon (a live Prometheus scraping an incident) against the Slack
fixture server in one fault mode and checks what reached the channel: every notification once,
none twice, diagnoses never held up, a refused message never blocking the ones behind it.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
import urllib.request
from pathlib import Path

import pytest

from diagnoser.daemon import Daemon
from diagnoser.daemon.state import StateStore
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for, write_rule
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration


def _status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=3) as answer:
        return int(answer.status)


def _outbox_empty(path: Path) -> bool:
    """Read the running daemon's state from outside, as an operator would (WAL allows it)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT count(*) FROM outbox").fetchone()[0]) == 0
    finally:
        db.close()


def _counter(daemon: Daemon, name: str, *labels: str) -> float:
    metric = getattr(daemon.metrics, name)
    return float((metric.labels(*labels) if labels else metric)._value.get())


async def test_a_post_answered_after_the_timeout_is_found_not_posted_again(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    # Slack stores the message at once and answers 3 s later; the client gives up after 1 s.
    slack.slow(3.0, times=1)
    pool_app.set("late", "orders", 0.97)
    daemon = Daemon(daemon_settings(tmp_path, live_prometheus.url, "late", slack=slack))
    await daemon.start()
    try:
        await wait_for(lambda: _counter(daemon, "notifications_in_doubt", "found") == 1, 20, "the lookup")
        assert daemon.state is not None
        assert daemon.state.pending_count() == 0
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 5, what="five more diagnoses")
        assert len(slack.messages) == 1
        assert _counter(daemon, "notifications_sent", "new") == 1
        # The recorded thread is the message Slack kept: the resolution goes into it.
        pool_app.set("late", "orders", 0.2)
        await wait_for(lambda: len(slack.messages) == 2, what="the resolution")
        assert slack.messages[1].thread_ts == slack.messages[0].ts
    finally:
        await daemon.stop()
        pool_app.set("late", "orders", 0.1)


async def test_a_5xx_is_looked_up_then_posted_once(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    slack.fail()
    pool_app.set("err500", "orders", 0.97)
    daemon = Daemon(daemon_settings(tmp_path, live_prometheus.url, "err500", slack=slack))
    await daemon.start()
    try:
        # The post, then looks at the channel (also 500) before any second post.
        await wait_for(lambda: len(slack.requests) >= 3, what="three 500s")
        assert _counter(daemon, "notifications_failed", "new") == 1
        slack.set_ok()
        await wait_for(lambda: len(slack.messages) == 1, what="the message")
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 8, what="eight more diagnoses")
        assert len(slack.messages) == 1
        assert _counter(daemon, "notifications_in_doubt", "absent") == 1
    finally:
        await daemon.stop()
        pool_app.set("err500", "orders", 0.1)


async def test_a_429_storm_neither_stops_diagnoses_nor_readiness_and_retry_after_is_kept(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    slack.ratelimit(1000, retry_after_s=20)
    pool_app.set("storm", "orders", 0.97)
    daemon = Daemon(
        daemon_settings(tmp_path, live_prometheus.url, "storm", slack=slack, webhook=True, ready_max_age_s=2)
    )
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.requests) >= 1, what="the first 429")
        runs = daemon.runs
        # Slack asked for 20 s; diagnoses go on at their interval meanwhile, and /readyz holds.
        await wait_for(lambda: daemon.runs >= runs + 8, within=10, what="eight diagnoses during the 429")
        assert await asyncio.to_thread(_status, f"http://127.0.0.1:{daemon.http_port}/readyz") == 200
        assert [status for _, status in slack.requests] == [429]  # not asked again before 20 s
        assert daemon.state is not None
        assert daemon.state.pending_count() == 1
        assert slack.messages == []
    finally:
        await daemon.stop()
        pool_app.set("storm", "orders", 0.1)


async def test_a_refused_message_is_dead_lettered_and_the_queue_goes_on(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    slack.refuse("channel_not_found", times=1)
    pool_app.set("refused", "a", 0.97)
    daemon = Daemon(daemon_settings(tmp_path, live_prometheus.url, "refused", slack=slack))
    await daemon.start()
    try:
        await wait_for(lambda: _counter(daemon, "notifications_dead_lettered", "new", "channel_not_found") == 1,
                       what="the dead letter")
        pool_app.set("refused", "b", 0.97)
        await wait_for(lambda: len(slack.messages) == 1, what="the next message")
        assert "pool b" in slack.messages[0].text
        assert daemon.state is not None
        assert [(kind, error.split(": ", 1)[0]) for _, kind, error in daemon.state.dead_letters()] == [
            ("new", "Slack refused the message")
        ]
        assert "channel_not_found" in daemon.state.dead_letters()[0][2]
        # A reply whose thread was deleted goes to the channel's top level and becomes the thread.
        first = slack.messages[0]
        assert first.ts is not None
        slack.delete(first.ts)
        pool_app.set("refused", "b", 0.2)
        await wait_for(lambda: len(slack.messages) == 2, what="the resolution")
        assert slack.messages[1].text.startswith("Resolved:")
        assert slack.messages[1].thread_ts is None
        assert _counter(daemon, "slack_threads_lost") == 1
        # The fixture has the message before the daemon has Slack's answer and records it as sent.
        state = daemon.state
        await wait_for(lambda: state.pending_count() == 0, within=5, what="the resolution recorded as sent")
    finally:
        await daemon.stop()
        pool_app.set("refused", "a", 0.1)
        pool_app.set("refused", "b", 0.1)


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    from diagnoser.notify.delivery import backoff_s

    low = [backoff_s(n, base_s=2, max_s=300, rng=lambda: 0.0) for n in range(1, 10)]
    high = [backoff_s(n, base_s=2, max_s=300, rng=lambda: 1.0) for n in range(1, 10)]
    assert high == [2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert low == [h / 2 for h in high]


async def test_during_an_outage_retries_back_off(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    slack.down()
    pool_app.set("outage", "orders", 0.97)
    settings = daemon_settings(
        tmp_path, live_prometheus.url, "outage", slack=slack, slack_settings={"retry_base_s": 0.5, "retry_max_s": 4}
    )
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: _counter(daemon, "notifications_failed", "new") >= 1, what="the first failure")
        started = time.monotonic()
        await wait_for(lambda: time.monotonic() - started > 6, within=10)
        # Waits of 0.25-0.5, 0.5-1, 1-2, 2-4 s: at most 5 more tries in 6 s (20 at a fixed 0.3 s).
        assert _counter(daemon, "notifications_failed", "new") <= 6
        slack.set_ok()
        await wait_for(lambda: len(slack.messages) == 1, within=10, what="delivery once Slack is back")
    finally:
        await daemon.stop()
        pool_app.set("outage", "orders", 0.1)


def test_sigkill_while_slack_answers_late_still_delivers_once(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    from tests.daemon.test_serve_process import _start, _wait

    pool_app.set("killed", "orders", 0.97)
    rules = write_rule(tmp_path / "rules", "killed")
    config = {
        "prometheus": {"url": live_prometheus.url},
        "rule_dirs": [str(rules)],
        "disable_builtin_rules": True,
        "slack": {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url, "timeout_s": 30,
                  "in_doubt_settle_s": 2, "retry_base_s": 0.2, "allowed_addresses": ["127.0.0.1"]},
        "daemon": {"diagnose_interval_s": 0.5, "pending_for_s": 0, "resolve_after_s": 0, "jitter_s": 0,
                   "listen": "127.0.0.1:0",
                   "state_path": str(tmp_path / "state.sqlite3"), "outbox_retry_s": 0.3},
    }
    # Slack stores the message and answers 20 s later; the daemon is killed while it waits.
    slack.slow(20.0, times=1)
    first, log = _start(config, tmp_path)
    try:
        _wait(lambda: len(slack.messages) == 1, 20, "the message stored by Slack", first, log)
        first.kill()
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    second, log = _start(config, tmp_path, "--log-format", "json")
    try:
        _wait(lambda: len(slack.messages) > 1 or _outbox_empty(tmp_path / "state.sqlite3"), 20,
              "the queued message dealt with", second, log)
        time.sleep(3)  # several more diagnoses and outbox runs
        assert len(slack.messages) == 1
        assert "had reached Slack after all" in log.read_text()
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=15) == 0
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
        pool_app.set("killed", "orders", 0.1)
    store = StateStore(tmp_path / "state.sqlite3")
    try:
        assert store.pending_count() == 0
        assert store.active_findings()[0].labels["pool"] == "orders"
    finally:
        store.close()
