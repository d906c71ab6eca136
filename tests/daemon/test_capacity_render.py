"""The headroom line through every receiver's pure renderer, from incidents the state store decides.

The store reconciles findings with a :class:`~diagnoser.daemon.capacity_record.CapacityBook` (the
capacity on record and the load read now, as the daemon builds it each diagnosis); the queued
entries render through Slack's, the JSON webhook's and PagerDuty's renderers.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from diagnoser.daemon.capacity_record import CapacityBook, CapacityRun
from diagnoser.daemon.incidents import IncidentPolicy
from diagnoser.daemon.state import StateStore
from diagnoser.models import Diagnosis
from diagnoser.notify.outbox import OutboxEntry, render_entry
from diagnoser.notify.receivers.pagerduty import render_event
from diagnoser.notify.receivers.webhook import render_webhook
from tests.daemon.test_incident_state import cause, symptom

AT = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
MEASURED = datetime(2026, 12, 1, 14, 2, tzinfo=UTC).timestamp()
RUN = CapacityRun(
    target="http://checkout.shop.svc:8080/v1/quote", capacity_rps=520.0, slo_p99_ms=300.0,
    slo_error_ratio=0.001, limit="latency", measured_at=MEASURED, service="checkout", namespace="shop",
)  # fmt: skip
UNDER = "checkout at 410 req/s now; capacity 520 req/s at p99 <= 300 ms, measured 2026-12-01 14:02 UTC; headroom 21 %"
OVER = (
    "checkout over capacity: 610 req/s now against 520 req/s measured 2026-12-01 14:02 UTC at p99 <= 300 ms"
    " (17 % over)"
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore(tmp_path / "state.sqlite3")
    yield state
    state.close()


def decide(store: StateStore, book: CapacityBook | None, *, now: float = 1000.0) -> OutboxEntry:
    diagnosis = Diagnosis(evaluated_at=AT, findings=[cause(), symptom()])
    [entry] = store.reconcile(diagnosis, cooldown_s=3600, now=now, policy=IncidentPolicy(), capacity=book)
    return entry


def book(rps: float | None, *runs: CapacityRun) -> CapacityBook:
    loads = {} if rps is None else {("shop", "checkout"): rps}
    return CapacityBook(runs or (RUN,), loads, now=AT.timestamp(), max_age_s=30 * 86400)


def slack_lines(entry: OutboxEntry) -> list[str]:
    message = render_entry(entry)
    assert message is not None
    sections = [b["text"]["text"] for b in message.blocks if b.get("type") == "section"]
    return html.unescape(sections[0]).splitlines()


def test_the_headroom_line_follows_the_evidence_in_every_receiver(store: StateStore) -> None:
    entry = decide(store, book(410.3))
    lines = slack_lines(entry)
    assert lines[-1] == UNDER and lines[0].startswith(":red_circle: pool orders"), lines
    webhook = render_webhook(entry)
    assert webhook is not None and UNDER in html.unescape(str(webhook.blocks))
    event = render_event(entry)
    assert event is not None
    assert event.custom_details["capacity"] == UNDER
    assert event.summary.startswith("Pool orders exhausted")


def test_over_capacity_is_said_first_in_every_receiver(store: StateStore) -> None:
    entry = decide(store, book(610.0))
    assert slack_lines(entry)[0] == f"*{OVER}*"
    message = render_entry(entry)
    assert message is not None and OVER in html.unescape(message.text)
    webhook = render_webhook(entry)
    assert webhook is not None and OVER in html.unescape(webhook.text)
    event = render_event(entry)
    assert event is not None and event.summary.startswith(OVER)


@pytest.mark.parametrize(
    "runs",
    [
        (),  # nothing on record
        ({"measured_at": AT.timestamp() - 31 * 86400},),  # older than capacity.record_max_age_days
        ({"service": "payments"},),  # another service's
        ({"namespace": "staging"},),  # checkout's in another namespace
        ({"limit": "aborted"},),  # an interrupted run: kept, not a capacity
    ],
)
def test_without_a_capacity_on_record_nothing_is_said_of_capacity(
    store: StateStore, runs: tuple[dict[str, object], ...]
) -> None:
    capacity = book(410.0, *(replace(RUN, **change) for change in runs)) if runs else None  # type: ignore[arg-type]
    entry = decide(store, capacity)
    assert not any("req/s" in line for line in slack_lines(entry))
    event = render_event(entry)
    assert event is not None and "capacity" not in event.custom_details


def test_a_load_that_cannot_be_read_is_said_so(store: StateStore) -> None:
    line = slack_lines(decide(store, book(None)))[-1]
    assert line == (
        "checkout capacity 520 req/s at p99 <= 300 ms, measured 2026-12-01 14:02 UTC; the load now could not be read"
    )


def test_a_run_whose_every_step_held_is_a_lower_bound(store: StateStore) -> None:
    bound = replace(RUN, limit="max_rate")
    line = slack_lines(decide(store, book(410.0, bound)))[-1]
    assert "capacity at least 520 req/s" in line and "headroom at least 21 %" in line, line
