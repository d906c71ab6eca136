"""Read-only Elasticsearch source: hot threads, node stats, cat APIs, mappings and slow logs (files, index).

Built on the official client's ``AsyncElasticsearch`` (aiohttp transport): the engine evaluates
rules concurrently on one event loop under one deadline, and a native coroutine is cancelled
cleanly by that deadline, where a sync client in a worker thread would keep a thread (and a
socket) busy after the diagnosis gave up on it. Every method returns parsed data or a
:class:`SourceError` value; no client exception escapes::

    source = ElasticsearchSource.from_settings(settings.elasticsearch)
    if source is not None:
        nodes = await source.hot_threads()
        if isinstance(nodes, SourceError):
            print(nodes.message)
        await source.aclose()

Requests go through ``perform_request`` with ``compatible-with=8`` media types: 8.x servers
reject the ``compatible-with=9`` the 9.x client sends by default, and 9.x servers accept 8
(REST API compatibility), so one client works against both. Retries are off (``max_retries=0``,
no retry on timeout or status): a struggling cluster must not receive more load because it
is being diagnosed. Identical requests issued concurrently, or within a few seconds, share one
answer, so several rules reading node stats cost the cluster one call. The user only needs the
``monitor`` cluster privilege (plus ``read`` on the slow log index, if one is configured).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

from diagnoser.config import ElasticsearchSettings
from diagnoser.models import SourceError
from diagnoser.redact import redact_url, scrub_text
from diagnoser.sources.base import SingleFlight
from diagnoser.sources.elasticsearch.hot_threads import HotThreadsNode, parse_hot_threads
from diagnoser.sources.elasticsearch.node_stats import NodeStats, NodeStatsSample, parse_node_stats
from diagnoser.sources.elasticsearch.slowlog_files import summarise_slowlog_records
from diagnoser.sources.elasticsearch.slowlog_reading import SlowlogRead, read_slowlog_files
from diagnoser.sources.elasticsearch.slowlog_summary import SlowlogSummary

__all__ = ["COMPAT_JSON", "ElasticsearchSource"]

SOURCE = "elasticsearch"
#: Media type understood by 8.x and 9.x servers alike.
COMPAT_JSON = "application/vnd.elasticsearch+json; compatible-with=8"
_JSON_HEADERS = {"accept": COMPAT_JSON}
_TEXT_HEADERS = {"accept": "text/plain"}
#: Metrics read from node stats; ``indices`` is narrowed to fielddata to keep the response small.
_NODE_STATS_PATH = "/_nodes/stats/jvm,thread_pool,breakers,os,process,fs,indices/fielddata"
_CACHE_TTL_S = 5.0

T = TypeVar("T")


def _error_reason(body: Any) -> str:
    """The most useful line of an Elasticsearch error body (``error.root_cause[0].reason``)."""
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            causes = error.get("root_cause")
            first = (
                causes[0] if isinstance(causes, list) and causes and isinstance(causes[0], Mapping) else error
            )
            kind = first.get("type") or error.get("type")
            reason = first.get("reason") or error.get("reason")
            if kind and reason:
                return f"{kind}: {reason}"
            return str(kind or reason or "(no reason given)")
        if isinstance(error, str):
            return error
    text = str(body).strip().replace("\n", " ")
    return text[:200] if text else "(empty body)"


class ElasticsearchSource:
    """Read-only access to one Elasticsearch cluster; see the module docstring."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        api_key: str | None = None,
        username: str | None = None,
        password: str | None = None,
        ca_certs: str | None = None,
        verify_certs: bool = True,
        timeout_s: float = 10.0,
        cache_ttl_s: float = _CACHE_TTL_S,
        slowlog_paths: Sequence[Path] = (),
        slowlog_index: str | None = None,
    ) -> None:
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self.slowlog_paths = list(slowlog_paths)
        self.slowlog_index = slowlog_index
        self._api_key = api_key
        self._basic_auth = (username, password or "") if username else None
        self._ca_certs = ca_certs
        self._verify_certs = verify_certs
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Per event loop: a daemon running each diagnosis in a new loop starts afresh.
        self._flight = SingleFlight(ttl_s=cache_ttl_s)

    @property
    def has_api(self) -> bool:
        """False in slow-log-only mode (files configured, no cluster URL): API checks are skipped."""
        return bool(self.urls)

    @property
    def has_slowlog(self) -> bool:
        """True when slow log files or a slow log index are configured (the ``expensive_query`` check)."""
        return bool(self.slowlog_paths or self.slowlog_index)

    @classmethod
    def from_settings(cls, settings: ElasticsearchSettings) -> ElasticsearchSource | None:
        """The source described by the ``elasticsearch`` config section.

        ``None`` when the section configures nothing; a source without URLs when only slow log
        files are given (``has_api`` is then false and only the slow log check runs).
        """
        if not settings.urls and not settings.slowlog_paths and not settings.slowlog_index:
            return None
        from elastic_transport.client_utils import url_to_node_config

        for url in settings.urls:
            # Check now, with the client's own parser: a bad URL is a setup error for the source,
            # not an exception in every rule that reads it.
            try:
                url_to_node_config(url)
            except ValueError as exc:
                raise ValueError(
                    f"invalid Elasticsearch URL {redact_url(url)!r}: {scrub_text(str(exc))}"
                ) from exc
        return cls(
            settings.urls,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            username=settings.username,
            password=settings.password.get_secret_value() if settings.password else None,
            ca_certs=str(settings.ca_certs) if settings.ca_certs else None,
            verify_certs=settings.verify_certs,
            timeout_s=settings.timeout_s,
            slowlog_paths=settings.slowlog_paths,
            slowlog_index=settings.slowlog_index,
        )

    # -- client lifecycle -------------------------------------------------------------------

    def _make_client(self) -> Any:
        from elasticsearch import AsyncElasticsearch

        options: dict[str, Any] = {
            "request_timeout": self.timeout_s,
            "max_retries": 0,
            "retry_on_timeout": False,
            "retry_on_status": (),
            "verify_certs": self._verify_certs,
        }
        if not self._verify_certs:
            options["ssl_show_warn"] = False
        if self._ca_certs:
            options["ca_certs"] = self._ca_certs
        if self._api_key:
            options["api_key"] = self._api_key
        elif self._basic_auth:
            options["basic_auth"] = self._basic_auth
        return AsyncElasticsearch(self.urls, **options)

    def _client_for_loop(self) -> Any:
        loop = asyncio.get_running_loop()
        # aiohttp sessions belong to one event loop; a daemon running each diagnosis in a new
        # loop gets a fresh client rather than one bound to a closed loop.
        if self._client is None or self._loop is not loop:
            self._client = self._make_client()
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP session (safe to call more than once)."""
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            with contextlib.suppress(Exception):  # closing must never fail a report
                await client.close()
        self._flight.clear()

    # -- the one request path ---------------------------------------------------------------

    def _error(self, request: str, message: str) -> SourceError:
        return SourceError(source=SOURCE, message=scrub_text(f"{request}: {message}"))

    async def _request(
        self, path: str, params: Mapping[str, Any] | None = None, *, text: bool = False
    ) -> Any:
        """GET ``path``; return the body, or a SourceError describing exactly what went wrong."""
        from elastic_transport import ConnectionError as TransportConnectionError
        from elastic_transport import ConnectionTimeout, SerializationError, TlsError
        from elasticsearch import ApiError, UnsupportedProductError

        query = f"?{urlencode(params)}" if params else ""
        request = f"GET {path}{query}"
        if not self.urls:
            return self._error(request, "no Elasticsearch URL is configured")
        try:
            client = self._client_for_loop()
            # The transport's own timeout normally fires first; this bounds DNS and connection setup too.
            response = await asyncio.wait_for(
                client.perform_request(
                    "GET",
                    path,
                    params=dict(params) if params else None,
                    headers=_TEXT_HEADERS if text else _JSON_HEADERS,
                ),
                timeout=self.timeout_s + 1.0,
            )
        except UnsupportedProductError:
            return self._error(request, "the server is not Elasticsearch (no X-Elastic-Product header)")
        except ApiError as exc:
            status = exc.meta.status if exc.meta is not None else 0
            reason = _error_reason(exc.body)
            if status == 401:
                hint = "authentication failed; check api_key or username/password"
            elif status == 403:
                hint = "not authorized; the user needs the 'monitor' cluster privilege"
            elif status == 429:
                hint = "the cluster is rejecting requests (too many requests)"
            elif status >= 500:
                hint = "server error"
            else:
                hint = "request failed"
            return self._error(request, f"HTTP {status}: {hint}: {reason}")
        except (ConnectionTimeout, TimeoutError):
            return self._error(request, f"timed out after {self.timeout_s:g}s")
        except TlsError as exc:
            return self._error(request, f"TLS error: {exc.message}")
        except TransportConnectionError as exc:
            where = ", ".join(map(redact_url, self.urls))
            return self._error(request, f"cannot connect to {where}: {exc.message}")
        except SerializationError as exc:
            return self._error(request, f"response is not valid JSON: {str(exc)[:200]}")
        except Exception as exc:  # the contract: no client exception escapes a source
            return self._error(request, f"{type(exc).__name__}: {str(exc)[:200]}")
        body = response.body
        if text:
            if isinstance(body, bytes):
                body = body.decode("utf-8", errors="replace")
            if not isinstance(body, str):
                return self._error(request, f"expected text, got {type(body).__name__}")
        return body

    async def _json_object(
        self, path: str, params: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | SourceError:
        body = await self._request(path, params)
        if isinstance(body, SourceError):
            return body
        if isinstance(body, str | bytes):
            text = body if isinstance(body, str) else body.decode("utf-8", errors="replace")
            return self._error(f"GET {path}", f"expected JSON, got a non-JSON body: {text[:120]!r}")
        if not isinstance(body, dict):
            return self._error(f"GET {path}", f"expected a JSON object, got {type(body).__name__}")
        return body

    async def _cat(self, path: str, params: Mapping[str, Any]) -> list[dict[str, Any]] | SourceError:
        full = {"format": "json", "bytes": "b", **params}
        body = await self._cached(f"{path}?{sorted(full.items())}", lambda: self._request(path, full))
        if isinstance(body, SourceError):
            return body
        if not isinstance(body, list) or not all(isinstance(row, dict) for row in body):
            return self._error(f"GET {path}", "expected a JSON list of rows")
        return body

    async def _cached(self, key: str, make: Callable[[], Awaitable[T]]) -> T:
        return await self._flight.run(key, make)

    # -- public reads -------------------------------------------------------------------------

    async def hot_threads(
        self, *, threads: int = 3, interval_ms: int = 500, snapshots: int = 10, ignore_idle: bool = True
    ) -> list[HotThreadsNode] | SourceError:
        """``GET _nodes/hot_threads`` parsed per node (the text answer, whatever its version)."""
        params = {
            "threads": threads,
            "interval": f"{interval_ms}ms",
            "snapshots": snapshots,
            "ignore_idle_threads": "true" if ignore_idle else "false",
        }
        body = await self._cached(
            f"hot_threads?{sorted(params.items())}",
            lambda: self._request("/_nodes/hot_threads", params, text=True),
        )
        if isinstance(body, SourceError):
            return body
        return parse_hot_threads(body)

    async def node_stats(self) -> list[NodeStats] | SourceError:
        """One reading of ``GET _nodes/stats`` (JVM, thread pools, breakers, OS, process, FS, fielddata)."""
        body = await self._json_object(_NODE_STATS_PATH)
        if isinstance(body, SourceError):
            return body
        try:
            return parse_node_stats(body)
        except ValueError as exc:
            return self._error(f"GET {_NODE_STATS_PATH}", str(exc))

    async def node_stats_sample(self, interval_s: float = 2.0) -> NodeStatsSample | SourceError:
        """Two node stats readings ``interval_s`` apart, shared by every check asking for that interval."""
        return await self._cached(f"node_stats_sample:{interval_s}", lambda: self._sample(interval_s))

    async def _sample(self, interval_s: float) -> NodeStatsSample | SourceError:
        started = time.monotonic()
        first = await self.node_stats()
        if isinstance(first, SourceError):
            return first
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
        second = await self.node_stats()
        if isinstance(second, SourceError):
            return second
        return NodeStatsSample(first, second, time.monotonic() - started)

    async def node_info(self, metric: str = "process") -> dict[str, Any] | SourceError:
        """``GET _nodes/<metric>`` (``process`` carries ``mlockall``): the ``nodes`` object by node id."""
        path = f"/_nodes/{quote(metric, safe=',')}"
        body = await self._cached(path, lambda: self._json_object(path))
        if isinstance(body, SourceError):
            return body
        nodes = body.get("nodes")
        if not isinstance(nodes, dict):
            return self._error(f"GET {path}", "no 'nodes' object in the response")
        return nodes

    async def cat_shards(self) -> list[dict[str, Any]] | SourceError:
        """``GET _cat/shards`` in bytes: index, shard, prirep, state, docs, store, node."""
        return await self._cat("/_cat/shards", {"h": "index,shard,prirep,state,docs,store,node"})

    async def cat_fielddata(self) -> list[dict[str, Any]] | SourceError:
        """``GET _cat/fielddata`` in bytes: fielddata memory per node and field."""
        return await self._cat("/_cat/fielddata", {"h": "id,host,ip,node,field,size"})

    async def field_mappings(
        self, fields: Sequence[str]
    ) -> dict[str, list[tuple[str, str, bool]]] | SourceError:
        """Mapping of ``fields`` in every index: ``field -> [(index, type, fielddata enabled)]``."""
        if not fields:
            return {}
        path = f"/_mapping/field/{quote(','.join(sorted(set(fields))), safe=',*')}"
        body = await self._json_object(path)
        if isinstance(body, SourceError):
            return body
        found: dict[str, list[tuple[str, str, bool]]] = {}
        for index, index_body in body.items():
            mappings = index_body.get("mappings") if isinstance(index_body, dict) else None
            if not isinstance(mappings, dict):
                continue
            for full_name, spec in mappings.items():
                leaf = spec.get("mapping") if isinstance(spec, dict) else None
                if not isinstance(leaf, dict) or not leaf:
                    continue
                definition = next(iter(leaf.values()))
                if not isinstance(definition, dict):
                    continue
                found.setdefault(str(full_name), []).append(
                    (str(index), str(definition.get("type", "")), definition.get("fielddata") is True)
                )
        return found

    async def slowlog_records(
        self,
        index: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        max_docs: int = 5000,
    ) -> list[dict[str, Any]] | SourceError:
        """Slow log documents a shipper wrote to ``index`` (newest first), as their ``_source`` objects.

        Read with a GET search (query in the ``source`` parameter) so the user needs no more than
        ``read`` on that index.
        """
        import json

        bounds: dict[str, str] = {}
        if since is not None:
            bounds["gte"] = since.astimezone(UTC).isoformat()
        if until is not None:
            bounds["lte"] = until.astimezone(UTC).isoformat()
        query: dict[str, Any] = {"range": {"@timestamp": bounds}} if bounds else {"match_all": {}}
        request = {
            "size": max_docs,
            "query": query,
            "sort": [{"@timestamp": {"order": "desc", "unmapped_type": "date"}}],
        }
        path = f"/{quote(index, safe=',*')}/_search"
        body = await self._json_object(
            path, {"source": json.dumps(request), "source_content_type": "application/json"}
        )
        if isinstance(body, SourceError):
            return body
        hits = body.get("hits", {}).get("hits") if isinstance(body.get("hits"), dict) else None
        if not isinstance(hits, list):
            return self._error(f"GET {path}", "no hits.hits list in the search response")
        return [h["_source"] for h in hits if isinstance(h, dict) and isinstance(h.get("_source"), dict)]

    async def read_slowlog(
        self, *, since: datetime | None = None, until: datetime | None = None, max_index_docs: int = 5000
    ) -> SlowlogRead | SourceError:
        """The configured slow log files and index read into one summary.

        Files are parsed off the event loop (big ones in worker processes the deadline stops);
        index documents are searched within ``since``..``until``. What one of them cannot give
        is an error only when the other gave no entries either.
        """
        summary, queries, problems = SlowlogSummary(), [], []
        if self.slowlog_paths:
            queries.append("slow log files " + ", ".join(str(p) for p in self.slowlog_paths))
            try:
                summary = await read_slowlog_files(self.slowlog_paths, since=since, until=until)
            except OSError as exc:
                problems.append(f"cannot read slow log files: {exc}")
        if self.slowlog_index:
            queries.append(f"GET {self.slowlog_index}/_search")
            records = await self.slowlog_records(
                self.slowlog_index, since=since, until=until, max_docs=max_index_docs
            )
            if isinstance(records, SourceError):
                problems.append(records.message)
            else:
                # The search already applied the time window.
                summary.merge(summarise_slowlog_records(records))
        if problems and not summary.entries:
            return SourceError(source=SOURCE, message="; ".join(problems))
        return SlowlogRead(summary=summary, queries=queries)
