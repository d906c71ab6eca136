"""Delivering incidents over real HTTP: chat.update in place, replies, held messages, the senders' protocol.

The state store decides (with a clock the test sets), :class:`OutboxDelivery` sends through the
real Slack sender to the fixture server, or through the JSON webhook sender to a local receiver.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from diagnoser.config import SlackSettings
from diagnoser.daemon.incidents import IncidentPolicy
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.daemon.state import StateStore
from diagnoser.models import Diagnosis, Finding
from diagnoser.notify.delivery import OutboxDelivery
from diagnoser.notify.outbox import render_entry
from diagnoser.notify.receivers.webhook import WebhookMessage
from diagnoser.notify.sender import Sender, TokenBucket
from diagnoser.notify.slack_sender import SlackSender
from diagnoser.notify.webhook_sender import JsonWebhookSender
from tests.daemon.test_incident_state import cause, symptom
from tests.fixtures.background_http import BackgroundHTTPServer
from tests.fixtures.slack_server import SlackFixtureServer

AT = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
POLICY = IncidentPolicy()


def settings(slack: SlackFixtureServer) -> SlackSettings:
    return SlackSettings(token=SecretStr(slack.token), channel="#oncall", base_url=slack.api_url,
                         allowed_addresses=["127.0.0.1"],
                         messages_per_s=50, message_burst=50, dead_letter_retry_s=60)


def delivery(store: StateStore, sender: Sender, slack_settings: SlackSettings, clock: list[float]) -> OutboxDelivery:
    return OutboxDelivery(store, sender, DaemonMetrics(), render_entry, slack_settings, clock=lambda: clock[0])


def decide(store: StateStore, *findings: Finding, now: float) -> None:
    store.reconcile(Diagnosis(evaluated_at=AT, findings=list(findings)), cooldown_s=3600, now=now, policy=POLICY)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore(tmp_path / "state.sqlite3")
    yield state
    state.close()


async def test_changes_edit_the_message_in_place_and_say_so_in_its_thread(
    store: StateStore, slack: SlackFixtureServer
) -> None:
    config = settings(slack)
    clock = [1000.0]
    out = delivery(store, SlackSender(config), config, clock)
    decide(store, symptom(), now=1000)
    await out.flush()
    (top,) = slack.top_level()
    assert "no cause found yet" in top.text
    decide(store, cause(), symptom(), now=1010)  # the cause arrives: its severity too
    decide(store, cause(), now=1020)  # the symptom clears
    decide(store, now=1030)  # all clear
    await out.flush()
    assert [u.ts for u in slack.updates] == [top.ts] * 3
    headers = [u.body["blocks"][0]["text"]["text"] for u in slack.updates]
    assert headers == [
        "CRITICAL: connection_pool_exhaustion: Pool orders exhausted",
        "CRITICAL: connection_pool_exhaustion: Pool orders exhausted",
        "RESOLVED: connection_pool_exhaustion: Pool orders exhausted",
    ]
    assert [r.text.split(":")[0] for r in slack.replies(top.ts)] == ["Severity warning → critical", "Resolved"]
    assert len(slack.top_level()) == 1 and store.pending_count() == 0


async def test_a_first_message_refused_holds_its_incident_until_a_retry_delivers_it(
    store: StateStore, slack: SlackFixtureServer
) -> None:
    config = settings(slack)
    clock = [1000.0]
    out = delivery(store, SlackSender(config), config, clock)
    slack.refuse("channel_not_found", times=1)  # a channel being renamed
    decide(store, cause(), now=1000)
    await out.flush()
    assert [kind for _, kind, _ in store.dead_letters()] == ["new"]
    decide(store, cause(), cause("b"), now=1020)  # still there; the queue goes on meanwhile
    await out.flush()
    assert [m.text.split("Pool ")[1].split(" ")[0] for m in slack.messages] == ["b"]
    clock[0] = 1000 + 61  # the slow schedule: the dead letter is tried again, and lands
    await out.flush()
    assert [m.text.split("Pool ")[1].split(" ")[0] for m in slack.messages] == ["b", "orders"]
    assert store.dead_letters() == []


async def test_a_dead_letter_retried_after_its_incident_cleared_is_not_announced(
    store: StateStore, slack: SlackFixtureServer
) -> None:
    config = settings(slack)
    clock = [1000.0]
    out = delivery(store, SlackSender(config), config, clock)
    slack.refuse("channel_not_found", times=1)
    decide(store, cause(), now=1000)
    await out.flush()
    decide(store, now=1010)  # it clears while nobody was told about it: nothing to resolve
    await out.flush()
    assert slack.messages == [] and store.pending_count() == 0
    clock[0] = 1000 + 61  # the dead letter is tried again: a CRITICAL for a pool long since fine
    await out.flush()
    assert slack.messages == [] and store.pending_count() == 0 and store.dead_letters() == []


async def test_the_json_webhook_sender_posts_every_message_as_one_json_object(store: StateStore) -> None:
    received: list[dict[str, Any]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    http = BackgroundHTTPServer(Receiver, name="json-receiver").start()
    try:
        sender = JsonWebhookSender(
            f"http://127.0.0.1:{http.port}/hook", messages_per_s=50, burst=50, allowed_addresses=["127.0.0.1"]
        )
        assert sender.capabilities.threads is False and sender.capabilities.read_back is False
        out = delivery(store, sender, SlackSettings(), [1000.0])
        decide(store, cause(), now=1000)
        await out.flush()
        decide(store, now=1010)
        await out.flush()
    finally:
        http.stop()
    assert [r["text"].split(": connection_pool_exhaustion")[0] for r in received] == [
        ":red_circle: CRITICAL", ":white_check_mark: RESOLVED", "Resolved"]  # fmt: skip
    assert received[0]["marker"].startswith("dgn-") and received[1]["updates"].startswith("webhook-")


async def test_the_token_bucket_spaces_calls_to_its_rate_after_the_burst() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    bucket = TokenBucket(1.0, 2, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        await bucket.take()
    assert now[0] == pytest.approx(3.0)  # two at once, then one a second
    now[0] += 10  # idle: the burst is back, never more
    await bucket.take()
    await bucket.take()
    before = now[0]
    await bucket.take()
    assert now[0] - before == pytest.approx(1.0)
    await asyncio.sleep(0)


async def test_an_alert_report_about_an_incidents_service_goes_in_its_thread(
    store: StateStore, slack: SlackFixtureServer
) -> None:
    from diagnoser.notify.outbox import NotificationKind
    from diagnoser.notify.payloads import AlertReportPayload

    config = settings(slack)
    out = delivery(store, SlackSender(config), config, [1000.0])
    decide(store, cause(), now=1000)
    await out.flush()
    (top,) = slack.top_level()
    # An Alertmanager group about the service, whose own diagnosis found nothing more.
    incident = store.incident_for_service("checkout")
    assert incident is not None and store.incident_for_service("billing") is None
    report = AlertReportPayload(diagnosis=Diagnosis(evaluated_at=AT), alert="CheckoutSlow", scope={"service": "checkout"})
    store.enqueue(NotificationKind.alert_report, report, incident_id=incident)
    await out.flush()
    (reply,) = slack.replies(top.ts)
    assert reply.text.startswith("Diagnosis for CheckoutSlow")


async def test_an_edit_refused_for_good_is_posted_anew_in_the_thread(
    store: StateStore, slack: SlackFixtureServer
) -> None:
    config = settings(slack)
    clock = [1000.0]
    out = delivery(store, SlackSender(config), config, clock)
    decide(store, cause(), symptom(), now=1000)
    await out.flush()
    (top,) = slack.top_level()
    slack.lock_edits("edit_window_closed")
    decide(store, cause(), now=1010)  # the symptom clears: an edit alone, no reply
    await out.flush()
    assert slack.updates == [] and store.pending_count() == 0
    (anew,) = slack.replies(top.ts)
    assert anew.blocks[0]["text"]["text"] == "CRITICAL: connection_pool_exhaustion: Pool orders exhausted"


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        # Credentials refused (a key being rotated): retried with backoff, not refused for good.
        (401, {}, {"auth": True, "permanent": False}),
        (403, {}, {"auth": True, "permanent": False}),
        # RFC 9110 allows an HTTP date in Retry-After: 30 s from now is kept as such.
        (429, {"Retry-After": "DATE+30"}, {"permanent": False, "retry_after": 30}),
        (408, {}, {"permanent": False, "auth": False}),
        (422, {}, {"permanent": True, "auth": False}),
    ],
)
async def test_the_json_webhook_classifies_its_documented_status_codes(
    status: int, headers: dict[str, str], expected: dict[str, Any]
) -> None:
    from email.utils import formatdate

    from diagnoser.errors import WebhookSendError

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(status)
            for key, value in headers.items():
                when = formatdate(time.time() + 30, usegmt=True)
                self.send_header(key, value.replace("DATE+30", when))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    http = BackgroundHTTPServer(Receiver, name="json-receiver").start()
    try:
        sender = JsonWebhookSender(f"http://127.0.0.1:{http.port}/hook", allowed_addresses=["127.0.0.1"])
        with pytest.raises(WebhookSendError) as caught:
            await sender.post(WebhookMessage("text"), marker="dgn-1-a")
    finally:
        http.stop()
    error = caught.value
    for name, value in expected.items():
        if name == "retry_after":
            assert error.retry_after is not None and value - 2 <= error.retry_after <= value
        else:
            assert getattr(error, name) == value, name
