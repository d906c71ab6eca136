"""The feature service's test bed: a real Redis, the service, and a real Prometheus scraping it.

Used by the ``diagnose capacity`` tests, ``bench/capacity.py`` and the demo. Everything listens
on 127.0.0.1 on free ports, lives in a temp dir and is stopped by PID. ::

    with FeatureTestBed(pool_size=4, hold_ms=20, prometheus=True) as bed:
        run("diagnose", "capacity", bed.url, "--slo-p99-ms", "50", "--prometheus-url", bed.prometheus_url)
        print(bed.littles_law_limit())   # pool / measured hold: the rate the pool allows
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from diagnoser.testing.processes import free_port, local_redis, stop_process, wait_port
from diagnoser.testing.prometheus import LocalPrometheus

__all__ = ["FeatureTestBed", "RedisServer"]

SERVICE = Path(__file__).resolve().parent / "service.py"


@dataclass
class RedisServer:
    """``redis-server`` on a free port in a temp dir, no persistence: :func:`local_redis` as an object."""

    port: int = 0
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, init=False, repr=False)

    def __enter__(self) -> RedisServer:
        self.port = self._stack.enter_context(local_redis(port=self.port))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


@dataclass
class FeatureTestBed:
    """The feature service on its own Redis (or a shared one), optionally scraped by Prometheus."""

    pool_size: int = 4
    hold_ms: float = 20.0
    prometheus: bool = True
    redis_port: int | None = None
    port: int = 0
    _redis: RedisServer | None = field(default=None, init=False, repr=False)
    _service: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _prometheus: LocalPrometheus | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """A known user's features: a non-empty answer the probe's validators accept."""
        return f"http://127.0.0.1:{self.port}/v1/features?user=42"

    @property
    def prometheus_url(self) -> str:
        assert self._prometheus is not None, "started without prometheus"
        return self._prometheus.url

    def __enter__(self) -> FeatureTestBed:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self.redis_port is None:
            self._redis = RedisServer().__enter__()
            self.redis_port = self._redis.port
        self.port = self.port or free_port()
        self._service = subprocess.Popen(
            [sys.executable, str(SERVICE), "--port", str(self.port), "--redis-port", str(self.redis_port),
             "--pool-size", str(self.pool_size), "--hold-ms", str(self.hold_ms)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_port(self.port)
        if self.prometheus:
            self._prometheus = LocalPrometheus(
                scrape_targets=[f"127.0.0.1:{self.port}"], scrape_interval="1s"
            )
            self._prometheus.start()
            self._wait_for_samples()

    def _wait_for_samples(self, timeout: float = 30.0) -> None:
        # Prometheus throttles target discovery to 5 s: the first samples land about 5.5 s in.
        query = urllib.parse.urlencode({"query": "db_client_connection_max"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{self.prometheus_url}/api/v1/query?{query}", timeout=5) as reply:
                if b'"result":[]' not in reply.read():
                    return
            time.sleep(0.25)
        raise TimeoutError("Prometheus has no sample of the service after 30 s")

    def stop(self) -> None:
        if self._prometheus is not None:
            self._prometheus.stop()
        stop_process(self._service)
        if self._redis is not None:
            self._redis.__exit__(None, None, None)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    def mean_hold_s(self) -> float:
        """Mean time a request held its pooled connection so far, from the service's own histogram."""
        text = self.metrics()

        def total(name: str) -> float:
            found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
            if found is None:
                raise ValueError(f"{name} not in the service's /metrics")
            return float(found.group(1))

        return total("db_client_connection_use_time_seconds_sum") / total(
            "db_client_connection_use_time_seconds_count"
        )

    def littles_law_limit(self) -> float:
        """The most requests per second the pool can serve: connections / mean hold (Little's law)."""
        return self.pool_size / self.mean_hold_s()
