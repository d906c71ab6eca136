"""The daemon's HTTP side: /healthz, /readyz, /findings, /metrics and the Alertmanager webhook receiver.

It is an aiohttp application on the daemon's own event loop: the Alertmanager receiver runs a
diagnosis, which is asyncio code sharing the daemon's sources, so serving from a thread (the
standard library's ``http.server``) would mean crossing threads for every request. aiohttp is
already a dependency of slack-sdk's asyncio clients. :class:`HttpServer` serves it within
:mod:`~diagnoser.daemon.connection_limits` (caps on connections in all and per client address,
a deadline for headers); /healthz and /readyz still answer at the cap, from a small reserve.

- ``GET /healthz``: 200 while the process serves requests.
- ``GET /readyz``: 200 when the scheduler runs, the last diagnosis is recent enough, some rule
  could run in it and no receiver is stuck (:attr:`~diagnoser.notify.delivery.OutboxDelivery.stuck`);
  the body says why, names the rules that could not run, and adds the last diagnosis' coverage line
  (what was evaluated, without data, skipped).
- ``GET /findings``: the active findings (what Slack was told about, or would have been) as JSON.
- ``GET /metrics``: Prometheus text format (prometheus-client), see
  :class:`~diagnoser.daemon.metrics.DaemonMetrics`.
- ``POST /alertmanager``: Alertmanager's webhook JSON (version 4) with ``Authorization: Bearer
  <daemon.alertmanager_token>``; answers ``202`` at once and runs, in the background, a diagnosis
  restricted to the alerts' labels (namespace, job, service, pod...: a finding stays when the
  labels it shares with an alert agree), posted to Slack in the thread of the finding it
  concerns. One diagnosis per ``groupKey`` within ``daemon.alert_group_cooldown_s`` (repeats:
  ``202 duplicate``), at most ``daemon.alert_concurrency`` at once, ``503`` when the backlog is
  full; a body that is not JSON, or nested deeper than :data:`MAX_JSON_DEPTH`, is ``400``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from diagnoser.config import DaemonSettings, parse_listen_address
from diagnoser.daemon.alerts import alert_scopes
from diagnoser.daemon.connection_limits import (
    ConnectionLimits,
    probe_reserve_middleware,
    start_limited_server,
)
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.models import Finding

__all__ = ["MAX_JSON_DEPTH", "PROBE_PATHS", "PROBE_RESERVE", "DaemonView", "HttpServer", "build_app"]

#: Alertmanager's webhook is 4 levels deep; anything far deeper is not one.
MAX_JSON_DEPTH = 32
#: The endpoints the kubelet's probes ask for, served from :data:`PROBE_RESERVE` at the cap.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
#: Connections beyond ``daemon.http_max_connections`` kept for the probes: a liveness and a
#: readiness probe at once, from a node or two.
PROBE_RESERVE = 4


class DaemonView(Protocol):
    """What the HTTP side needs from the daemon."""

    metrics: DaemonMetrics

    def readiness(self) -> tuple[bool, str]: ...

    def alertmanager_token(self) -> str | None: ...

    def active_findings(self) -> list[Finding]: ...

    def accept_alert(self, payload: Mapping[str, Any]) -> tuple[str, str]: ...


def _nesting_depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (iterative: no recursion to exhaust)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item)
    return deepest


async def _alert_payload(request: web.Request) -> tuple[dict[str, Any], list[dict[str, str]]] | web.Response:
    """The webhook's JSON object and its alerts' scopes, or the ``400`` that says why it is not one."""
    try:
        payload = json.loads(await request.read())
        if _nesting_depth(payload) > MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        if not isinstance(payload, dict):
            raise ValueError("the body must be a JSON object")
        scopes = alert_scopes(payload)
    except RecursionError:  # nested deeper than the parser's own limit
        too_deep = f"not an Alertmanager webhook payload: JSON nested deeper than {MAX_JSON_DEPTH} levels"
        return web.json_response({"error": too_deep}, status=400)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        return web.json_response({"error": f"not an Alertmanager webhook payload: {exc}"}, status=400)
    return payload, scopes


class _Endpoints:
    """The request handlers, over what the daemon shows of itself."""

    def __init__(self, daemon: DaemonView) -> None:
        self.daemon = daemon

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        ready, reason = self.daemon.readiness()
        coverage = self.daemon.metrics.coverage_summary
        text = reason + (f"\ncoverage: {coverage}" if coverage else "")
        return web.Response(status=200 if ready else 503, text=text + "\n")

    async def findings(self, request: web.Request) -> web.Response:
        active = [finding.model_dump(mode="json") for finding in self.daemon.active_findings()]
        return web.json_response({"findings": active})

    async def metrics(self, request: web.Request) -> web.Response:
        body = self.daemon.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def alertmanager(self, request: web.Request) -> web.Response:
        token = self.daemon.alertmanager_token()
        if token is None:
            return web.json_response(
                {"error": "the Alertmanager receiver is off (set daemon.alertmanager_token)"}, status=404
            )
        sent = request.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return web.json_response(
                {"error": "unauthorized"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="diagnoser"'},
            )
        parsed = await _alert_payload(request)
        if isinstance(parsed, web.Response):
            return parsed
        payload, scopes = parsed
        if not scopes:
            # A group whose alerts all resolved (send_resolved): nothing to explain.
            return web.json_response({"status": "ignored", "reason": "no firing alerts"})
        # Answer at once: Alertmanager's webhook timeout must never see a diagnosis's duration
        # (it would retry, and each retry used to be one more diagnosis and one more post).
        outcome, detail = self.daemon.accept_alert(payload)
        body = {"status": outcome, "detail": detail, "groupKey": payload.get("groupKey")}
        if outcome == "busy":
            return web.json_response(body, status=503, headers={"Retry-After": "30"})
        return web.json_response(body, status=202)


def build_app(daemon: DaemonView, limits: ConnectionLimits | None = None) -> web.Application:
    """The aiohttp application serving the daemon's endpoints (within ``limits``' probe reserve)."""
    endpoints = _Endpoints(daemon)
    middlewares = [probe_reserve_middleware(limits, PROBE_PATHS)] if limits is not None else []
    app = web.Application(client_max_size=1024 * 1024, middlewares=middlewares)
    app.router.add_get("/healthz", endpoints.healthz)
    app.router.add_get("/readyz", endpoints.readyz)
    app.router.add_get("/metrics", endpoints.metrics)
    app.router.add_get("/findings", endpoints.findings)
    app.router.add_post("/alertmanager", endpoints.alertmanager)
    return app


class HttpServer:
    """The daemon's listener on ``daemon.listen``, within ``daemon.http_max_connections`` (plus
    :data:`PROBE_RESERVE` for the probes), ``daemon.http_max_connections_per_peer`` and
    ``daemon.http_header_timeout_s``; ``port`` is the one bound once started (``:0`` picks a free one)."""

    def __init__(self, daemon: DaemonView, config: DaemonSettings) -> None:
        self.daemon = daemon
        self.config = config
        self.host, self._listen_port = parse_listen_address(config.listen)
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        timeout = self.config.http_header_timeout_s
        dropped = self.daemon.metrics.http_dropped
        limits = ConnectionLimits(
            max_connections=self.config.http_max_connections,
            header_timeout_s=timeout,
            max_per_peer=self.config.http_max_connections_per_peer,
            probe_reserve=PROBE_RESERVE,
            on_drop=lambda reason: dropped.labels(reason).inc(),
        )
        self._runner = web.AppRunner(
            build_app(self.daemon, limits), access_log=None, handle_signals=False, keepalive_timeout=timeout
        )
        await self._runner.setup()
        self._server = await start_limited_server(self._runner, self.host, self._listen_port, limits)
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1]) if sockets else self._listen_port

    async def close(self) -> None:
        """Stop listening, then close the connections still open."""
        if self._server is not None:
            self._server.close()  # no new connections; cleanup() closes the open ones
        if self._runner is not None:
            await self._runner.cleanup()
