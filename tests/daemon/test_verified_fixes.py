"""Verified fixes, through the real daemon: a resolved incident gets a confirm probe, told in its thread.

Three services, each its own scrape job of a live Prometheus: each serves its request count as
OpenTelemetry's HTTP histogram (stamped with its own sample times, so the rate Prometheus
computes is the one set), its pool at 97 % and its p99 at 2.4 s while sick. Each one's target is
said the ways capacity on record says it: ``fix-fast`` by a probe file's ``service:`` (the delay
server answering in a millisecond), ``fix-slow`` by its capacity on record (the delay server
answering after 1.5 s), ``fix-refused`` by a probe file whose host is not in
``probe.allowed_hosts``. When they recover, the leader probes each resolved incident at the rate
Prometheus read during it, within ``probe.max_rate`` (30 req/s here: ``fix-fast`` served 40);
the SLO is a second, which a millisecond route holds and a 1.5 s one never does, however busy
the machine. The refused target is never sent a request and its thread gets no verdict.
"""

from __future__ import annotations

import html
import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from diagnoser.config import NotifySettings, SlackSettings
from diagnoser.daemon import Daemon
from diagnoser.daemon.capacity_record import CapacityRun
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.daemon.state import StateStore
from diagnoser.notify.delivery import FanOut, OutboxDelivery
from diagnoser.notify.payloads import IncidentPayload, NotificationKind
from diagnoser.notify.receivers import build_receivers, receiver_configs, routes
from diagnoser.probe.confirm import Confirmation
from tests.conftest import live_bed
from tests.daemon.conftest import LivePrometheus, daemon_settings, scraped_services, wait_for
from tests.daemon.test_incident_state import cause
from tests.daemon.test_incidents import resolutions
from tests.daemon.test_receivers import decide
from tests.fixtures.background_http import BackgroundHTTPServer
from tests.fixtures.pagerduty_server import ROUTING_KEY, PagerDutyFixtureServer
from tests.fixtures.slack_server import PostedMessage, SlackFixtureServer
from tests.probe.conftest import DelayServer
from tests.probe.conftest import delay_server as delay_server  # the fixture, shared

pytestmark = [pytest.mark.integration, live_bed]

RATES = {"fix-fast": 40.0, "fix-slow": 10.0, "fix-refused": 5.0}
WINDOW = "5s"


@dataclass(eq=False)  # registered by identity
class SickService(Collector):
    """One scraped service: requests at a set rate, and a pool and a p99 that recover on ``heal()``."""

    service: str
    rate: float
    sick: bool = True
    started: float = field(default_factory=time.time)

    def heal(self) -> None:
        self.sick = False

    def collect(self) -> Iterable[HistogramMetricFamily | GaugeMetricFamily]:
        requests = HistogramMetricFamily(
            "http_server_request_duration_seconds", "Duration of HTTP server requests.", labels=["http_route"]
        )
        now = time.time()
        count = self.rate * (now - self.started)
        requests.add_metric(["/v1/quote"], [("0.1", count), ("+Inf", count)], count * 0.02, timestamp=now)
        pool = GaugeMetricFamily(
            "shop_pool_used_ratio", "Share of the pool's connections in use.", labels=["namespace", "service", "pool"]
        )
        pool.add_metric(["shop", self.service, "orders-db"], 0.97 if self.sick else 0.2)
        p99 = GaugeMetricFamily("shop_request_p99_seconds", "The service's p99.", labels=["namespace", "service"])
        p99.add_metric(["shop", self.service], 2.4 if self.sick else 0.1)
        yield from (requests, pool, p99)


@dataclass
class Bed:
    prometheus: LivePrometheus
    services: dict[str, SickService]


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    services = {name: SickService(name, rate) for name, rate in RATES.items()}
    with scraped_services(services, RATES, WINDOW) as live:
        yield Bed(live, services)


class CountingHandler(BaseHTTPRequestHandler):
    """Keeps the path of every request it answers: the refused target must see none."""

    protocol_version = "HTTP/1.0"
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        CountingHandler.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        return


def _probe_file(path: Path, target: str, service: str) -> Path:
    # The probe job runs it once at start: a gentle schedule of its own.
    path.write_text(
        f"target: {target}\nservice: {service}\nnamespace: shop\nschedule: {{rate: 1, duration_s: 0.5}}\n",
        encoding="utf-8",
    )
    return path


def _said(message: PostedMessage) -> str:
    texts = [b["text"]["text"] for b in message.blocks if b.get("type") == "section"]
    return html.unescape("\n".join(texts))


async def test_a_resolved_incident_is_confirmed_or_not_in_its_thread_and_a_refused_target_is_never_sent(
    tmp_path: Path, bed: Bed, slack: SlackFixtureServer, delay_server: DelayServer,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="diagnoser.daemon.verify")
    refused_server = BackgroundHTTPServer(CountingHandler, name="verify-refused").start()
    state = tmp_path / "state.sqlite3"
    store = StateStore(state)
    store.record_capacity(CapacityRun(
        target=f"{delay_server.url}/delay?ms=1500", capacity_rps=50.0, slo_p99_ms=1000.0, slo_error_ratio=0.01,
        limit="latency", measured_at=time.time() - 3600, service="fix-slow", namespace="shop",
    ))  # fmt: skip
    store.close()
    files = [
        _probe_file(tmp_path / "fast.yaml", f"{delay_server.url}/delay?ms=1", "fix-fast"),
        _probe_file(tmp_path / "elsewhere.yaml", f"http://localhost:{refused_server.port}/quote", "fix-refused"),
    ]
    settings = daemon_settings(
        tmp_path, bed.prometheus.url, "|".join(RATES), slack=slack, state=state, symptom=True,
        diagnose_interval_s=1.0, probe_files=[str(f) for f in files],
    )  # fmt: skip
    settings = settings.model_copy(update={
        "window": WINDOW,
        "slo": settings.slo.model_copy(update={"p99_ms": 1000.0, "error_ratio": 0.01}),
        "probe": settings.probe.model_copy(update={"allowed_hosts": ["127.0.0.1"], "max_rate": 30.0}),
        "verify": settings.verify.model_copy(update={"enabled": True, "duration_s": 1.0}),
    })  # fmt: skip
    daemon = Daemon(settings)
    await daemon.start()
    try:
        def posted() -> dict[str, PostedMessage]:
            return {s: m for m in slack.top_level() for s in RATES if f"shop/{s} pool" in m.text}

        await wait_for(lambda: len(posted()) == 3, 20, "three incidents posted")
        threads = {service: message.ts for service, message in posted().items()}
        for service in bed.services.values():
            service.heal()
        await wait_for(lambda: all(resolutions(slack, ts) for ts in threads.values()), 20, "three resolutions")

        def verdict(service: str) -> list[PostedMessage]:
            return [m for m in slack.replies(threads[service]) if m.text.startswith(("p99 at", "not confirmed"))]

        await wait_for(lambda: bool(verdict("fix-fast") and verdict("fix-slow")), 30, "two verdicts")
        (fast,) = verdict("fix-fast")
        assert re.fullmatch(
            r"p99 at 30 req/s \(capped from (39\.\d|40(\.\d)?) by probe\.max_rate\): 2\.4 s -> [\d.]+ ms, confirmed",
            html.unescape(fast.text).split(": RESOLVED")[0],
        ), fast.text
        assert fast.text.endswith(": RESOLVED: connection_pool_exhaustion: Pool orders-db saturated")
        assert f"confirm probe of {delay_server.url}/delay?ms=1: 30 requests over" in _said(fast)
        (slow,) = verdict("fix-slow")
        assert re.fullmatch(
            r"not confirmed: p99 still [\d.]+ s at (9\.\d|10(\.\d)?) req/s \(SLO 1 s; 2\.4 s before\)",
            html.unescape(slow.text).split(": RESOLVED")[0],
        ), slow.text
        # The verdict is a reply: the resolved message itself is not edited again.
        assert not [m for m in slack.messages if m.via == "update" and "confirmed" in m.text]

        def refusals() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "diagnoser.daemon.verify" and "refused" in r.getMessage()]

        await wait_for(lambda: bool(refusals()), 10, "the refused confirm probe logged")
        refusal = refusals()
        assert refusal[0].levelno == logging.WARNING
        assert "host 'localhost' is not in probe.allowed_hosts" in refusal[0].getMessage()
        assert not verdict("fix-refused")
        metric = daemon.metrics.confirm_probes
        assert [metric.labels(o)._value.get() for o in ("confirmed", "not_confirmed", "refused")] == [1, 1, 1]
    finally:
        await daemon.stop()
        refused_server.stop()
    assert CountingHandler.paths == []


async def test_the_verdict_is_a_thread_reply_in_slack_a_message_of_its_own_to_a_webhook_and_nothing_to_pagerduty(
    tmp_path: Path, slack: SlackFixtureServer
) -> None:
    """Each receiver's renderer takes the ``verified`` entry as its kind of service can show it."""
    pagerduty = PagerDutyFixtureServer().start()
    limits = {"allowed_addresses": ["127.0.0.1"], "messages_per_s": 50, "message_burst": 50}
    settings = NotifySettings.model_validate({"receivers": [
        {"name": "oncall", "type": "slack", "token": slack.token, "channel": "#oncall", "base_url": slack.api_url,
         **limits},
        {"name": "bridge", "type": "webhook", "url": slack.webhook_url, **limits},
        {"name": "pager", "type": "pagerduty", "routing_key": ROUTING_KEY, "events_url": pagerduty.events_url,
         **limits},
    ]})  # fmt: skip
    configs = receiver_configs(settings, slack=SlackSettings(), webhook_url=None)
    store = StateStore(tmp_path / "state.sqlite3", routes=routes(configs))
    fan_out = FanOut([OutboxDelivery(store.outbox_for(r.name), r, DaemonMetrics()) for r in build_receivers(configs)])
    try:
        decide(store, cause(), now=1000)
        await fan_out.flush()
        decide(store, now=1100)
        (resolved, *_) = [e for e in store.pending() if e.kind is NotificationKind.resolved]
        await fan_out.flush()
        assert isinstance(resolved.payload, IncidentPayload) and resolved.incident_id is not None
        found = Confirmation(
            target="http://checkout.shop.svc:8080/v1/quote", rate=95.0, requested_rate=95.0, duration_s=10.0,
            sent=950, finished=950, achieved_rate=95.0, p99_ms=140.0, error_ratio=0.0, slo_p99_ms=300.0,
            slo_error_ratio=0.01, before_p99_ms=2400.0, confirmed=True,
        )  # fmt: skip
        payload = IncidentPayload(view=resolved.payload.view, note=found.text(), confirmation=found)
        store.enqueue(NotificationKind.verified, payload, resolved.payload.view.lead.identity,
                      incident_id=resolved.incident_id)  # fmt: skip
        before = (len(slack.messages), len(pagerduty.events))
        await fan_out.flush()
        assert store.pending() == []
        said = slack.messages[before[0]:]
        line = "p99 at 95 req/s: 2.4 s -> 140 ms, confirmed"
        (api,) = [m for m in said if m.via == "api"]
        first = next(m for m in slack.messages if m.via == "api")
        assert api.thread_ts == first.ts and html.unescape(api.text).startswith(line)
        assert "confirm probe of http://checkout.shop.svc:8080/v1/quote: 950 requests over 10 s" in _said(api)
        (hook,) = [m for m in said if m.via == "webhook"]
        assert hook.thread_ts is None and html.unescape(hook.text).startswith(line)
        assert not [m for m in said if m.via == "update"]  # a reply only: no receiver edits its message
        assert len(pagerduty.events) == before[1]
    finally:
        store.close()
        pagerduty.stop()
