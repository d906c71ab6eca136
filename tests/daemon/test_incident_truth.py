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
from pathlib import Path
from typing import Any

import pytest

from diagnoser.config import NotifySettings
from diagnoser.daemon import Daemon
from tests.daemon.conftest import RUNBOOK, LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.daemon.test_incidents import header, resolutions, timing
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration

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
    hook = {"name": "bridge", "type": "webhook", "url": slack.webhook_url, "messages_per_s": 10}
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
