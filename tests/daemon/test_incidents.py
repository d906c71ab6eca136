"""Incidents through the real daemon: a live Prometheus, the Slack fixture speaking Slack's wire format.

One top-level message per incident, the cause first and its symptoms as lines under it; changes
as edits (chat.update) or thread replies; one resolution; a digest for a burst, posted at about
one message per second; a flapping finding told once; a return soon after reopens the thread;
two services, two incidents. The daemon's timing settings are scaled down (a diagnosis every
0.4 s, ``resolve_after`` a few seconds) and the tests assert what reached the channel, never how
long it took.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from diagnoser.daemon import Daemon
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.fixtures.slack_server import PostedMessage, SlackFixtureServer

pytestmark = pytest.mark.integration


def header(body: dict[str, Any]) -> str:
    first = (body.get("blocks") or [{}])[0]
    assert first.get("type") == "header", body
    return str(first["text"]["text"])


def resolutions(slack: SlackFixtureServer, ts: str | None) -> list[PostedMessage]:
    return [m for m in slack.replies(ts) if m.text.startswith("Resolved:")]


def timing(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "pending_for_s": 1.2,
        "resolve_after_s": 2.5,
        "reopen_within_s": 0,
        "reply_min_interval_s": 0,
    }
    values.update(overrides)
    return values


async def test_a_symptom_and_its_cause_are_one_message_cause_first_edited_then_resolved_once(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "inc-one"
    pool_app.set(job, "orders-db", 0.97)
    pool_app.set_p99(job, 0.9)
    settings = daemon_settings(tmp_path, live_prometheus.url, job, slack=slack, symptom=True, **timing())
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) >= 1, 20, "the incident's message")
        (top,) = slack.top_level()
        assert header(top.body) == "CRITICAL: connection_pool_exhaustion: Pool orders-db saturated"
        sections = "\n".join(b["text"]["text"] for b in top.blocks if b["type"] == "section")
        assert "latency_slo_breach" in sections  # the symptom, as a line under its cause
        assert "p99 0.9 s, over the 0.25 s SLO" in sections
        # The symptom clears, the cause stays: the message is edited, nothing new is posted.
        pool_app.set_p99(job, 0.1)
        await wait_for(
            lambda: "latency_slo_breach" not in str(slack.current(top.ts)["blocks"]), 20, "the edit"
        )
        edited = slack.current(top.ts)
        assert header(edited) == "CRITICAL: connection_pool_exhaustion: Pool orders-db saturated"
        pool_app.set(job, "orders-db", 0.2)
        await wait_for(lambda: bool(resolutions(slack, top.ts)), 20, "the resolution")
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 8, what="eight more diagnoses")
        assert len(slack.top_level()) == 1
        assert len(resolutions(slack, top.ts)) == 1
        assert header(slack.current(top.ts)).startswith("RESOLVED: connection_pool_exhaustion")
        assert all(m.thread_ts == top.ts for m in slack.messages[1:])
    finally:
        await daemon.stop()
        pool_app.set(job, "orders-db", 0.1)
        pool_app.set_p99(job, 0.1)


async def test_a_lone_symptom_says_no_cause_yet_and_its_message_names_the_cause_once_found(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "inc-late"
    pool_app.set_p99(job, 0.8)
    settings = daemon_settings(tmp_path, live_prometheus.url, job, slack=slack, symptom=True, **timing())
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) >= 1, 20, "the symptom's message")
        (top,) = slack.top_level()
        assert header(top.body) == "WARNING: p99 over SLO on inc-late: no cause found yet"
        pool_app.set(job, "orders-db", 0.99)
        await wait_for(
            lambda: any("connection_pool_exhaustion" in header(u.body) for u in slack.updates),
            20,
            "the edit naming the cause",
        )
        assert (
            header(slack.current(top.ts)) == "CRITICAL: connection_pool_exhaustion: Pool orders-db saturated"
        )
        # The edit goes out first and its reply after it: wait for the reply, do not race it.
        await wait_for(
            lambda: any(
                r.text.startswith(("Severity warning → critical", "Cause found")) for r in slack.replies(top.ts)
            ),
            20,
            "the reply telling of the change",
        )
        assert len(slack.top_level()) == 1
    finally:
        await daemon.stop()
        pool_app.set(job, "orders-db", 0.1)
        pool_app.set_p99(job, 0.1)


async def test_thirty_at_once_are_one_digest_and_its_thread_at_about_one_message_a_second(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "inc-burst"
    for n in range(30):
        pool_app.set(job, f"pool-{n:02d}", 0.97)
    # Slack's own limit: the default rate of the sender (one a second, two at once).
    rate = {"messages_per_s": 1.0, "message_burst": 2}
    settings = daemon_settings(
        tmp_path, live_prometheus.url, job, slack=slack, slack_settings=rate, **timing()
    )
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) >= 31, 90, "the digest and its thread")
        (digest,) = slack.top_level()
        assert header(digest.body) == "30 incidents opened at once"
        assert "pool pool-07" in str(digest.blocks) or "pool-07" in str(digest.blocks)
        thread = slack.replies(digest.ts)
        assert len(thread) == 30
        assert sorted({m.text.split("Pool ")[1].split(" ")[0] for m in thread}) == [
            f"pool-{n:02d}" for n in range(30)
        ]
        # Never faster than the bucket allows: k posts after the burst take at least k seconds.
        times = [m.at for m in slack.messages]
        for i in range(len(times)):
            for j in range(i + 3, len(times)):
                assert times[j] - times[i] >= (j - i - 2) / 1.0 - 0.05, (i, j)
    finally:
        await daemon.stop()
        for n in range(30):
            pool_app.set(job, f"pool-{n:02d}", 0.1)


async def test_a_finding_flapping_every_few_seconds_is_one_post_and_one_resolution(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    # Scaled down ten times: flapping every 20 s for 5 minutes is 2 s up, 2 s down, for 30 s; the
    # default resolve_after (two 60 s intervals, 2 minutes) is 6 s.
    job = "inc-flap"
    settings = daemon_settings(
        tmp_path, live_prometheus.url, job, slack=slack, **timing(pending_for_s=0.8, resolve_after_s=6)
    )
    daemon = Daemon(settings)
    await daemon.start()
    try:
        flips = 0
        end = time.monotonic() + 30
        while time.monotonic() < end:
            pool_app.set(job, "orders", 0.97 if flips % 2 == 0 else 0.2)
            flips += 1
            await asyncio.sleep(2.0)
        pool_app.set(job, "orders", 0.2)
        await wait_for(
            lambda: bool(slack.top_level() and resolutions(slack, slack.top_level()[0].ts)),
            30,
            "the resolution once it stopped",
        )
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 5, what="five more diagnoses")
        (top,) = slack.top_level()
        assert len(resolutions(slack, top.ts)) == 1
        assert [m for m in slack.messages if m.thread_ts is None and m is not top] == []
    finally:
        await daemon.stop()
        pool_app.set(job, "orders", 0.1)


async def test_an_incident_back_soon_after_it_cleared_reopens_its_thread(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    # Scaled: back 2 minutes after it cleared, within the 30 minutes of reopen_within.
    job = "inc-back"
    pool_app.set(job, "orders", 0.97)
    settings = daemon_settings(
        tmp_path, live_prometheus.url, job, slack=slack, **timing(resolve_after_s=1.0, reopen_within_s=30)
    )
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) >= 1, 20, "the incident's message")
        (top,) = slack.top_level()
        pool_app.set(job, "orders", 0.2)
        await wait_for(lambda: bool(resolutions(slack, top.ts)), 20, "the resolution")
        await asyncio.sleep(2.0)
        pool_app.set(job, "orders", 0.98)
        await wait_for(
            lambda: any(r.text.startswith("Back again") for r in slack.replies(top.ts)),
            20,
            "the reopening in the thread",
        )
        assert len(slack.top_level()) == 1
        assert header(slack.current(top.ts)).startswith("CRITICAL: connection_pool_exhaustion")
    finally:
        await daemon.stop()
        pool_app.set(job, "orders", 0.1)


async def test_two_services_are_two_incidents(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    pool_app.set("inc-two-a", "orders", 0.97)
    pool_app.set_p99("inc-two-a", 0.9)
    pool_app.set("inc-two-b", "ledger", 0.99)
    settings = daemon_settings(
        tmp_path, live_prometheus.url, "inc-two-a|inc-two-b", slack=slack, symptom=True, **timing()
    )
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.top_level()) >= 2, 20, "two incidents")
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 5, what="five more diagnoses")
        tops = {header(m.body): m for m in slack.top_level()}
        assert sorted(tops) == [
            "CRITICAL: connection_pool_exhaustion: Pool ledger saturated",
            "CRITICAL: connection_pool_exhaustion: Pool orders saturated",
        ]
        # The symptom of service a is a line of a's incident, not of b's.
        assert "latency_slo_breach" in str(
            tops["CRITICAL: connection_pool_exhaustion: Pool orders saturated"].blocks
        )
        assert "latency_slo_breach" not in str(
            tops["CRITICAL: connection_pool_exhaustion: Pool ledger saturated"].blocks
        )
    finally:
        await daemon.stop()
        pool_app.set("inc-two-a", "orders", 0.1)
        pool_app.set_p99("inc-two-a", 0.1)
        pool_app.set("inc-two-b", "ledger", 0.1)
