"""The PagerDuty receiver: its Events v2 rendering (a snapshot) and delivery to a local endpoint
speaking PagerDuty's documented wire format (:mod:`tests.fixtures.pagerduty_server`).

The state store decides with a clock the test sets; the outbox delivery sends through the real
receiver over HTTP; the endpoint keeps alerts by dedup_key as PagerDuty does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from diagnoser.config import Route
from diagnoser.daemon.incidents import IncidentPolicy
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.daemon.state import StateStore
from diagnoser.models import Diagnosis, Finding
from diagnoser.notify.delivery import OutboxDelivery
from diagnoser.notify.outbox import NotificationKind
from diagnoser.notify.receivers import build_receivers, receiver_configs
from diagnoser.notify.receivers.pagerduty import PagerDutyConfig, PagerDutyReceiver, render_event
from tests.daemon.test_incident_state import cause, symptom
from tests.fixtures.pagerduty_server import ROUTING_KEY, PagerDutyFixtureServer

AT = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
POLICY = IncidentPolicy()
SNAPSHOT = Path(__file__).parent / "snapshots" / "pagerduty" / "trigger.json"


@pytest.fixture
def pagerduty() -> Iterator[PagerDutyFixtureServer]:
    server = PagerDutyFixtureServer().start()
    yield server
    server.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore(tmp_path / "state.sqlite3", routes=[Route(name="pager")])
    yield state
    state.close()


def receiver(pd: PagerDutyFixtureServer, **extra: object) -> PagerDutyReceiver:
    config = PagerDutyConfig.model_validate(
        {"name": "pager", "type": "pagerduty", "routing_key": ROUTING_KEY, "events_url": pd.events_url,
         "allowed_addresses": ["127.0.0.1"], "messages_per_s": 50, "message_burst": 50, **extra}
    )
    return PagerDutyReceiver(config)


def delivery(store: StateStore, pd: PagerDutyReceiver, clock: list[float]) -> OutboxDelivery:
    return OutboxDelivery(store.outbox_for("pager"), pd, DaemonMetrics(), clock=lambda: clock[0])


def decide(store: StateStore, *findings: Finding, now: float) -> None:
    store.reconcile(Diagnosis(evaluated_at=AT, findings=list(findings)), cooldown_s=3600, now=now, policy=POLICY)


def test_a_trigger_renders_as_its_snapshot(store: StateStore) -> None:
    decide(store, cause(), symptom(), now=1000)
    [entry] = store.pending()
    event = render_event(entry)
    assert event is not None
    body = event.body(routing_key="<routing key>", source="diagnoser")
    assert body == json.loads(SNAPSHOT.read_text())


async def test_an_incident_is_one_alert_triggered_then_resolved_by_its_dedup_key(
    store: StateStore, pagerduty: PagerDutyFixtureServer
) -> None:
    clock = [1000.0]
    out = delivery(store, receiver(pagerduty), clock)
    decide(store, cause(), symptom(), now=1000)
    await out.flush()
    decide(store, cause(value=0.99), symptom(), now=1010)  # a number moved: an edit, nothing for PagerDuty
    await out.flush()
    decide(store, now=1020)
    await out.flush()
    assert [e["event_action"] for e in pagerduty.events] == ["trigger", "resolve"]
    key = pagerduty.events[0]["dedup_key"]
    assert pagerduty.events[1]["dedup_key"] == key
    assert pagerduty.opened == [key] and pagerduty.alerts[key].status == "resolved"
    assert pagerduty.alerts[key].severity == "critical"
    assert store.pending() == [] and store.dead_letters() == []


async def test_a_trigger_sent_again_after_a_5xx_is_folded_into_one_alert(
    store: StateStore, pagerduty: PagerDutyFixtureServer
) -> None:
    clock = [1000.0]
    out = delivery(store, receiver(pagerduty), clock)
    decide(store, cause(), now=1000)
    pagerduty.fail(500, processed=True)  # PagerDuty took it, its answer says otherwise
    await out.flush()
    [waiting] = store.pending()
    assert waiting.in_doubt and "HTTP 500" in str(waiting.last_error)
    clock[0] += 120  # past the settle time: PagerDuty cannot be read back, so it is sent again
    await out.flush()
    assert store.pending() == []
    # Two triggers reached PagerDuty; the dedup_key keeps them one alert.
    assert [e["event_action"] for e in pagerduty.events] == ["trigger", "trigger"]
    key = pagerduty.events[0]["dedup_key"]
    assert pagerduty.opened == [key] and pagerduty.alerts[key].triggers == 2


async def test_a_proxy_refusing_credentials_is_retried_with_backoff_not_dead_lettered(
    store: StateStore, pagerduty: PagerDutyFixtureServer
) -> None:
    clock = [1000.0]
    out = delivery(store, receiver(pagerduty), clock)
    decide(store, cause(), now=1000)
    pagerduty.fail(403)  # an egress proxy whose credentials are being rotated
    await out.flush()
    [waiting] = store.pending()
    assert "HTTP 403" in str(waiting.last_error) and store.dead_letters() == []
    clock[0] += 5  # past the first backoff
    await out.flush()
    assert store.pending() == [] and len(pagerduty.opened) == 1


async def test_an_invalid_event_is_dead_lettered_and_the_queue_goes_on(
    store: StateStore, pagerduty: PagerDutyFixtureServer
) -> None:
    clock = [1000.0]
    wrong = receiver(pagerduty, routing_key="R0" + "X" * 30)
    decide(store, cause(), now=1000)
    await delivery(store, wrong, clock).flush()
    [(_, kind, error)] = store.dead_letters()
    assert kind == "new" and "HTTP 400" in error and "routing_key" in error
    assert store.pending() == []


async def test_digests_and_reminders_are_not_sent_to_pagerduty(
    store: StateStore, pagerduty: PagerDutyFixtureServer
) -> None:
    many = [cause(pool=f"p{i}", service=f"s{i}") for i in range(7)]  # over the digest threshold
    decide(store, *many, now=1000)
    kinds = [e.kind for e in store.pending()]
    assert NotificationKind.digest in kinds
    await delivery(store, receiver(pagerduty), [1000.0]).flush()
    assert [e["event_action"] for e in pagerduty.events] == ["trigger"] * 7
    assert store.pending() == []


def test_receiver_configs_read_a_pagerduty_entry_and_hide_its_key() -> None:
    from diagnoser.config import NotifySettings, SlackSettings

    notify = NotifySettings.model_validate(
        {"receivers": [{"name": "pager", "type": "pagerduty", "routing_key": ROUTING_KEY,
                        "match": {"severity": "critical"}}]}
    )
    assert ROUTING_KEY not in repr(notify)
    [config] = receiver_configs(notify, slack=SlackSettings(), webhook_url=None)
    assert isinstance(config, PagerDutyConfig) and config.match.severity == "critical"
    [built] = build_receivers([config])
    assert isinstance(built, PagerDutyReceiver) and built.target.startswith("PagerDuty events at https://")
