"""Incidents that stay true, through the real daemon, a live Prometheus and the Slack fixture.

A label whose value changes every scrape (an error text with an ephemeral port, an opaque
connection id) is one incident and one post; a reopened incident says what came back with the
current numbers; a target that goes down after a resolved incident is a new incident led by
``target_unreachable``; a cause in one service explaining another's symptom is one thread.
Timings are scaled down (a diagnosis every 0.4 s, ``pending_for`` 1.2 s); the tests assert what
reached the channel, never how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from diagnoser.config import NotifySettings
from diagnoser.daemon import Daemon
from diagnoser.testing.processes import free_port, local_redis, running
from diagnoser.testing.prometheus import LocalPrometheus
from tests.daemon.conftest import RUNBOOK, LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.daemon.test_incidents import header, resolutions, timing
from tests.fixtures.slack_server import CHANNEL_ID, PERMALINK_BASE, SlackFixtureServer

pytestmark = pytest.mark.integration

RULES = Path(__file__).resolve().parents[2] / "rules"

BACKEND_RULE = """\
cause: connection_limit_reached
severity: critical
title: "Backend refusing {{service}}"
summary: "{{namespace}}/{{service}}: the backend refuses new connections"
when:
  - promql:
      query: max by (namespace, service, err, conn) (shop_backend_refusing{{service="{job}"}}) == 1
recommendation: "Find who holds the backend's connections."
"""


def write_backend_rule(rules: Path, job: str) -> None:
    family = rules / "test"
    (family / "backend-refusing.yaml").write_text(BACKEND_RULE.format(job=job), encoding="utf-8")
    (family / "backend-refusing.md").write_text(RUNBOOK, encoding="utf-8")


async def change_every_scrape(pool_app: PoolApp, job: str, times: int, **label: str) -> None:
    """Set the backend's refusal ``times`` times, a second apart, ``{n}`` in the label replaced."""
    for n in range(times):
        values = {k: v.format(n=n, port=40000 + 7 * n) for k, v in label.items()}
        pool_app.set_refusing(job, **values)
        await asyncio.sleep(1.0)


async def test_an_error_text_changing_every_scrape_is_one_incident_and_one_post(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "truth-err"
    settings = daemon_settings(tmp_path, live_prometheus.url, job, slack=slack, **timing(pending_for_s=2.5))
    write_backend_rule(tmp_path / f"rules-{job}", job)
    daemon = Daemon(settings)
    await daemon.start()
    try:
        # redis_exporter's own spelling: the exporter's ephemeral port changes at every scrape.
        err = "write tcp 127.0.0.1:{port}->127.0.0.1:6379: write: broken pipe"
        await change_every_scrape(pool_app, job, 8, err=err)
        # Told while it lasts (each error text lasts a second, less than pending_for), then over.
        assert len(slack.top_level()) == 1, [m.text for m in slack.messages]
        (top,) = slack.top_level()
        assert header(top.body) == "CRITICAL: connection_limit_reached: Backend refusing truth-err"
        assert len(daemon.active_findings()) == 1
        pool_app.set_refusing(job)
        await wait_for(lambda: bool(resolutions(slack, top.ts)), 20, "the resolution")
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 5, what="five more diagnoses")
        assert len(slack.top_level()) == 1 and len(resolutions(slack, top.ts)) == 1
    finally:
        await daemon.stop()
        pool_app.set_refusing(job)


async def test_an_opaque_label_changing_every_evaluation_is_one_post_to_the_webhook(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "truth-conn"
    settings = daemon_settings(tmp_path, live_prometheus.url, job, **timing(pending_for_s=2.5))
    hook = {"name": "bridge", "type": "webhook", "url": slack.webhook_url, "messages_per_s": 10,
            "allowed_addresses": ["127.0.0.1"]}
    settings = settings.model_copy(update={"notify": NotifySettings.model_validate({"receivers": [hook]})})
    write_backend_rule(tmp_path / f"rules-{job}", job)
    daemon = Daemon(settings)
    await daemon.start()
    try:
        # Nothing about "c3" says it changes: the daemon sees it change while the rest holds.
        await change_every_scrape(pool_app, job, 8, conn="c{n}")
        assert len(_posts(slack)) == 1, [m.text for m in slack.messages]
        pool_app.set_refusing(job)
        await wait_for(lambda: any(m.text.startswith("Resolved") for m in slack.messages), 20, "the resolution")
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 5, what="five more diagnoses")
        assert len(_posts(slack)) == 1, [m.text for m in slack.messages]
        assert len([m for m in slack.messages if m.text.startswith("Resolved")]) == 1
    finally:
        await daemon.stop()
        pool_app.set_refusing(job)


def _posts(slack: SlackFixtureServer) -> list[Any]:
    """The webhook's first messages (an edit is a POST naming the message it replaces)."""
    return [m for m in slack.messages if m.via == "webhook" and not m.body.get("updates")
            and "CRITICAL: connection_limit_reached" in m.text]  # fmt: skip


async def test_a_symptom_back_after_the_fix_is_told_with_its_current_numbers_not_the_old_cause(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "truth-back"
    pool_app.set(job, "orders", 0.97)
    pool_app.set_p99(job, 0.9)
    settings = daemon_settings(
        tmp_path, live_prometheus.url, job, slack=slack, symptom=True,
        **timing(resolve_after_s=1.0, reopen_within_s=60),
    )  # fmt: skip
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.top_level()) >= 1, 20, "the incident's message")
        (top,) = slack.top_level()
        assert header(top.body) == "CRITICAL: connection_pool_exhaustion: Pool orders saturated"
        pool_app.set(job, "orders", 0.5)  # the pool raised: half of it in use
        pool_app.set_p99(job, 0.1)
        await wait_for(lambda: bool(resolutions(slack, top.ts)), 20, "the resolution")
        pool_app.set_p99(job, 0.6)  # the latency comes back; the pool is fine
        await wait_for(
            lambda: any(r.text.startswith("Back again") for r in slack.replies(top.ts)), 20, "the reopening"
        )
        (back,) = [r for r in slack.replies(top.ts) if r.text.startswith("Back again")]
        assert "latency_slo_breach is back; connection_pool_exhaustion is not seen now" in back.text
        assert "p99 0.6 s" in str(back.blocks) and "97%" not in str(back.blocks)
        current = slack.current(top.ts)
        assert header(current) == "WARNING: p99 over SLO on truth-back: connection_pool_exhaustion not seen now"
        assert "p99 0.6 s" in str(current["blocks"]) and "97%" not in str(current["blocks"])
        # What the cause's own evidence reads now, not what it read: the pool at half, not 97 %.
        for said in (str(back.blocks), str(current["blocks"])):
            assert "connection_pool_exhaustion now:_" in said and "50 % (threshold 90 %)" in said, said
        assert len(slack.top_level()) == 1
    finally:
        await daemon.stop()
        pool_app.set(job, "orders", 0.1)
        pool_app.set_p99(job, 0.1)


DATABASE_RULE = """\
cause: connection_limit_reached
severity: critical
title: "Database {{service}} at its connection limit"
summary: "{{service}} refuses new connections; its clients suffer"
explains: [latency_slo_breach]
when:
  - promql:
      query: max by (namespace, service) (shop_backend_refusing{{service="{database}"}}) == 1
evidence:
  # As resources/server-connection-limit-slo names them: the client services that suffer meanwhile.
  - name: suffering
    promql:
      query: |
        max by (client_service) (label_replace(shop_request_p99_seconds{{service="{client}"}} > 0.25,
          "client_service", "$1", "service", "(.+)"))
recommendation: "Put a pooler in front of {{service}}."
"""


async def test_a_database_explaining_another_services_symptom_is_one_thread_under_the_database(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    client, database = "truth-app", "truth-db"
    settings = daemon_settings(
        tmp_path, live_prometheus.url, f"{client}|{database}", slack=slack, symptom=True, **timing()
    )
    family = tmp_path / f"rules-{client}|{database}" / "test"
    (family / "database-limit.yaml").write_text(DATABASE_RULE.format(database=database, client=client), "utf-8")
    (family / "database-limit.md").write_text(RUNBOOK, encoding="utf-8")
    pool_app.set_p99(client, 0.9)  # the symptom opens first, in its own service
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.top_level()) >= 1, 20, "the symptom's message")
        (top,) = slack.top_level()
        assert header(top.body) == "WARNING: p99 over SLO on truth-app: no cause found yet"
        pool_app.set_refusing(database, conn="all")
        await wait_for(
            lambda: header(slack.current(top.ts)).startswith("CRITICAL: connection_limit_reached"),
            20, "the edit naming the database",
        )  # fmt: skip
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 5, what="five more diagnoses")
        assert len(slack.top_level()) == 1, [m.text for m in slack.top_level()]
        current = slack.current(top.ts)
        assert header(current) == "CRITICAL: connection_limit_reached: Database truth-db at its connection limit"
        assert "latency_slo_breach" in str(current["blocks"])
    finally:
        await daemon.stop()
        pool_app.set_p99(client, 0.1)
        pool_app.set_refusing(database)


async def test_a_symptoms_thread_merged_into_the_databases_incident_links_to_that_thread(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    first, second, database = "truth-a1", "truth-a2", "truth-adb"
    settings = daemon_settings(
        tmp_path, live_prometheus.url, f"{first}|{second}|{database}", slack=slack, symptom=True, **timing()
    )
    family = tmp_path / f"rules-{first}|{second}|{database}" / "test"
    # One database serving both services: its evidence names each as a client.
    rule = DATABASE_RULE.replace('service="{client}"', 'service=~"{client}"')
    (family / "database-limit.yaml").write_text(rule.format(database=database, client=f"{first}|{second}"), "utf-8")
    (family / "database-limit.md").write_text(RUNBOOK, encoding="utf-8")
    pool_app.set_p99(first, 0.9)
    pool_app.set_p99(second, 0.8)  # two symptoms, two threads, no cause yet
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.top_level()) >= 2, 20, "the symptoms' messages")
        pool_app.set_refusing(database, conn="all")
        await wait_for(
            lambda: any(header(slack.current(m.ts)).startswith("MERGED") for m in slack.top_level()),
            20, "the merged thread's edit",
        )  # fmt: skip
        (merged,) = [m for m in slack.top_level() if header(slack.current(m.ts)).startswith("MERGED")]
        (host,) = [m for m in slack.top_level() if m is not merged]
        await wait_for(
            lambda: header(slack.current(host.ts)).startswith("CRITICAL: connection_limit_reached: Database truth-adb"),
            10, "the edit naming the database in the thread it joined",
        )  # fmt: skip
        await wait_for(
            lambda: any("Merged into" in r.text for r in slack.replies(merged.ts)), 10, "the merge note in its thread"
        )
        (note,) = [r for r in slack.replies(merged.ts) if "Merged into" in r.text]
        # The permalink Slack's chat.getPermalink gives for the incident's message it joined.
        link = f"<{PERMALINK_BASE}/archives/{CHANNEL_ID}/p{str(host.ts).replace('.', '')}|"
        assert link in str(note.blocks), note.blocks
        assert link in str(slack.current(merged.ts)["blocks"])
    finally:
        await daemon.stop()
        pool_app.set_p99(first, 0.1)
        pool_app.set_p99(second, 0.1)
        pool_app.set_refusing(database)


async def test_redis_stopped_after_a_resolved_incident_is_a_new_incident_led_by_target_unreachable(
    tmp_path: Path, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "truth-down"
    with contextlib.ExitStack() as stack:
        redis_stack = stack.enter_context(contextlib.ExitStack())
        redis_port = redis_stack.enter_context(local_redis())
        exporter = f"127.0.0.1:{free_port()}"
        stack.enter_context(running(
            "prometheus-redis-exporter", "-redis.addr", f"127.0.0.1:{redis_port}", "-web.listen-address", exporter
        ))  # fmt: skip
        prometheus = stack.enter_context(
            LocalPrometheus(scrape_targets=[pool_app.target, exporter], scrape_interval="1s")
        )
        live = LivePrometheus(prometheus.url, 0)
        await wait_for(lambda: live.value("redis_up") == 1, 30, "the exporter's first scrape")
        settings = daemon_settings(
            tmp_path, prometheus.url, job, slack=slack, **timing(resolve_after_s=1.0, reopen_within_s=60)
        )
        sources = tmp_path / f"rules-{job}" / "sources"
        sources.mkdir()
        for suffix in (".yaml", ".md"):
            shutil.copy(RULES / "sources" / f"redis-down{suffix}", sources)
        pool_app.set(job, "orders", 0.97)
        daemon = Daemon(settings)
        await daemon.start()
        try:
            await wait_for(lambda: len(slack.top_level()) >= 1, 20, "the pool's message")
            (pool,) = slack.top_level()
            pool_app.set(job, "orders", 0.2)
            await wait_for(lambda: bool(resolutions(slack, pool.ts)), 20, "the pool's resolution")
            redis_stack.close()  # Redis stops; its exporter stays up
            await wait_for(lambda: len(slack.top_level()) >= 2, 30, "Redis down, told")
            down = slack.top_level()[1]
            assert header(down.body) == f"CRITICAL: target_unreachable: Redis unreachable: {exporter}"
            assert "connection refused" in str(down.blocks)
            assert not [r for r in slack.replies(pool.ts) if r.text.startswith("Back again")]
        finally:
            await daemon.stop()
            pool_app.set(job, "orders", 0.1)
