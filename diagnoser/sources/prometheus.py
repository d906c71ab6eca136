"""PromQL over HTTP (Prometheus, Thanos, Mimir, VictoriaMetrics) through prometheus-api-client.

The client is synchronous (requests), so queries run in a bounded thread pool of this source's
own; asyncio's default executor would cap concurrency at ``cpu + 4`` threads. Every query has
its own timeout, passed both to requests (the socket) and to Prometheus (``timeout=``, so the
server stops evaluating too). Nothing raises: any failure comes back as a
:class:`~diagnoser.models.SourceError`. The client's retries are off: a diagnosis runs under one
deadline, and backing off on a struggling Prometheus only adds load and delay.
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import re
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from diagnoser.config import PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.redact import redact_url, scrub_text

__all__ = ["PrometheusSource", "Sample", "rewrite_metric_names"]

SOURCE = "prometheus"
#: Answers kept for sharing between rules: about two diagnoses' worth of distinct queries.
_SHARED_ANSWERS = 256


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector (or a scalar, with no labels)."""

    labels: dict[str, str]
    value: float

    @property
    def is_finite(self) -> bool:
        return math.isfinite(self.value)


@dataclass
class PrometheusSource:
    """Instant queries against one PromQL endpoint.

    >>> source = PrometheusSource(PrometheusSettings(url="http://127.0.0.1:9090"))
    >>> samples = await source.query("up == 0", at=datetime.now(UTC))   # doctest: +SKIP
    """

    settings: PrometheusSettings
    metric_overrides: dict[str, str] = field(default_factory=dict)
    _client: PrometheusConnect = field(init=False, repr=False)
    _executor: ThreadPoolExecutor = field(init=False, repr=False)
    _shared: OrderedDict[tuple[str, float, float], asyncio.Future[list[Sample] | SourceError]] = field(
        init=False, repr=False, default_factory=OrderedDict
    )

    def __post_init__(self) -> None:
        if not self.settings.url:
            raise ValueError("PrometheusSource needs a URL")
        url = self.settings.url.rstrip("/")
        session = requests.Session()
        session.verify = str(self.settings.ca_file) if self.settings.ca_file else self.settings.verify_tls
        headers = dict(self.settings.headers)
        if self.settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.settings.bearer_token.get_secret_value()}"
        auth = None
        if self.settings.basic_auth is not None:
            auth = (self.settings.basic_auth.username, self.settings.basic_auth.password.get_secret_value())
        self._client = PrometheusConnect(
            url=url,
            headers=headers or None,
            disable_ssl=not self.settings.verify_tls,
            auth=auth,
            session=session,
            timeout=self.settings.query_timeout_s,
            retry=Retry(total=0, raise_on_status=False),
        )
        # The client mounts an adapter with requests' default pool of 10 connections; give it one
        # connection per worker so concurrent queries never queue for a socket.
        adapter = HTTPAdapter(
            max_retries=Retry(total=0, raise_on_status=False),
            pool_connections=1,
            pool_maxsize=self.settings.max_concurrency,
        )
        session.mount(url, adapter)
        self._executor = ThreadPoolExecutor(
            max_workers=self.settings.max_concurrency, thread_name_prefix="promql"
        )

    @property
    def url(self) -> str:
        """The endpoint fit to print: credentials in it replaced by ``***``."""
        return redact_url(str(self.settings.url))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def prepare(self, query: str) -> str:
        """The query as it will be sent: metric names renamed per config."""
        return rewrite_metric_names(query, self.metric_overrides)

    async def query(
        self, query: str, at: datetime, timeout_s: float | None = None, *, share: bool = True
    ) -> list[Sample] | SourceError:
        """Evaluate ``query`` at instant ``at``; samples, or a SourceError saying what went wrong.

        Rules share queries (a service's request rate, a pool's size): the same query at the same
        instant is sent once and its answer shared, while in flight and for a while after
        (``share=False`` always asks Prometheus).
        """
        timeout = timeout_s or self.settings.query_timeout_s
        prepared = self.prepare(query)
        if not share:
            return await self._query_once(prepared, at, timeout)
        key = (prepared, at.timestamp(), timeout)
        shared = self._shared.get(key)
        if shared is None or shared.get_loop() is not asyncio.get_running_loop():
            shared = asyncio.ensure_future(self._query_once(prepared, at, timeout))
            self._shared[key] = shared
            while len(self._shared) > _SHARED_ANSWERS:
                self._shared.popitem(last=False)
        # shield: one rule giving up (deadline) must not cancel the answer other rules wait for.
        return await asyncio.shield(shared)

    async def _query_once(self, prepared: str, at: datetime, timeout_s: float) -> list[Sample] | SourceError:
        timeout = timeout_s
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self._executor, self._query_blocking, prepared, at, timeout),
                # A little slack over the socket timeout so the thread reports its own error first.
                timeout=timeout + 1.0,
            )
        except TimeoutError:
            return self._error(f"no answer within {timeout:g}s from {self.url}")

    def _query_blocking(self, query: str, at: datetime, timeout: float) -> list[Sample] | SourceError:
        params = {"time": f"{at.timestamp():.3f}", "timeout": f"{timeout:g}s"}
        try:
            result: Any = self._client.custom_query(query, params=params, timeout=timeout)
        except PrometheusApiClientException as exc:
            return self._error(f"{_api_error_message(str(exc))}: {_short(query)}")
        except requests.JSONDecodeError as exc:
            # 200 with a body that is not JSON: a login page, a proxy's error page, the wrong port.
            return self._error(f"{self.url} did not answer like a Prometheus API (not JSON: {exc.msg})")
        except requests.RequestException as exc:
            if _timed_out(exc):
                return self._error(f"no answer within {timeout:g}s from {self.url}")
            if isinstance(exc, requests.ConnectionError):
                return self._error(f"cannot connect to {self.url}: {_root_cause(exc)}")
            return self._error(f"request to {self.url} failed: {_root_cause(exc)}")
        except (ValueError, KeyError, TypeError) as exc:
            # JSON, but not the API's envelope (no data.result).
            return self._error(
                f"{self.url} did not answer like a Prometheus API ({type(exc).__name__}: {exc})"
            )
        try:
            return _samples_from(result)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return self._error(f"unexpected result shape from {self.url}: {exc}")

    def _error(self, message: str) -> SourceError:
        return SourceError(source=SOURCE, message=scrub_text(message))


def _samples_from(result: Any) -> list[Sample]:
    """Instant-query ``data.result`` as samples; handles vector and scalar result types."""
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        return [Sample(labels={}, value=float(result[1]))]  # scalar: [ts, "value"]
    if not isinstance(result, list):
        raise TypeError(f"result is a {type(result).__name__}, expected a list")
    samples: list[Sample] = []
    for item in result:
        if "value" not in item:
            raise ValueError("a range vector came back: rules must use instant vectors")
        labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
        samples.append(Sample(labels=labels, value=float(item["value"][1])))
    return samples


_STATUS = re.compile(r"HTTP Status Code (\d+) \((.*)\)$", re.S)


def _api_error_message(text: str) -> str:
    """``HTTP 400: parse error ...`` from the client's ``HTTP Status Code 400 (b'{json}')``."""
    match = _STATUS.search(text)
    if not match:
        return f"query failed: {text[:200]}"
    status, raw = match.groups()
    try:
        body = ast.literal_eval(raw)
        payload = json.loads(body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body))
        detail = str(payload.get("error") or payload)
    except (ValueError, SyntaxError, AttributeError, TypeError):
        detail = raw[:200]
    return f"HTTP {status}: {detail}"


def _timed_out(exc: BaseException) -> bool:
    """True when a timeout is anywhere in the chain: requests reports read timeouts under
    ``Retry(total=0)`` as a ConnectionError wrapping urllib3's ReadTimeoutError."""
    seen: BaseException | None = exc
    depth = 0
    while seen is not None and depth < 10:
        if isinstance(seen, urllib3.exceptions.NewConnectionError):
            return False  # a refused connection; urllib3 derives it from ConnectTimeoutError
        if isinstance(seen, requests.Timeout | TimeoutError | urllib3.exceptions.TimeoutError):
            return True
        reason = getattr(seen, "reason", None)
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
        depth += 1
    return False


def _root_cause(exc: BaseException) -> str:
    seen: BaseException = exc
    while seen.__context__ is not None and seen.__context__ is not seen:
        seen = seen.__context__
    text = str(seen) or type(seen).__name__
    return text[:300]


def _short(query: str, limit: int = 160) -> str:
    flat = " ".join(query.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`|[A-Za-z_:][A-Za-z0-9_:]*')
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def rewrite_metric_names(query: str, overrides: dict[str, str]) -> str:
    """Rename metrics in ``query`` per ``overrides`` (exporter name -> installed name).

    A histogram or counter's series follow their base name: overriding
    ``http_server_request_duration_seconds`` renames its ``_bucket``, ``_count`` and ``_sum``.
    String literals are left alone.
    """
    if not overrides:
        return query

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token[0] in "\"'`":
            return token
        if token in overrides:
            return overrides[token]
        for suffix in _HISTOGRAM_SUFFIXES:
            base = token.removesuffix(suffix)
            if base != token and base in overrides:
                return overrides[base] + suffix
        return token

    return _TOKEN.sub(replace, query)
