"""Read-only access to the Kubernetes API for the ``k8s`` checks.

:class:`KubernetesSource` wraps the official ``kubernetes`` client. Its sync calls run in daemon
threads (:func:`diagnoser.sources.base.run_blocking`, at most ``max_concurrency`` at once), so a slow
API server can neither starve the event loop nor hold the process open past the diagnosis'
deadline: the engine cancels the waiting coroutine and the thread, if still blocked, dies with
the process. One timeout per HTTP call and no automatic retries: a check that failed once reports
it rather than multiplying load on a struggling API server.

Lists are paged (``limit``/``continue``) and parsed with ``json.loads`` into plain dicts instead of
the client's model objects, which is several times faster for thousands of pods or events.
Concurrent identical reads share one request (the engine evaluates rules concurrently and
several checks read pods and events), and a result is reused for ``cache_ttl_s``
(:class:`~diagnoser.sources.base.SingleFlight`). Credentials come from
:mod:`diagnoser.sources.kubernetes.credentials`, as for leader election.

Every failure comes back as a :class:`~diagnoser.models.SourceError` value that says what
happened and what to do: a 403 names the verb, resource, API group and namespace the role is
missing; a 404 on a list names the API group the cluster does not serve::

    source = KubernetesSource.from_settings(settings.kubernetes)
    pods = await source.list_objects("pods")                  # list[dict] | SourceError
    api = await source.get_object("apiservices", "v1beta1.metrics.k8s.io")   # dict | None | SourceError

Only the resources of :data:`diagnoser.sources.kubernetes.resources.RESOURCES` can be read, so
the ClusterRole in ``deploy/`` and the code cannot drift apart unnoticed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import urllib3

from diagnoser.config import KubernetesSettings
from diagnoser.models import SourceError
from diagnoser.sources.base import SingleFlight, run_blocking
from diagnoser.sources.kubernetes.credentials import Credentials, load_credentials
from diagnoser.sources.kubernetes.resources import RESOURCES, ResourceKind

__all__ = ["KubernetesSource", "ListResult", "ObjectResult"]

SOURCE = "kubernetes"
ListResult = list[dict[str, Any]] | SourceError
ObjectResult = dict[str, Any] | SourceError | None

#: Ask the API server for metadata only: secret values and big specs never cross the wire.
_METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
_MAX_PAGES = 10_000


class _HttpFailure(Exception):
    """A non-2xx answer, carried out of the worker thread to be described in context."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        super().__init__(status)


class _BadBody(Exception):
    """A 2xx answer that is not the JSON object the API documents."""


@dataclass(frozen=True)
class _Read:
    verb: str
    kind: ResourceKind
    namespace: str | None
    name: str | None = None

    @property
    def scope(self) -> str:
        if not self.kind.namespaced:
            return ""
        return f" in namespace {self.namespace}" if self.namespace else " in all namespaces"

    @property
    def what(self) -> str:
        group = f' in API group "{self.kind.group}"' if self.kind.group else ""
        target = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.kind.resource}{target}{group}{self.scope}"


class KubernetesSource:
    """The Kubernetes API, read-only, answering plain dicts or :class:`SourceError` values.

    Build it with :meth:`from_settings`; tests pass an ``ApiClient`` of their own.
    ``namespaces`` scopes every namespaced read (empty: all namespaces).
    """

    def __init__(
        self,
        api_client: Any,
        *,
        namespaces: Sequence[str] = (),
        timeout_s: float = 10.0,
        page_size: int = 500,
        cache_ttl_s: float = 5.0,
        max_concurrency: int = 4,
        identity: str = "the configured credentials",
    ) -> None:
        self._api = api_client
        self.namespaces: tuple[str, ...] = tuple(dict.fromkeys(namespaces))
        self.timeout_s = timeout_s
        self.page_size = page_size
        self.identity = identity
        self.max_concurrency = max_concurrency
        self._limits: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        # Checks evaluated concurrently share one request per read, and its answer for cache_ttl_s.
        self._flight = SingleFlight(ttl_s=cache_ttl_s)

    @classmethod
    def from_settings(
        cls, settings: KubernetesSettings, *, credentials: Credentials | None = None
    ) -> KubernetesSource:
        """A source over ``credentials`` (loaded already: the kubeconfig is read once per run),
        else load in-cluster or kubeconfig credentials; :class:`ConfigError` when they cannot load."""
        credentials = credentials or load_credentials(settings)
        return cls(
            credentials.api_client(),
            namespaces=settings.namespaces,
            timeout_s=settings.timeout_s,
            identity=credentials.identity,
        )

    @property
    def cache_ttl_s(self) -> float:
        """How long an answer is reused, counted from when it arrived."""
        return self._flight.ttl_s

    @cache_ttl_s.setter
    def cache_ttl_s(self, seconds: float) -> None:
        self._flight.ttl_s = seconds

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def close(self) -> None:
        self._flight.clear()
        self._limits.clear()
        self._api.close()

    async def aclose(self) -> None:
        """:meth:`close`, as every source closes (the client's pool closes synchronously)."""
        self.close()

    def _limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        for stale in [known for known in self._limits if known.is_closed()]:
            del self._limits[stale]
        return self._limits.setdefault(loop, asyncio.Semaphore(self.max_concurrency))

    async def list_objects(
        self,
        resource: str,
        *,
        namespaces: Sequence[str] | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
    ) -> ListResult:
        """Every object of ``resource`` in scope, as plain dicts (items of the API's list).

        ``namespaces`` overrides the configured scope for this read (``[]``: all namespaces);
        cluster-scoped resources ignore it. Any namespace failing fails the whole read: a
        partial list would make a check conclude things from missing data.
        """
        kind = _resource(resource, "list")
        scope: tuple[str, ...] = self.namespaces if namespaces is None else tuple(namespaces)
        targets: tuple[str | None, ...] = scope if (kind.namespaced and scope) else (None,)
        key = ("list", resource, targets, label_selector, field_selector, metadata_only)
        return await self._flight.run(
            key, lambda: self._list_all(kind, targets, label_selector, field_selector, metadata_only)
        )

    async def get_object(self, resource: str, name: str, namespace: str | None = None) -> ObjectResult:
        """One object, ``None`` when it does not exist, or a :class:`SourceError`."""
        kind = _resource(resource, "get")
        key = ("get", resource, namespace, name)
        return await self._flight.run(key, lambda: self._get(kind, name, namespace))

    async def _list_all(
        self,
        kind: ResourceKind,
        targets: tuple[str | None, ...],
        label_selector: str | None,
        field_selector: str | None,
        metadata_only: bool,
    ) -> ListResult:
        results = await asyncio.gather(
            *(self._list_one(kind, ns, label_selector, field_selector, metadata_only) for ns in targets)
        )
        items: list[dict[str, Any]] = []
        for result in results:
            if isinstance(result, SourceError):
                return result
            items.extend(result)
        return items

    async def _list_one(
        self,
        kind: ResourceKind,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        metadata_only: bool,
    ) -> ListResult:
        read = _Read("list", kind, namespace)
        items: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(_MAX_PAGES):
            query: list[tuple[str, Any]] = [("limit", self.page_size)]
            if token:
                query.append(("continue", token))
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            accept = _METADATA_ONLY if metadata_only else "application/json"
            try:
                page = await run_blocking(
                    self._fetch, kind.path(namespace), query, accept, limit=self._limit()
                )
            except Exception as exc:  # every client, socket and parse failure becomes data
                return self._error(read, exc)
            page_items = page.get("items")
            if not isinstance(page_items, list):
                return self._error(read, _BadBody("a list response without an items array"))
            items.extend(item for item in page_items if isinstance(item, dict))
            metadata = page.get("metadata")
            token = metadata.get("continue") if isinstance(metadata, dict) else None
            if not token:
                return items
        return self._error(read, _BadBody(f"more than {_MAX_PAGES} pages; the continue token never ended"))

    async def _get(self, kind: ResourceKind, name: str, namespace: str | None) -> ObjectResult:
        read = _Read("get", kind, namespace, name)
        try:
            return await run_blocking(
                self._fetch, kind.path(namespace, name), [], "application/json", limit=self._limit()
            )
        except _HttpFailure as failure:
            status = _status_object(failure.body)
            details = status.get("details") if status else None
            # A named object that does not exist is an answer ("absent"), not a failure; a 404
            # without the object's name means the API group or resource is not served at all.
            if failure.status == 404 and isinstance(details, dict) and details.get("name"):
                return None
            return self._error(read, failure)
        except Exception as exc:
            return self._error(read, exc)

    def _fetch(self, path: str, query: list[tuple[str, Any]], accept: str) -> dict[str, Any]:
        """One GET in a worker thread: the parsed JSON object, or an exception to describe."""
        request = self._api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(*request, _request_timeout=self.timeout_s)
        body = response.read()
        if not 200 <= response.status <= 299:
            raise _HttpFailure(response.status, body)
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _BadBody(f"not JSON ({_preview(body)})") from exc
        if not isinstance(parsed, dict):
            raise _BadBody(f"JSON {type(parsed).__name__}, expected an object ({_preview(body)})")
        return parsed

    def _error(self, read: _Read, exc: BaseException) -> SourceError:
        return SourceError(source=SOURCE, message=self._describe(read, exc))

    def _describe(self, read: _Read, exc: BaseException) -> str:
        if isinstance(exc, _HttpFailure):
            return self._describe_status(read, exc)
        if isinstance(exc, _BadBody):
            return f"invalid response to {read.what} from {self.host}: {exc}"
        # NewConnectionError subclasses ConnectTimeoutError in urllib3 2: test it first.
        if isinstance(exc, urllib3.exceptions.NewConnectionError | ConnectionError):
            return f"cannot connect to {self.host}: {_root_cause(exc)} ({read.what})"
        if isinstance(exc, urllib3.exceptions.TimeoutError):
            return f"timed out after {self.timeout_s:g}s: {read.what} ({self.host})"
        if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
            return f"{read.what} failed: {_root_cause(exc)} ({self.host})"
        return f"{read.what} failed: {type(exc).__name__}: {exc}"

    def _describe_status(self, read: _Read, failure: _HttpFailure) -> str:
        status = _status_object(failure.body)
        said = str(status.get("message", "")) if status else _preview(failure.body)
        kind = read.kind
        code = failure.status
        if code == 401:
            return (
                f"unauthorized (401): the API server rejected {self.identity} for {read.what}; "
                "the token or client certificate has expired or is invalid"
            )
        if code == 403:
            return (
                f"forbidden: {read.what} (grant get/list/watch on {kind.rbac_name} to the diagnoser "
                f"ServiceAccount; see deploy/kubernetes/clusterrole.yaml): {said}"
            )
        if code == 404:
            return (
                f"not found (404): {read.what}: the cluster does not serve {kind.resource} in "
                f'{kind.group_version} (API group "{kind.group}" missing or version not enabled): {said}'
            )
        if code == 410:
            return f"expired (410): {read.what}: the list changed too fast to page through; try again: {said}"
        if code == 429:
            return (
                f"throttled (429): {read.what}: the API server asks clients to slow down (not retried): "
                + said
            )
        return f"HTTP {code}: {read.what}: {said}"


def _resource(resource: str, verb: str) -> ResourceKind:
    kind = RESOURCES.get(resource)
    if kind is None or verb not in kind.verbs:
        # A programming error, not a source failure: the RBAC table must list every read.
        raise ValueError(
            f"{verb} {resource} is not declared in diagnoser.sources.kubernetes.resources.RESOURCES"
        )
    return kind


def _status_object(body: bytes) -> dict[str, Any] | None:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        return parsed
    return None


def _preview(body: bytes, limit: int = 80) -> str:
    text = body[:limit].decode("utf-8", errors="replace").strip()
    return repr(text + ("..." if len(body) > limit else ""))


def _root_cause(exc: BaseException) -> str:
    seen: BaseException = exc
    while True:
        reason = getattr(seen, "reason", None)
        nested = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
        if nested is None or nested is seen:
            break
        seen = nested
    text = str(seen)
    if "Connection refused" in text or isinstance(seen, ConnectionRefusedError):
        return "connection refused"
    return text or type(seen).__name__
