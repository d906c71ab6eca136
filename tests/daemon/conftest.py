"""Fixtures for the daemon tests: a live-scraped Prometheus, an app whose gauges the test sets, Slack.

One real Prometheus per session scrapes, every second, a prometheus-client app exposing
``shop_pool_used_ratio{namespace, service, pool}`` (what a connection-pool incident looks like) and
the port reserved for the daemon under test's own ``/metrics``. Each test uses its own ``service``
label (``job`` is Prometheus' own target label) and a rule restricted to it, so tests do not see each other's incidents.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from prometheus_client import CollectorRegistry, Gauge, start_http_server  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

from diagnoser.config import Settings, load_settings  # noqa: E402
from diagnoser.testing.processes import free_port  # noqa: E402
from diagnoser.testing.prometheus import LocalPrometheus  # noqa: E402
from tests.fixtures.slack_server import SlackFixtureServer  # noqa: E402

RULE = """\
cause: connection_pool_exhaustion
kind: cause
severity: {severity}
title: "Pool {{pool}} saturated"
summary: "{{namespace}}/{{service}} pool {{pool}}: {{value:.0%}} of connections in use (threshold {{threshold:.0%}})"
explains: [latency_slo_breach]
when:
  - promql:
      query: max by (namespace, service, pool) (shop_pool_used_ratio{{service=~"{job}"}})
      op: ">="
      threshold: 0.9
recommendation: "Raise pool {{pool}} of {{service}} or cut the time each request holds a connection."
"""

RUNBOOK = """\
# Pool saturated (test rule)

## Meaning
Every connection of the pool is in use.

## Impact
Requests wait for a connection.

## Diagnosis
Query `shop_pool_used_ratio`.

## Mitigation
Raise the pool.

## Verify
The ratio drops under 0.9.
"""


SYMPTOM_RULE = """\
cause: latency_slo_breach
kind: symptom
severity: warning
title: "p99 over SLO on {{service}}"
summary: "{{namespace}}/{{service}}: p99 {{value:.3g}} s, over the 0.25 s SLO"
when:
  - promql:
      query: max by (namespace, service) (shop_request_p99_seconds{{service=~"{job}"}})
      op: ">"
      threshold: 0.25
recommendation: "See the cause in this incident's header, when one is found."
"""


@dataclass
class PoolApp:
    """The scraped application: set a pool's usage and Prometheus sees it within a second or two."""

    port: int
    gauge: Gauge
    latency: Gauge | None = None
    #: ``shop_backend_refusing{namespace, service, err, conn}``: a label set that may change every scrape.
    backend: Gauge | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, job: str, pool: str, ratio: float) -> None:
        self.gauge.labels(namespace="shop", service=job, pool=pool).set(ratio)

    def set_p99(self, job: str, seconds: float) -> None:
        """The service's p99 (the symptom rule of :func:`write_rule` with ``symptom=True``)."""
        assert self.latency is not None
        self.latency.labels(namespace="shop", service=job).set(seconds)

    def set_refusing(self, job: str, *, err: str = "", conn: str = "") -> None:
        """The service's backend refuses it, told with these labels (the previous ones gone, as an
        exporter's last-error gauge replaces its error text); ``err`` and ``conn`` empty: healthy."""
        assert self.backend is not None
        for labels in [s.labels for m in self.backend.collect() for s in m.samples]:
            if labels["service"] == job:
                self.backend.remove(labels["namespace"], job, labels["err"], labels["conn"])
        if err or conn:
            self.backend.labels(namespace="shop", service=job, err=err, conn=conn).set(1)


@dataclass
class LivePrometheus:
    url: str
    daemon_port: int

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            return list(json.load(response)["data"]["result"])

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="session")
def pool_app() -> Iterator[PoolApp]:
    registry = CollectorRegistry()
    gauge = Gauge(
        "shop_pool_used_ratio", "Share of the pool's connections in use.", ["namespace", "service", "pool"],
        registry=registry,
    )
    latency = Gauge(
        "shop_request_p99_seconds", "The service's p99 latency.", ["namespace", "service"], registry=registry
    )
    backend = Gauge(
        "shop_backend_refusing", "1 while the backend refuses the service.", ["namespace", "service", "err", "conn"],
        registry=registry,
    )
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    gauge.labels(namespace="shop", service="warmup", pool="none").set(0.0)
    yield PoolApp(port, gauge, latency, backend)
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def live_prometheus(pool_app: PoolApp) -> Iterator[LivePrometheus]:
    daemon_port = free_port()
    with LocalPrometheus(scrape_targets=[pool_app.target, f"127.0.0.1:{daemon_port}"], scrape_interval="1s") as prom:
        live = LivePrometheus(prom.url, daemon_port)
        deadline = time.monotonic() + 30
        # Target discovery is throttled to 5 s: wait for the first scraped sample.
        while live.value('shop_pool_used_ratio{service="warmup"}') is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no sample scraped: {prom.log_tail()}")
            time.sleep(0.25)
        yield live


@pytest.fixture
def slack() -> Iterator[SlackFixtureServer]:
    with SlackFixtureServer() as server:
        yield server


def write_rule(directory: Path, job: str, *, severity: str = "critical", symptom: bool = False) -> Path:
    """A rule dir holding ``test/pool-saturated`` restricted to ``job`` (and ``test/p99-over-slo``,
    the symptom it explains, with ``symptom``)."""
    family = directory / "test"
    family.mkdir(parents=True, exist_ok=True)
    (family / "pool-saturated.yaml").write_text(RULE.format(job=job, severity=severity), encoding="utf-8")
    (family / "pool-saturated.md").write_text(RUNBOOK, encoding="utf-8")
    if symptom:
        (family / "p99-over-slo.yaml").write_text(SYMPTOM_RULE.format(job=job), encoding="utf-8")
        (family / "p99-over-slo.md").write_text(RUNBOOK.replace("Pool saturated", "p99 over SLO"), encoding="utf-8")
    return directory


def daemon_settings(
    tmp_path: Path,
    prometheus_url: str,
    job: str,
    *,
    slack: SlackFixtureServer | None = None,
    webhook: bool = False,
    state: Path | None = None,
    slack_settings: dict[str, Any] | None = None,
    symptom: bool = False,
    **daemon: Any,
) -> Settings:
    """Settings for a fast daemon: 0.4 s diagnoses, no jitter, only the test rule.

    Incidents are told at once (no ``pending_for``, no ``resolve_after``, no reopening) unless a
    test sets them: most tests here are about delivery, not the incidents' timing.
    """
    rules = write_rule(tmp_path / f"rules-{job}", job, symptom=symptom)
    slack_config: dict[str, Any] = {}
    if slack is not None:
        slack_config = (
            {"webhook_url": slack.webhook_url}
            if webhook
            else {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url}
        )
        # The fixture is on the loopback: listed, as a Slack stand-in must be.
        slack_config["allowed_addresses"] = ["127.0.0.1"]
        # Fast retries so a test sees several; a short settle time for posts in doubt.
        slack_config.update({"retry_base_s": 0.2, "retry_max_s": 1.0, "timeout_s": 1, "in_doubt_settle_s": 1.5,
                             "messages_per_s": 10, "message_burst": 5})
        slack_config.update(slack_settings or {})
    values: dict[str, Any] = {
        "diagnose_interval_s": 0.4,
        "jitter_s": 0,
        "cooldown_s": 600,
        "outbox_retry_s": 0.3,
        "pending_for_s": 0,
        "resolve_after_s": 0,
        "reopen_within_s": 0,
        "shutdown_grace_s": 2,
        "listen": "127.0.0.1:0",
        "state_path": str(state or tmp_path / "state.sqlite3"),
    }
    values.update(daemon)
    return load_settings(
        None,
        overrides={
            "prometheus": {"url": prometheus_url, "query_timeout_s": 5},
            "rule_dirs": [str(rules)],
            "disable_builtin_rules": True,
            "runbook_base_url": "https://runbooks.example/rules/",
            "context_labels": {"cluster": "test-cluster"},
            "deadline_s": 10,
            "slack": slack_config,
            "daemon": values,
        },
    )


async def wait_for(condition: Callable[[], bool | Awaitable[bool]], within: float = 15, what: str = "") -> None:
    """Poll ``condition`` (sync or async) every 50 ms until true; fail the test after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what or condition}")
        await asyncio.sleep(0.05)


@contextmanager
def scraped_services(
    collectors: Mapping[str, Collector], rates: Mapping[str, float], window: str
) -> Iterator[LivePrometheus]:
    """Each collector served on 127.0.0.1 and scraped every second as a job of its own name (its
    ``service`` in the catalogue's terms), by a Prometheus that is ready once every job's request
    rate over ``window`` reads as ``rates`` says (whole scrapes of each series in it)."""
    servers = []
    jobs: dict[str, list[str]] = {}
    for name, collector in collectors.items():
        registry = CollectorRegistry()
        registry.register(collector)
        port = free_port()
        servers.append(start_http_server(port, addr="127.0.0.1", registry=registry))
        jobs[name] = [f"127.0.0.1:{port}"]
    try:
        with LocalPrometheus(scrape_jobs=jobs, scrape_interval="1s") as prom:
            live = LivePrometheus(prom.url, 0)
            query = f"sum by (job) (rate(http_server_request_duration_seconds_count[{window}]))"
            deadline = time.monotonic() + 30
            while True:
                read = {r["metric"]["job"]: float(r["value"][1]) for r in live.query(query)}
                if all(abs(read.get(s, 0.0) - rate) < 0.5 for s, rate in rates.items()):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the request rates never read as set: {read}; {prom.log_tail()}")
                time.sleep(0.25)
            yield live
    finally:
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
