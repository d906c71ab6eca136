"""A real Redis at maxclients, scraped live by prometheus-redis-exporter and a real Prometheus.

The client side of the incident in the README: clients' pools want more connections than Redis
allows, Redis rejects them, and ``diagnose now`` names connection_limit_reached with the
maxclients to set.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from diagnoser.testing.processes import free_port, local_redis, running, wait_port
from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import live_bed, run_cli

MAXCLIENTS = 12

pytestmark = [pytest.mark.integration, live_bed]



@pytest.fixture
def redis_stack() -> Iterator[tuple[int, str]]:
    assert shutil.which("prometheus-redis-exporter"), "prometheus-redis-exporter missing: run scripts/setup.sh"
    exporter_port = free_port()
    with local_redis(maxclients=MAXCLIENTS) as redis_port, running(
        "prometheus-redis-exporter", "-redis.addr", f"redis://127.0.0.1:{redis_port}",
        "-web.listen-address", f"127.0.0.1:{exporter_port}",
    ):  # fmt: skip
        wait_port(exporter_port)
        yield redis_port, f"127.0.0.1:{exporter_port}"


def _query(url: str, promql: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        result = json.load(r)["data"]["result"]
        assert isinstance(result, list)
        return result


def _wait_for(url: str, promql: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _query(url, promql):
            return
        time.sleep(0.5)
    raise TimeoutError(f"no result for {promql} within {timeout}s")


def _connect_and_ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(200)


def test_redis_at_maxclients_is_diagnosed(redis_stack: tuple[int, str]) -> None:
    redis_port, exporter = redis_stack
    with LocalPrometheus(scrape_targets=[exporter], scrape_interval="1s") as prometheus:
        _wait_for(prometheus.url, "redis_rejected_connections_total == 0")
        # Take every slot, overflow, then free two: the exporter needs one to report the rejections.
        held = [socket.create_connection(("127.0.0.1", redis_port), timeout=2) for _ in range(MAXCLIENTS)]
        try:
            for sock in held:
                sock.sendall(b"PING\r\n")
                sock.recv(100)
            answers = [_connect_and_ping(redis_port) for _ in range(25)]
            assert sum(b"max number of clients reached" in a for a in answers) >= 20, answers
            for sock in held[:2]:
                sock.close()
            _wait_for(prometheus.url, "redis_rejected_connections_total > 0")
        finally:
            for sock in held:
                sock.close()
        _wait_for(prometheus.url, "redis_connected_clients < 5")  # scrapes resume once slots free up
        result = run_cli("now", "--prometheus-url", prometheus.url, "--format", "json")
    assert result.code == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == []
    redis = [f for f in report["findings"] if f["rule_id"] == "pools/redis-rejected-connections"]
    assert len(redis) == 1, report["findings"]
    finding = redis[0]
    assert finding["cause"] == "connection_limit_reached"
    assert finding["labels"]["instance"] == exporter
    assert f"of {MAXCLIENTS} client slots" in finding["summary"]
    assert f"from {MAXCLIENTS} to at least 15" in finding["recommendation"]


def test_redis_full_while_its_exporter_is_blind_is_diagnosed_during_the_storm(redis_stack: tuple[int, str]) -> None:
    redis_port, exporter = redis_stack
    with LocalPrometheus(scrape_targets=[exporter], scrape_interval="1s") as prometheus:
        _wait_for(prometheus.url, "redis_config_maxclients > 0")
        held = [socket.create_connection(("127.0.0.1", redis_port), timeout=2) for _ in range(MAXCLIENTS)]
        try:
            for sock in held:
                sock.sendall(b"PING\r\n")
                sock.recv(100)
            _wait_for(prometheus.url, "redis_up == 0")
            result = run_cli("now", "--prometheus-url", prometheus.url, "--format", "json")
        finally:
            for sock in held:
                sock.close()
    assert result.code == 1, result.stderr
    findings = {f["rule_id"]: f for f in json.loads(result.stdout)["findings"]}
    blind = findings["pools/redis-maxclients-exporter-blind"]
    assert blind["cause"] == "connection_limit_reached"
    assert f"maxclients is {MAXCLIENTS}" in blind["summary"]
    assert f"from {MAXCLIENTS} to at least 15" in blind["recommendation"]
    assert findings["sources/exporter-cannot-scrape"]["cause"] == "source_unavailable"
    assert findings["sources/exporter-cannot-scrape"]["labels"]["instance"] == exporter
