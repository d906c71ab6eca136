"""Capacity on record, through the real daemon, a live Prometheus and the Slack fixture.

Each test service is its own scrape job (its ``service`` in the catalogue's terms) serving its
request count as a real histogram's ``_count`` (``http_server_request_duration_seconds``,
OpenTelemetry's HTTP convention), stamped with its own sample times so the rate Prometheus computes
is the one set, and its pool's usage at 97 %. Capacity runs are kept in
the state file as ``diagnose capacity --state`` keeps them; the incidents about a service with a
capacity on record say the load now against it (the over-capacity wording first), the others say
nothing of capacity; ``/metrics`` exports the capacity on record, read from the state file at
each scrape. ``diagnose capacity --state`` itself records a run of a local server, and a state
file from before the table opens and takes runs.
"""

from __future__ import annotations

import asyncio
import html
import shutil
import sqlite3
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from diagnoser.cli.capacity_record import RecordFlags
from diagnoser.config.sections import ScheduledCapacityRun
from diagnoser.daemon import Daemon
from diagnoser.daemon.capacity_record import CapacityRun
from diagnoser.daemon.state import StateStore
from tests.conftest import run_cli
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, scraped_services, wait_for
from tests.daemon.test_incidents import header
from tests.fixtures.background_http import BackgroundHTTPServer
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration

#: Requests per second each test service serves.
RATES = {"cap-under": 410.0, "cap-over": 610.0, "cap-none": 300.0, "cap-stale": 200.0}
#: The rules' window in these tests: short, so the rate holds whole scrapes of the series.
WINDOW = "5s"
UPGRADE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "state_upgrade"


class ShopService(Collector):
    """One scraped service: its requests as ``http_server_request_duration_seconds`` (its count
    growing at a set rate) and its database pool's usage, ``shop_pool_used_ratio``.

    Each request sample carries the instant it was computed for, so Prometheus' rate over it is
    the rate set, whenever the scrape happens to run on a busy machine.
    """

    def __init__(self, service: str, rate: float) -> None:
        self.service = service
        self.rate = rate
        self.started = time.time()

    def collect(self) -> Iterable[HistogramMetricFamily | GaugeMetricFamily]:
        requests = HistogramMetricFamily(
            "http_server_request_duration_seconds", "Duration of HTTP server requests.", labels=["http_route"]
        )
        now = time.time()
        count = self.rate * (now - self.started)
        requests.add_metric(["/v1/quote"], [("0.1", count), ("+Inf", count)], count * 0.02, timestamp=now)
        pool = GaugeMetricFamily(
            "shop_pool_used_ratio",
            "Share of the pool's connections in use.",
            labels=["namespace", "service", "pool"],
        )
        pool.add_metric(["shop", self.service, "orders-db"], 0.97)
        yield from (requests, pool)


@dataclass
class Shop:
    """The services, each scraped as its own job (its ``service`` in the catalogue's terms)."""

    prometheus: LivePrometheus


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    collectors = {service: ShopService(service, rate) for service, rate in RATES.items()}
    with scraped_services(collectors, RATES, WINDOW) as live:
        yield Shop(live)


def section_text(body: dict[str, Any]) -> str:
    """What the message's sections say, as Slack shows it (its escapes undone)."""
    texts = [b["text"]["text"] for b in body.get("blocks", []) if b.get("type") == "section"]
    return html.unescape("\n".join(texts))


def capacity(service: str, rps: float, measured_at: float, **more: Any) -> CapacityRun:
    values: dict[str, Any] = {
        "target": f"http://{service}.shop.svc:8080/v1/quote",
        "capacity_rps": rps,
        "slo_p99_ms": 300.0,
        "slo_error_ratio": 0.001,
        "limit": "latency",
        "measured_at": measured_at,
        "service": service,
        "namespace": "shop",
        "bottleneck_cause": "connection_pool_exhaustion",
    }
    values.update(more)
    return CapacityRun(**values)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("diagnoser_capacity")
        for sample in family.samples
    }


async def test_incidents_say_the_load_against_the_capacity_on_record(
    tmp_path: Path, shop: Shop, slack: SlackFixtureServer
) -> None:
    measured = time.time() - 2 * 86400
    state = tmp_path / "state.sqlite3"
    store = StateStore(state)
    # An older, higher capacity of cap-under: the newest run of a target is its capacity on record.
    store.record_capacity(capacity("cap-under", 900.0, measured - 86400))
    store.record_capacity(capacity("cap-under", 520.0, measured))
    # An interrupted run after it is kept, and is no capacity.
    store.record_capacity(capacity("cap-under", 80.0, measured + 60, limit="aborted"))
    store.record_capacity(capacity("cap-over", 520.0, measured))
    store.record_capacity(capacity("cap-stale", 520.0, time.time() - 40 * 86400))  # older than 30 days
    store.close()
    services = "|".join(RATES)
    settings = daemon_settings(tmp_path, shop.prometheus.url, services, slack=slack, state=state)
    settings = settings.model_copy(update={"window": WINDOW})
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(lambda: len(slack.top_level()) >= 4, 20, "four incidents posted")
        posted = {
            service: m for m in slack.top_level() for service in RATES if f"shop/{service} pool" in m.text
        }
        assert all(header(m.body).startswith("CRITICAL: connection_pool_exhaustion") for m in posted.values())
        date = datetime.fromtimestamp(measured, UTC).strftime("%Y-%m-%d %H:%M UTC")

        under = section_text(posted["cap-under"].body)
        line = (
            f"cap-under at 410 req/s now; capacity 520 req/s at p99 <= 300 ms, measured {date}; headroom 21 %"
        )
        assert line in under.splitlines(), under
        # The headroom line comes after the evidence, not before the summary.
        assert not under.startswith("*cap-under"), under

        over = section_text(posted["cap-over"].body)
        first = over.splitlines()[0]
        assert first == (
            f"*cap-over over capacity: 610 req/s now against 520 req/s measured {date} at p99 <= 300 ms"
            " (17 % over)*"
        ), over
        assert "over capacity: 610 req/s now" in posted["cap-over"].text

        for service in ("cap-none", "cap-stale"):  # no capacity on record, or one too old to show
            text = section_text(posted[service].body)
            assert "req/s" not in text and "capacity" not in text, text

        port = daemon.http_port
        assert port is not None
        exported = await asyncio.to_thread(scrape, port)  # the daemon serves on this loop
        under_target = (("target", "http://cap-under.shop.svc:8080/v1/quote"),)
        assert exported[("diagnoser_capacity_rps", (("service", "cap-under"), *under_target))] == 520.0
        assert exported[("diagnoser_capacity_slo_p99_seconds", under_target)] == 0.3
        assert exported[("diagnoser_capacity_measured_timestamp_seconds", under_target)] == measured
        # The stale one is still exported: its timestamp says how old it is.
        stale = (("target", "http://cap-stale.shop.svc:8080/v1/quote"),)
        assert ("diagnoser_capacity_measured_timestamp_seconds", stale) in exported
        assert not any(labels == (("service", "cap-none"),) for _, labels in exported)

        # A run recorded while the daemon runs (diagnose capacity --state) is exported at once.
        recorder = StateStore(state)
        recorder.record_capacity(capacity("cap-under", 480.0, time.time()))
        recorder.close()
        assert (await asyncio.to_thread(scrape, port))[
            ("diagnoser_capacity_rps", (("service", "cap-under"), *under_target))
        ] == 480.0
    finally:
        await daemon.stop()


QUOTE = b'{"price": 12.5}'


class QuickHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(QUOTE)))
        self.end_headers()
        self.wfile.write(QUOTE)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_diagnose_capacity_records_each_run_in_the_state_file(tmp_path: Path) -> None:
    server = BackgroundHTTPServer(QuickHandler, name="capacity-record").start()
    try:
        probe = tmp_path / "quote.yaml"
        probe.write_text(
            f"target: {server.url}/v1/quote\nservice: checkout\nnamespace: shop\n"
            "schedule: {rate: 1, duration_s: 1}\n",
            encoding="utf-8",
        )
        config = tmp_path / "diagnoser.yaml"
        config.write_text("probe:\n  allowed_hosts: [127.0.0.1]\n", encoding="utf-8")
        state = tmp_path / "state.sqlite3"
        result = run_cli(
            "capacity", str(probe), "--config", str(config), "--slo-p99-ms", "300", "--steps", "20,40",
            "--step-s", "1", "--warmup-s", "0", "--pause-s", "0", "--workers", "1", "--state", str(state),
            timeout=60,
        )  # fmt: skip
        assert result.code == 0, result.stdout + result.stderr
        assert f"recorded in {state}: capacity on record for shop/checkout" in " ".join(result.stderr.split())
        store = StateStore(state)
        try:
            (run,) = store.capacities_on_record()
        finally:
            store.close()
        assert (run.target, run.service, run.namespace) == (f"{server.url}/v1/quote", "checkout", "shop")
        assert (run.capacity_rps, run.limit, run.slo_p99_ms) == (40.0, "max_rate", 300.0)
    finally:
        server.stop()


def test_a_state_file_from_before_capacity_runs_opens_and_keeps_them(tmp_path: Path) -> None:
    # The newest release's fixture, and a file of the current schema without the table.
    older = tmp_path / "older.sqlite3"
    shutil.copyfile(UPGRADE_FIXTURES / "b1c9bac.sqlite3", older)
    current = tmp_path / "current.sqlite3"
    StateStore(current).close()
    with sqlite3.connect(current) as db:
        db.execute("DROP TABLE capacity_runs")
    for path in (older, current):
        store = StateStore(path)
        try:
            assert store.capacities_on_record() == []
            store.record_capacity(capacity("checkout", 520.0, 1_764_597_720.0))
            assert [r.capacity_rps for r in store.capacities_on_record()] == [520.0]
        finally:
            store.close()



def test_a_run_is_recorded_only_where_a_state_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIAGNOSER_DAEMON__STATE_PATH", raising=False)
    caps = tmp_path / "caps.yaml"
    caps.write_text("capacity:\n  max_rate: 500\n", encoding="utf-8")
    daemon = tmp_path / "daemon.yaml"
    daemon.write_text(f"daemon:\n  state_path: {tmp_path / 'kept.sqlite3'}\n", encoding="utf-8")
    # The default state path names no file anyone keeps: without a state named, nothing is written.
    assert RecordFlags().state_path(None) is None
    assert RecordFlags().state_path(caps) is None
    assert RecordFlags().state_path(daemon) == tmp_path / "kept.sqlite3"
    assert RecordFlags(state=tmp_path / "flag.sqlite3").state_path(daemon) == tmp_path / "flag.sqlite3"
    monkeypatch.setenv("DIAGNOSER_DAEMON__STATE_PATH", str(tmp_path / "env.sqlite3"))
    assert RecordFlags().state_path(caps) == tmp_path / "env.sqlite3"


class CountingHandler(QuickHandler):
    """Keeps the path of every request it answers."""

    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        CountingHandler.paths.append(self.path)
        super().do_GET()


async def test_a_scheduled_capacity_run_is_recorded_and_exported(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, caplog: pytest.LogCaptureFixture
) -> None:
    server = BackgroundHTTPServer(CountingHandler, name="capacity-schedule").start()
    try:
        allowed = f"{server.url}/v1/quote"
        # The same server under a name that is not in probe.allowed_hosts: never sent to.
        refused = f"http://localhost:{server.port}/refused"
        quick = {"every_s": 1, "steps": [20, 40], "step_s": 1, "warmup_s": 0, "pause_s": 0, "slo_p99_ms": 300}
        schedule = [
            ScheduledCapacityRun(target=allowed, service="checkout", namespace="shop", **quick),
            ScheduledCapacityRun(target=refused, service="checkout", **quick),
            ScheduledCapacityRun(target=allowed, max_rate=10**6),  # over capacity.max_rate: refused at start
        ]
        settings = daemon_settings(tmp_path, live_prometheus.url, "sched-none")
        settings = settings.model_copy(
            update={
                "capacity": settings.capacity.model_copy(update={"schedule": schedule}),
                "probe": settings.probe.model_copy(update={"allowed_hosts": ["127.0.0.1"]}),
            }
        )
        daemon = Daemon(settings)
        await daemon.start()
        try:
            assert len(daemon.capacity_jobs) == 2
            state = daemon.state
            assert state is not None
            await wait_for(lambda: bool(state.capacities_on_record()), 30, "a scheduled run recorded")
            (run,) = state.capacities_on_record()
            assert (run.target, run.service, run.namespace, run.capacity_rps) == (allowed, "checkout", "shop", 40.0)
            port = daemon.http_port
            assert port is not None
            exported = await asyncio.to_thread(scrape, port)
            assert exported[("diagnoser_capacity_rps", (("service", "checkout"), ("target", allowed)))] == 40.0
        finally:
            await daemon.stop()
        assert not any(path.startswith("/refused") for path in CountingHandler.paths)
        said = [r.getMessage() for r in caplog.records if r.name == "diagnoser.daemon.capacity_schedule"]
        assert any("localhost" in line and "allowed_hosts" in line for line in said), said
        assert any("capacity run not scheduled" in r.getMessage() for r in caplog.records)
        assert all(r.target == allowed for r in StateStore(tmp_path / "state.sqlite3").capacity_runs())
    finally:
        server.stop()
