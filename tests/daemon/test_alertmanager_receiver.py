"""The Alertmanager receiver under an alert storm: 202 at once, one diagnosis and one post per group.

Alertmanager retries a webhook that times out or fails and re-sends a group at every
``group_interval``/``repeat_interval``; hundreds of webhooks for one group must still give one
report, posted in the Slack thread of the incident it is about.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from diagnoser.daemon import Daemon
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.daemon.test_daemon_cluster import _alertmanager_payload
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration

TOKEN = "am-storm-token"


async def _post(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with http.post(url, data=body, headers=headers) as response:
        return response.status, await response.json()


async def test_500_webhooks_for_one_group_give_one_threaded_report(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    pool_app.set("amstorm", "orders", 0.97)
    settings = daemon_settings(tmp_path, live_prometheus.url, "amstorm", slack=slack, alertmanager_token=TOKEN)
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) == 1, what="the incident's first message")
        incident = slack.messages[0]
        url = f"http://127.0.0.1:{daemon.http_port}/alertmanager"
        payload = _alertmanager_payload({"alertname": "OrdersSlow", "namespace": "shop", "service": "amstorm"})
        body = json.dumps(payload).encode()
        # 20 at once: one Alertmanager is one address, within daemon.http_max_connections_per_peer.
        connector = aiohttp.TCPConnector(limit=20)
        async with aiohttp.ClientSession(connector=connector) as http:
            answers = await asyncio.gather(*(_post(http, url, body) for _ in range(500)))
        assert {status for status, _ in answers} == {202}
        outcomes = [answer["status"] for _, answer in answers]
        assert outcomes.count("accepted") == 1 and outcomes.count("duplicate") == 499
        await wait_for(lambda: len(slack.messages) == 2, what="the alert report")
        report = slack.messages[1]
        assert report.text.startswith("Diagnosis for OrdersSlow")
        assert report.thread_ts == incident.ts  # a reply in the incident's thread
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 5, what="five more diagnoses")
        assert len(slack.messages) == 2
        assert daemon.metrics.diagnoses.labels("alertmanager", "ok")._value.get() == 1
    finally:
        await daemon.stop()
        pool_app.set("amstorm", "orders", 0.1)


async def test_many_groups_are_bounded_and_deep_json_is_refused(
    tmp_path: Path, live_prometheus: LivePrometheus, slack: SlackFixtureServer
) -> None:
    settings = daemon_settings(tmp_path, live_prometheus.url, "amgroups", slack=slack, alertmanager_token=TOKEN,
                               alert_concurrency=2, alert_backlog=3)
    daemon = Daemon(settings)
    await daemon.start()
    try:
        url = f"http://127.0.0.1:{daemon.http_port}/alertmanager"
        async with aiohttp.ClientSession() as http:
            for depth in (40, 100_000):
                status, answer = await _post(http, url, b"[" * depth + b"]" * depth)
                assert status == 400, answer
                assert "nested deeper than 32" in answer["error"]
            bodies = [
                json.dumps(_alertmanager_payload({"alertname": f"Alert{i}", "service": "amgroups"})).encode()
                for i in range(20)
            ]
            answers = await asyncio.gather(*(_post(http, url, b) for b in bodies))
        statuses = [status for status, _ in answers]
        # Two running and three waiting at most: the rest are told to come back (Alertmanager retries).
        assert statuses.count(202) == 5 and statuses.count(503) == 15
        await wait_for(lambda: daemon.metrics.diagnoses.labels("alertmanager", "ok")._value.get() == 5,
                       what="the five accepted diagnoses")
    finally:
        await daemon.stop()
