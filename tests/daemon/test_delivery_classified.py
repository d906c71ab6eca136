"""Delivery errors by kind, through the real daemon and the Slack fixture: never stuck on one message.

A message Slack will not edit (``cant_update_message``, ``edit_window_closed``) is said anew and
the queue goes on; a 429 on ``chat.update`` holds back only edits, never a new incident's
``chat.postMessage``; refused credentials are retried with backoff, so a short ``invalid_auth``
glitch delays messages by about its own length (not the dead letters' 15 minutes); a stuck
receiver is an ERROR line and ``/readyz`` 503; label values never mention anyone.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from diagnoser.config import DeliverySettings, Settings
from diagnoser.daemon import Daemon
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration

#: Fast knobs (the ones the other daemon tests use through ``slack.*``), plus the new ones.
FAST = {"retry_base_s": 0.2, "retry_max_s": 1.0, "in_doubt_settle_s": 1.5}


def _with_delivery(settings: Settings, **knobs: Any) -> Settings:
    delivery = DeliverySettings(**(FAST | knobs))
    return settings.model_copy(update={"notify": settings.notify.model_copy(update={"delivery": delivery})})


def _readyz(port: int | None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return int(refused.code), refused.read().decode()


def _new_posts(slack: SlackFixtureServer, job: str) -> list[str]:
    """The pools whose first message reached the channel's top level."""
    return [m.text for m in slack.top_level() if "Resolved" not in m.text and job in m.text]


@pytest.mark.parametrize("refusal", ["cant_update_message", "edit_window_closed"])
async def test_an_edit_slack_refuses_is_said_anew_and_the_eight_incidents_behind_it_are_posted(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer, refusal: str
) -> None:
    job = f"edit-{refusal[:4]}"
    pools = [f"p{i}" for i in range(8)]
    pool_app.set(job, "orders", 0.97)
    settings = daemon_settings(tmp_path, live_prometheus.url, job, slack=slack, digest_threshold=50)
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) == 1, what="the first incident's message")
        first = slack.messages[0]
        slack.lock_edits(refusal)
        pool_app.set(job, "orders", 0.2)  # its resolution edits the message: refused
        await wait_for(lambda: any(r == ("/api/chat.update", 200) for r in slack.requests), what="the edit")
        for pool in pools:
            pool_app.set(job, pool, 0.97)
        await wait_for(lambda: len(_new_posts(slack, job)) == 9, within=15, what="8 new incidents posted")
        # The refused edit did not vanish: the resolution is said in the incident's thread.
        assert [m.text.split(":")[0] for m in slack.replies(first.ts)] == ["Resolved"]
        assert slack.updates == []
        assert daemon.state is not None
        await wait_for(lambda: daemon.state is not None and daemon.state.pending_count() == 0, within=5)
        assert daemon.state.dead_letters() == []
    finally:
        await daemon.stop()
        for pool in ["orders", *pools]:
            pool_app.set(job, pool, 0.1)


async def test_a_429_on_chat_update_does_not_delay_a_new_incidents_post(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "edit-429"
    pool_app.set(job, "orders", 0.97)
    daemon = Daemon(daemon_settings(tmp_path, live_prometheus.url, job, slack=slack))
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) == 1, what="the first incident's message")
        slack.ratelimit(1000, retry_after_s=30, methods=["chat.update"])
        pool_app.set(job, "orders", 0.2)  # its resolution needs chat.update first: 429, 30 s
        await wait_for(lambda: ("/api/chat.update", 429) in slack.requests, what="the 429 on chat.update")
        queued = time.monotonic()
        pool_app.set(job, "payments", 0.97)
        await wait_for(lambda: len(slack.messages) == 2, within=8, what="the new incident, not 30 s later")
        new = slack.messages[1]
        assert "payments" in new.text and new.thread_ts is None
        assert new.at - queued < 8
        # The edit waits out its Retry-After: asked once, not hammered.
        assert [r for r in slack.requests if r[0] == "/api/chat.update"] == [("/api/chat.update", 429)]
        assert daemon.state is not None
        assert [e.kind.value for e in daemon.state.pending()] == ["resolved"]
    finally:
        await daemon.stop()
        pool_app.set(job, "orders", 0.1)
        pool_app.set(job, "payments", 0.1)


async def test_an_invalid_auth_glitch_delays_posts_by_about_the_glitch(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "auth-glitch"
    glitch_s = 8.0
    slack.revoke_token_for(glitch_s)
    started = time.monotonic()
    pool_app.set(job, "orders", 0.97)
    settings = _with_delivery(daemon_settings(tmp_path, live_prometheus.url, job, slack=slack), retry_max_s=2.0)
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) == 1, within=glitch_s + 10, what="the post after the glitch")
        delay = slack.messages[0].at - started
        # Backoff capped at 2 s: the post follows the glitch within a few seconds.
        assert glitch_s <= delay < glitch_s + 5
        assert daemon.state is not None and daemon.state.dead_letters() == []
        assert sum(1 for path, _ in slack.requests if path == "/api/chat.postMessage") > 2  # retried
    finally:
        await daemon.stop()
        pool_app.set(job, "orders", 0.1)


async def test_credentials_refused_past_dead_letter_after_s_become_a_dead_letter(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = "auth-dead"
    slack.revoke_token_for(60)
    pool_app.set(job, "orders", 0.97)
    settings = _with_delivery(
        daemon_settings(tmp_path, live_prometheus.url, job, slack=slack), dead_letter_after_s=2.0, stuck_after_s=1.0
    )
    daemon = Daemon(settings)
    with caplog.at_level(logging.ERROR, logger="diagnoser.notify.delivery"):
        await daemon.start()
        try:
            # Stuck first (an ERROR line, /readyz 503 naming the receiver), then a dead letter.
            await wait_for(lambda: any("stuck" in r.getMessage() for r in caplog.records), within=10,
                           what="the stuck receiver's ERROR line")
            status, body = await asyncio.to_thread(_readyz, daemon.http_port)
            assert status == 503 and "receiver slack stuck" in body and "invalid_auth" in body
            await wait_for(
                lambda: daemon.state is not None and [k for _, k, _ in daemon.state.dead_letters()] == ["new"],
                within=10, what="the dead letter after dead_letter_after_s",
            )
            assert any("dead-lettered outbox entry" in r.getMessage() for r in caplog.records)

            async def ready() -> bool:
                return (await asyncio.to_thread(_readyz, daemon.http_port))[0] == 200

            await wait_for(ready, within=5, what="/readyz 200 once nothing is queued")
        finally:
            await daemon.stop()
            pool_app.set(job, "orders", 0.1)


async def test_label_values_mention_nobody_in_text_or_blocks(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "mentions"
    pool = "<!channel> <@U0123ABCD> <!here|here> & co"
    pool_app.set(job, pool, 0.97)
    daemon = Daemon(daemon_settings(tmp_path, live_prometheus.url, job, slack=slack))
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) == 1, what="the message")
        pool_app.set(job, pool, 0.2)
        await wait_for(lambda: len(slack.messages) == 2 and len(slack.updates) == 1, what="the resolution")
        for message in [*slack.messages, *slack.updates]:
            assert message.mentions() == [], message.body
        assert "&lt;!channel&gt; &lt;@U0123ABCD&gt; &lt;!here|here&gt; &amp; co" in slack.messages[0].text
    finally:
        await daemon.stop()
        pool_app.set(job, pool, 0.1)
