"""The pool services run the real libraries and really run out of connections.

Each service is started as its own process, sent more concurrent requests than its pool holds,
and scraped while they are in flight: the library's own pool metrics (read with
``prometheus_client``'s parser) must show the pool full, and the requests that found no
connection must have answered 503 after the pool timeout.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnoser.testing.processes import local_redis
from tests.conftest import live_bed
from tests.fixtures.pool_services.launch import pool_service

pytestmark = [pytest.mark.integration, live_bed]

HOLD_S = 1.5


def _get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _burst(url: str, clients: int) -> tuple[list[threading.Thread], Counter[int]]:
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def one() -> None:
        status = _get_status(url)
        with lock:
            statuses[status] += 1

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for thread in threads:
        thread.start()
    return threads, statuses


def _samples(metrics_url: str, name: str) -> dict[str, float]:
    """``state label value -> sample value`` for one gauge family of the exposition."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                state = sample.labels.get("state") or sample.labels.get("db_client_connection_state", "")
                found[state] = sample.value
    return found


def _wait_until_full(metrics_url: str, name: str, size: int) -> dict[str, float]:
    deadline = time.monotonic() + 5
    usage = _samples(metrics_url, name)
    while usage.get("used") != size and time.monotonic() < deadline:
        time.sleep(0.05)
        usage = _samples(metrics_url, name)
    return usage


def _exhaust(url: str, path: str, clients: int, family: str, size: int) -> tuple[dict[str, float], Counter[int]]:
    """Send ``clients`` concurrent requests that each hold a connection, read the pool while they are
    in flight, and wait for all answers."""
    threads, statuses = _burst(f"{url}{path}?hold_s={HOLD_S}", clients)
    usage = _wait_until_full(f"{url}/metrics", family, size)
    for thread in threads:
        thread.join(timeout=15)
    return usage, statuses


def test_sqlalchemy_service_runs_out_of_its_queue_pool() -> None:
    with pool_service("sqlalchemy_orders.py", "--pool-size", "5", "--pool-timeout-s", "0.3") as url:
        usage, statuses = _exhaust(url, "/orders", 12, "db_client_connections_usage_connections", 5)
    assert usage == {"used": 5.0, "idle": 0.0}
    # Five hold a connection for 1.5 s; the others give up after 0.3 s (a thread started late on a
    # busy machine may still find a free connection, hence "at least").
    assert statuses[200] + statuses[503] == 12
    assert statuses[503] >= 5


def test_redis_py_service_runs_out_of_its_blocking_pool() -> None:
    with (
        local_redis() as redis_port,
        pool_service(
            "redis_py_features.py", "--redis-port", str(redis_port), "--max-connections", "10",
            "--pool-timeout-s", "0.3",
        ) as url,
    ):
        usage, statuses = _exhaust(url, "/features", 16, "db_client_connection_count", 10)
    # redis-py 8.2 counts connections per state with an up-down counter: a state's series appears
    # once a connection first enters it, so a pool filled from cold has no idle series yet (8.1
    # exposed idle 0). Either way no connection is idle.
    assert usage.get("used") == 10.0
    assert usage.get("idle", 0.0) == 0.0
    assert statuses[200] + statuses[503] == 16
    assert statuses[503] >= 4
