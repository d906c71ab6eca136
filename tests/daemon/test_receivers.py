"""Receivers as Alertmanager has them: typed configs by ``type:``, routing by ``match:``, one
outbox row per receiver, each delivered on its own; the older keys mapped onto one receiver.

Slack is the fixture server speaking Slack's Web API, PagerDuty the fixture endpoint speaking
Events API v2; the state store and the delivery are the real ones.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from diagnoser.config import NotifySettings, SlackSettings, load_settings
from diagnoser.daemon import Daemon
from diagnoser.daemon.incidents import IncidentPolicy
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.daemon.state import StateStore
from diagnoser.errors import ConfigError
from diagnoser.models import Diagnosis, Finding
from diagnoser.notify.delivery import FanOut, OutboxDelivery
from diagnoser.notify.receivers import (
    build_receivers,
    delivery_settings,
    deprecations,
    receiver_configs,
    receiver_types,
    routes,
)
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.daemon.test_incident_state import cause, symptom
from tests.fixtures.pagerduty_server import ROUTING_KEY, PagerDutyFixtureServer
from tests.fixtures.slack_server import SlackFixtureServer

AT = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


def notify(slack: SlackFixtureServer, pd: PagerDutyFixtureServer) -> NotifySettings:
    return NotifySettings.model_validate({"receivers": [
        {"name": "oncall", "type": "slack", "token": slack.token, "channel": "#oncall", "base_url": slack.api_url,
         "allowed_addresses": ["127.0.0.1"], "messages_per_s": 50, "message_burst": 50},
        {"name": "pager", "type": "pagerduty", "routing_key": ROUTING_KEY, "events_url": pd.events_url,
         "allowed_addresses": ["127.0.0.1"], "match": {"severity": "critical", "service": ["checkout"]}, "messages_per_s": 50, "message_burst": 50},
    ]})  # fmt: skip


def decide(store: StateStore, *findings: Finding, now: float) -> None:
    store.reconcile(Diagnosis(evaluated_at=AT, findings=list(findings)), cooldown_s=3600, now=now,
                    policy=IncidentPolicy())


@pytest.fixture
def pagerduty() -> PagerDutyFixtureServer:
    server = PagerDutyFixtureServer().start()
    yield server  # type: ignore[misc]
    server.stop()


async def test_each_receiver_gets_its_own_row_by_match_and_one_down_holds_only_its_own(
    tmp_path: Path, slack: SlackFixtureServer, pagerduty: PagerDutyFixtureServer
) -> None:
    configs = receiver_configs(notify(slack, pagerduty), slack=SlackSettings(), webhook_url=None)
    assert [c.type for c in configs] == ["slack", "pagerduty"]
    store = StateStore(tmp_path / "state.sqlite3", routes=routes(configs))
    receivers = build_receivers(configs)
    clock = [1000.0]
    fan_out = FanOut([
        OutboxDelivery(store.outbox_for(r.name), r, DaemonMetrics(), clock=lambda: clock[0]) for r in receivers
    ])  # fmt: skip
    try:
        # A warning about another service: Slack only (the pager wants critical, checkout).
        decide(store, symptom(service="search"), now=1000)
        assert [e.receiver for e in store.pending()] == ["oncall"]
        # A critical cause in checkout: one row each.
        decide(store, symptom(service="search"), cause(), now=1001)
        assert sorted(str(e.receiver) for e in store.pending() if e.kind.value == "new") == [
            "oncall", "oncall", "pager"]  # fmt: skip
        slack.fail()  # Slack is down: its rows wait, PagerDuty's go out
        await fan_out.flush()
        assert [e["event_action"] for e in pagerduty.events] == ["trigger"]
        assert {e.receiver for e in store.pending()} == {"oncall"}
        slack.set_ok()
        clock[0] += 120
        await fan_out.flush()
        assert len(slack.messages) == 2 and store.pending() == []
        # Resolved: each receiver says it where its first message went.
        decide(store, now=1200)
        await fan_out.flush()
        assert [e["event_action"] for e in pagerduty.events] == ["trigger", "resolve"]
        resolutions = [m for m in slack.messages[2:] if m.thread_ts]
        assert {m.thread_ts for m in resolutions} <= {m.ts for m in slack.messages[:2]} and resolutions
    finally:
        store.close()


def test_every_problem_of_the_receivers_is_one_error_naming_each() -> None:
    bad = NotifySettings.model_validate({"receivers": [
        {"name": "a", "type": "pagerdooty", "routing_key": "k"},
        {"name": "b", "type": "pagerduty", "routing_key": "k", "sevrity": "critical"},
        {"name": "c", "type": "webhook", "url": "hooks.example/x"},
    ]})  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        receiver_configs(bad, slack=SlackSettings(), webhook_url=None)
    text = str(caught.value)
    assert "notify.receivers[0] (a): type 'pagerdooty' is not one of pagerduty, slack, webhook" in text
    assert "notify.receivers[1] (b): sevrity" in text
    assert "notify.receivers[2] (c): url" in text and "http://" in text
    with pytest.raises(ValidationError, match="unique"):
        NotifySettings.model_validate({"receivers": [{"name": "a", "type": "slack"}, {"name": "a", "type": "slack"}]})
    with pytest.raises(ValidationError, match="receiver's name"):
        NotifySettings.model_validate({"receivers": [{"name": "On Call", "type": "slack"}]})


def test_the_older_keys_map_onto_one_receiver_and_say_they_are_deprecated() -> None:
    assert set(receiver_types()) >= {"slack", "webhook", "pagerduty"}
    slack = SlackSettings(token=SecretStr("xoxb-1"), channel="#oncall", retry_base_s=0.5, messages_per_s=3)
    url = SecretStr("https://hooks.example/x")
    empty = NotifySettings()
    [config] = receiver_configs(empty, slack=slack, webhook_url=url)  # Slack first, as before
    assert (config.name, config.type, config.messages_per_s) == ("slack", "slack", 3)
    lines = deprecations(empty, slack=slack, webhook_url=url)
    assert any("slack.webhook_url/token/channel are deprecated" in line for line in lines)
    assert any("notify.delivery" in line for line in lines)
    assert delivery_settings(empty, slack=slack).retry_base_s == 0.5
    [hook] = receiver_configs(empty, slack=SlackSettings(messages_per_s=4), webhook_url=url)
    assert (hook.name, hook.type, hook.messages_per_s) == ("webhook", "webhook", 4)
    assert deprecations(empty, slack=SlackSettings(), webhook_url=url) == [
        "daemon.notify_webhook_url is deprecated: use notify.receivers with type: webhook"]  # fmt: skip
    assert receiver_configs(empty, slack=SlackSettings(), webhook_url=None) == []
    explicit = NotifySettings.model_validate({"receivers": [{"name": "x", "type": "webhook", "url": "http://h/x"}]})
    assert [c.name for c in receiver_configs(explicit, slack=slack, webhook_url=url)] == ["x"]
    assert "ignored" in deprecations(explicit, slack=slack, webhook_url=url)[0]


def test_a_config_file_declares_receivers_and_the_delivery(tmp_path: Path) -> None:
    path = tmp_path / "diagnoser.yaml"
    path.write_text(
        "notify:\n"
        "  delivery: {retry_base_s: 1, in_doubt_settle_s: 10}\n"
        "  receivers:\n"
        "    - {name: oncall, type: slack, webhook_url: 'https://hooks.slack.com/services/T/B/x'}\n"
        f"    - {{name: pager, type: pagerduty, routing_key: {ROUTING_KEY}, match: {{severity: critical}}}}\n"
    )
    settings = load_settings(path)
    configs = receiver_configs(settings.notify, slack=settings.slack, webhook_url=None)
    assert [(c.name, c.match.severity) for c in configs] == [("oncall", None), ("pager", "critical")]
    assert delivery_settings(settings.notify, slack=settings.slack).in_doubt_settle_s == 10
    assert ROUTING_KEY not in repr(settings)


def test_rows_an_older_version_queued_go_to_the_first_receiver(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    old = StateStore(path)
    decide(old, cause(), now=1000)
    old.close()
    store = StateStore(path, routes=routes(receiver_configs(
        NotifySettings.model_validate({"receivers": [
            {"name": "first", "type": "webhook", "url": "http://127.0.0.1:9/a", "allowed_addresses": ["127.0.0.1"]},
            {"name": "second", "type": "webhook", "url": "http://127.0.0.1:9/b", "allowed_addresses": ["127.0.0.1"]}]}),
        slack=SlackSettings(), webhook_url=None)))  # fmt: skip
    try:
        assert [e.kind.value for e in store.pending(receiver="first")] == ["new"]
        assert store.pending(receiver="second") == []
    finally:
        store.close()


async def test_the_daemon_fans_out_to_every_configured_receiver(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer,
    pagerduty: PagerDutyFixtureServer, caplog: pytest.LogCaptureFixture,
) -> None:
    base = daemon_settings(tmp_path, live_prometheus.url, "fanout")
    settings = base.model_copy(update={"notify": NotifySettings.model_validate({
        "delivery": {"retry_base_s": 0.2, "retry_max_s": 1.0, "in_doubt_settle_s": 1.5},
        "receivers": [
            {"name": "oncall", "type": "slack", "token": slack.token, "channel": "#oncall",
             "base_url": slack.api_url, "allowed_addresses": ["127.0.0.1"], "timeout_s": 1, "messages_per_s": 10,
             "message_burst": 5},
            {"name": "pager", "type": "pagerduty", "routing_key": ROUTING_KEY, "events_url": pagerduty.events_url,
             "allowed_addresses": ["127.0.0.1"],
             "timeout_s": 1, "match": {"severity": "critical"}},
        ],
    })})  # fmt: skip
    pool_app.set("fanout", "orders", 0.97)
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.messages) >= 1 and len(pagerduty.events) >= 1, what="both receivers")
        assert pagerduty.events[0]["event_action"] == "trigger"
        assert pagerduty.events[0]["payload"]["class"] == "connection_pool_exhaustion"
        pool_app.set("fanout", "orders", 0.2)
        await wait_for(lambda: [e["event_action"] for e in pagerduty.events] == ["trigger", "resolve"],
                       what="the resolve")  # fmt: skip
        await wait_for(lambda: any(m.thread_ts == slack.messages[0].ts for m in slack.messages[1:]),
                       what="Slack's resolution in its thread")  # fmt: skip
    finally:
        await daemon.stop()
        pool_app.set("fanout", "orders", 0.1)
    assert not [r for r in caplog.records if "deprecated configuration" in r.getMessage()]
