"""A small feature service whose Redis client pool, not its CPU, is what saturates first.

``GET /v1/features?user=42`` reads the user's recent clicks and profile from a real Redis through
a redis-py asyncio ``BlockingConnectionPool`` of a fixed size, holding the pooled connection for
a fixed time: two Redis commands on the same connection with application work (an
``asyncio.sleep``) between them. A blocking Redis command would be the obvious way to hold a
connection, but Redis resolves those at its timer granularity (about 100 ms at the default
``hz``), so the hold lives in the application instead. An unknown user gets
``200 {"features": {}}``.

By Little's law the service serves at most ``pool_size / hold`` requests per second (10
connections held 20 ms each: about 500 req/s); past that, requests queue for a connection and
their latency grows without bound, which is the knee ``diagnose capacity`` looks for.

It is instrumented the way a production service is: the OpenTelemetry SDK with the Prometheus
exporter on ``/metrics``, instruments named as the OpenTelemetry semantic conventions name them
(``db.client.connection.*`` for the pool, ``http.server.request.duration`` for requests). ::

    python examples/feature_service/service.py --port 8080 --redis-port 6379 --pool-size 10 --hold-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

#: Bucket boundaries the HTTP and database semantic conventions advise for durations in seconds.
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ROUTE = "/v1/features"
SEEDED_USERS = 1000


class InstrumentedPool(BlockingConnectionPool):
    """A blocking pool that reports the ``db.client.connection.*`` instruments while it works."""

    def __init__(self, meter: Meter, pool_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attributes = {"db.client.connection.pool.name": pool_name}
        self.in_use = 0
        self._checked_out: dict[int, float] = {}
        self._pending = meter.create_up_down_counter(
            "db.client.connection.pending_requests",
            unit="{request}",
            description="The number of current pending requests for an open connection.",
        )
        self._timeouts = meter.create_counter(
            "db.client.connection.timeouts",
            unit="{timeout}",
            description="Connection timeouts that have occurred trying to obtain a connection from the pool.",
        )
        self._wait_time = meter.create_histogram(
            "db.client.connection.wait_time",
            unit="s",
            description="The time it took to obtain an open connection from the pool.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._use_time = meter.create_histogram(
            "db.client.connection.use_time",
            unit="s",
            description="The time between borrowing a connection and returning it to the pool.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        meter.create_observable_up_down_counter(
            "db.client.connection.count",
            callbacks=[self._observe_count],
            unit="{connection}",
            description="Connections that are currently in the state described by the state attribute.",
        )
        meter.create_observable_up_down_counter(
            "db.client.connection.max",
            callbacks=[self._observe_max],
            unit="{connection}",
            description="The maximum number of open connections allowed.",
        )

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        asked = time.perf_counter()
        self._pending.add(1, self.attributes)
        try:
            connection: AbstractConnection = await super().get_connection(*args, **kwargs)
        except RedisConnectionError:
            self._timeouts.add(1, self.attributes)
            raise
        finally:
            self._pending.add(-1, self.attributes)
        now = time.perf_counter()
        self._wait_time.record(now - asked, self.attributes)
        self._checked_out[id(connection)] = now
        self.in_use += 1
        return connection

    async def release(self, connection: AbstractConnection) -> None:
        taken = self._checked_out.pop(id(connection), None)
        if taken is not None:
            self.in_use -= 1
            self._use_time.record(time.perf_counter() - taken, self.attributes)
        await super().release(connection)

    def _observe_count(self, options: CallbackOptions) -> Iterable[Observation]:
        idle = len(self._available_connections)
        state = "db.client.connection.state"
        yield Observation(self.in_use, {**self.attributes, state: "used"})
        yield Observation(idle, {**self.attributes, state: "idle"})

    def _observe_max(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.max_connections, self.attributes)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_metrics_middleware(meter: Meter) -> Any:
    """``http.server.request.duration`` for every request, with the semconv's attributes."""
    duration = meter.create_histogram(
        "http.server.request.duration",
        unit="s",
        description="Duration of HTTP server requests.",
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
    )

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            resource = request.match_info.route.resource
            attributes: dict[str, str | int] = {
                "http.request.method": request.method,
                "http.response.status_code": status,
                "url.scheme": request.scheme,
            }
            if resource is not None:
                attributes["http.route"] = resource.canonical
            if request.path != "/metrics":
                duration.record(time.perf_counter() - started, attributes)

    return middleware


async def command(connection: AbstractConnection, *args: str | int) -> Any:
    """One command on a connection the caller holds (what ``Redis.execute_command`` does inside)."""
    await connection.send_command(*args)
    return await connection.read_response()


def pairs(reply: dict[bytes, bytes] | list[bytes]) -> dict[bytes, bytes]:
    """HGETALL's reply: a map under RESP3, a flat key-value list under RESP2."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def build_app(redis: Redis, hold_s: float, meter: Meter) -> web.Application:
    async def features(request: web.Request) -> web.Response:
        user = request.query.get("user", "")
        # One pooled connection for the whole request: the pool, not Redis, bounds throughput.
        pool = redis.connection_pool
        connection = await pool.get_connection()
        try:
            clicks = await command(connection, "LRANGE", f"clicks:{user}", 0, 9)
            await asyncio.sleep(hold_s)  # application work while the connection stays checked out
            profile = pairs(await command(connection, "HGETALL", f"user:{user}"))
        finally:
            await pool.release(connection)
        body: dict[str, Any] = {}
        if clicks or profile:
            body = {
                "recent_clicks": [c.decode() for c in clicks],
                **{k.decode(): v.decode() for k, v in profile.items()},
            }
        return web.json_response({"features": body}, dumps=json.dumps)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=[http_metrics_middleware(meter)])
    app.router.add_get(ROUTE, features)
    app.router.add_get("/metrics", metrics)
    return app


async def seed(redis: Redis) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for user in range(1, SEEDED_USERS + 1):
            pipe.delete(f"clicks:{user}")
            pipe.rpush(f"clicks:{user}", *(f"item-{(user * 7 + i) % 500}" for i in range(10)))
            pipe.hset(f"user:{user}", mapping={"segment": f"s{user % 5}", "country": "de"})
        await pipe.execute()


async def serve(args: argparse.Namespace) -> None:
    resource = Resource.create({"service.name": args.service_name})
    provider = MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()])
    meter = provider.get_meter("feature_service")
    pool = InstrumentedPool(
        meter,
        args.pool_name,
        max_connections=args.pool_size,
        timeout=args.pool_timeout_s,
        host="127.0.0.1",
        port=args.redis_port,
    )
    redis = Redis(connection_pool=pool)
    await seed(redis)
    # Start-up objects out of the collector's view: fewer long full collections under load.
    gc.freeze()
    runner = web.AppRunner(build_app(redis, args.hold_ms / 1000, meter), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096).start()
    print(f"feature service on http://127.0.0.1:{args.port}{ROUTE}?user=1", flush=True)
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()
        await redis.aclose()
        await pool.disconnect()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="HTTP port on 127.0.0.1")
    parser.add_argument("--redis-port", type=int, required=True, help="Redis port on 127.0.0.1")
    parser.add_argument("--pool-size", type=int, default=10, help="Redis client pool size (default 10)")
    parser.add_argument("--hold-ms", type=float, default=20.0, help="ms each request holds its connection")
    parser.add_argument(
        "--pool-timeout-s", type=float, default=2.0, help="wait for a pooled connection at most this"
    )
    parser.add_argument("--pool-name", default="feature-store", help="db.client.connection.pool.name")
    parser.add_argument("--service-name", default="feature-service", help="OpenTelemetry service.name")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(serve(args))


if __name__ == "__main__":
    main()
