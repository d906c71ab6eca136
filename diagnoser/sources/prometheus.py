"""PromQL over HTTP (Prometheus, Thanos, Mimir, VictoriaMetrics) through an async ``httpx`` client.

Every query is a native coroutine with its own timeout, sent to Prometheus (``timeout=``, so the
server stops evaluating and says so) and, half a second longer, to the socket (httpx): a socket
timeout then means the server is stuck, not the query slow. The engine's deadline cancels a query
outright, so no thread outlives a diagnosis and the process exits when the report is printed.
Nothing raises: every failure comes back as a :class:`~diagnoser.models.SourceError` whose
message names one cause (a body is summarised by its status and content type, never dumped), so
the same cause met by thirty rules collapses into one report entry. When the endpoint itself is
unusable (refused, stuck, not a Prometheus API, credentials rejected) the source remembers it for a few
seconds and answers further queries with the same error instead of asking again. There are no
retries: a diagnosis runs under one deadline, and backing off on a struggling Prometheus only adds
load and delay.

Every query is sent as the server holds its histograms: a query written the classic way
(``x_bucket``, ``x_count``, ``x_sum``) reads a family that Prometheus 3 holds as a native histogram
through ``histogram_quantile``/``histogram_count``/``histogram_sum`` instead, and one held both
ways through ``(native or classic)`` (:func:`diagnoser.promql.read_histograms`), decided by the
metric names at the instant. Answers may carry native histograms (``histogram`` in place of
``value``): a :class:`Sample` then holds the :class:`NativeHistogram` and its count as value.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote as quote_path
from urllib.parse import urlencode

import httpx

from diagnoser.config import PrometheusSettings
from diagnoser.errors import ExpressionError, PromqlSyntaxError
from diagnoser.models import SourceError
from diagnoser.promql import (
    TYPE_AND_UNIT_LABELS,
    Kind,
    histogram_bases,
    kind_from_names,
    numbers_as_numbers,
    reach_seconds,
    read_histograms,
    rename_metrics,
    without_type_and_unit,
)
from diagnoser.redact import redact_url, scrub_text
from diagnoser.sources.base import SingleFlight

__all__ = ["HistogramBucket", "NativeHistogram", "PrometheusSource", "Sample", "rewrite_metric_names"]

SOURCE = "prometheus"
#: Answers kept between runs (a diagnosis keeps all of its own: :meth:`PrometheusSource.holding_answers`).
_SHARED_ANSWERS = 256
#: How long an endpoint-level failure (refused, not Prometheus, unauthorised) answers for the
#: endpoint without asking it again: one diagnosis' burst of queries, not the daemon's next run.
_ENDPOINT_FAILURE_MEMORY_S = 5.0

#: Metric names that decide a histogram's kind are looked up this long before what a query reads.
_NAMES_LOOKBACK_S = 300.0

#: How much longer the socket waits than the ``timeout=`` Prometheus is given.
_SERVER_TIMEOUT_SLACK_S = 0.5

#: Longest query string sent in a GET's URL. Longer ones (recognition over thousands of families,
#: a selector listing many series) go as a form-encoded POST, which ``/api/v1/query`` and
#: ``/api/v1/labels`` accept on Prometheus and on the compatible servers (Thanos, Mimir,
#: VictoriaMetrics): httpx refuses URLs over 65,536 characters, and proxies in front of Prometheus
#: commonly refuse request lines over 8 KiB (nginx's ``large_client_header_buffers``), so 4 KiB.
_GET_QUERY_LIMIT = 4096
#: The endpoints that take their parameters as a POST body too.
_POSTABLE = frozenset({"/api/v1/query", "/api/v1/query_range", "/api/v1/labels", "/api/v1/series"})

T = TypeVar("T")
_CLOSING: set[asyncio.Task[None]] = set()


@dataclass(frozen=True)
class HistogramBucket:
    """One bucket of a native histogram as the query API writes it: bounds, which ends are
    inclusive (``0`` open left, ``1`` open right, ``2`` open both, ``3`` closed both) and count."""

    boundaries: int
    lower: float
    upper: float
    count: float


@dataclass(frozen=True)
class NativeHistogram:
    """A native histogram sample: its count, sum and populated buckets."""

    count: float
    sum: float
    buckets: tuple[HistogramBucket, ...] = ()


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector (or a scalar, with no labels).

    For a native histogram sample, ``histogram`` holds it and ``value`` is its count.
    """

    labels: dict[str, str]
    value: float
    histogram: NativeHistogram | None = None

    @property
    def is_finite(self) -> bool:
        return math.isfinite(self.value)


class _EndpointFailure(Exception):
    """The endpoint cannot serve any query (as opposed to one query failing)."""


class _QueryFailure(Exception):
    """This query failed; others may still succeed."""


@dataclass
class PrometheusSource:
    """Instant queries and metric names against one PromQL endpoint.

    >>> source = PrometheusSource(PrometheusSettings(url="http://127.0.0.1:9090"))
    >>> samples = await source.query("up == 0", at=datetime.now(UTC))   # doctest: +SKIP
    >>> await source.aclose()                                           # doctest: +SKIP
    """

    settings: PrometheusSettings
    metric_overrides: dict[str, str] = field(default_factory=dict)
    _client: httpx.AsyncClient | None = field(init=False, repr=False, default=None)
    _client_loop: asyncio.AbstractEventLoop | None = field(init=False, repr=False, default=None)
    _semaphore: asyncio.Semaphore | None = field(init=False, repr=False, default=None)
    #: Answers keyed by query and instant: rules asking the same thing share one request.
    _shared: SingleFlight = field(
        init=False, repr=False, default_factory=lambda: SingleFlight(max_entries=_SHARED_ANSWERS)
    )
    _endpoint_failure: tuple[float, SourceError] | None = field(init=False, repr=False, default=None)
    #: The text each query was last sent as, by query and instant (histograms read as held).
    _sent: dict[tuple[str, float], str] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not self.settings.url:
            raise ValueError("PrometheusSource needs a URL")
        parsed = httpx.URL(self.settings.url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"{redact_url(str(self.settings.url))!r} is not an http(s) URL")
        if self.settings.ca_file is not None and not self.settings.ca_file.is_file():
            raise ValueError(f"ca_file {self.settings.ca_file} does not exist")

    @property
    def url(self) -> str:
        """The endpoint fit to print: credentials in it replaced by ``***``."""
        return redact_url(str(self.settings.url).rstrip("/"))

    def _make_client(self) -> httpx.AsyncClient:
        verify: ssl.SSLContext | bool = self.settings.verify_tls
        if self.settings.ca_file is not None and self.settings.verify_tls:
            verify = ssl.create_default_context(cafile=str(self.settings.ca_file))
        headers = dict(self.settings.headers)
        if self.settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.settings.bearer_token.get_secret_value()}"
        auth: httpx.BasicAuth | None = None
        if self.settings.basic_auth is not None:
            auth = httpx.BasicAuth(
                self.settings.basic_auth.username, self.settings.basic_auth.password.get_secret_value()
            )
        limits = httpx.Limits(
            max_connections=self.settings.max_concurrency,
            max_keepalive_connections=self.settings.max_concurrency,
        )
        # The real URL (credentials and all): self.url is only for what is printed. Its path is
        # the API's prefix; its query string (a tenant, an access token) goes with every request,
        # since httpx would otherwise paste the request's path after it.
        endpoint = httpx.URL(str(self.settings.url))
        return httpx.AsyncClient(
            base_url=endpoint.copy_with(query=None, fragment=None),
            params=endpoint.params,
            headers=headers,
            auth=auth,
            verify=verify,
            limits=limits,
            timeout=self.settings.query_timeout_s,
            trust_env=False,
            follow_redirects=False,
        )

    def _client_for_loop(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        # An httpx client's connections belong to the event loop that opened them; a source used
        # from several asyncio.run() calls (tests, rule tests) gets a client per loop.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._semaphore is None:
            self._client = self._make_client()
            self._client_loop = loop
            self._semaphore = asyncio.Semaphore(self.settings.max_concurrency)
        return self._client, self._semaphore

    async def aclose(self) -> None:
        """Cancel the queries nobody waits for any more, close the HTTP client (its pooled connections)."""
        self._cancel_shared()
        client, loop = self._client, self._client_loop
        self._client = self._client_loop = self._semaphore = None
        if client is not None and loop is asyncio.get_running_loop():
            await client.aclose()

    def close(self) -> None:
        """Forget the client; from a running loop, close it in the background.

        Outside an event loop the loop the client belonged to is gone, and with it its
        connections' transports, so there is nothing left to close politely.
        """
        self._cancel_shared()
        client, loop = self._client, self._client_loop
        self._client = self._client_loop = self._semaphore = None
        if client is None or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is loop:
            closing = running.create_task(client.aclose())
            _CLOSING.add(closing)  # a task nobody references may be collected before it runs
            closing.add_done_callback(_CLOSING.discard)

    def _cancel_shared(self) -> None:
        # Shared answers outlive the rules that gave up on them (shield); closing ends them.
        self._shared.clear()

    def prepare(self, query: str, at: datetime | None = None) -> str:
        """The query as it is sent: metric names renamed per config and, once it was sent for
        the instant ``at``, histograms read the way the server holds them there."""
        if at is not None:
            sent = self._sent.get((query, at.timestamp()))
            if sent is not None:
                return sent
        return rewrite_metric_names(query, self.metric_overrides)

    async def _as_held(self, query: str, at: datetime) -> str:
        """``query`` reading its histograms as the metric names around ``at`` say they are held."""
        if not histogram_bases(query):
            return query
        # The instant's names (the list every rule shares) decide each family's kind. What a query
        # reads further back (a baseline an hour ago) may predate a change of kind: a family held
        # native now is read both ways there, which costs no round trip and never counts twice.
        names = await self.metric_names(at, _NAMES_LOOKBACK_S)
        if isinstance(names, SourceError):
            return query  # the query fails or answers as written; the names' error is reported there
        beyond = reach_seconds(query) > _NAMES_LOOKBACK_S

        def kind(base: str) -> Kind | None:
            held = kind_from_names(base, names)
            return "both" if held == "native" and beyond else held

        return read_histograms(query, kind)

    async def query(
        self, query: str, at: datetime, timeout_s: float | None = None, *, share: bool = True
    ) -> list[Sample] | SourceError:
        """Evaluate ``query`` at instant ``at``; samples, or a SourceError saying what went wrong.

        Rules share queries (a service's request rate, a pool's size): the same query at the same
        instant is sent once and its answer shared, while in flight and for a while after
        (``share=False`` always asks Prometheus).
        """
        prepared = await self._prepared(query, at)
        if isinstance(prepared, SourceError):
            return prepared
        return await self._evaluate(prepared, at, timeout_s, share)

    async def query_each(
        self, queries: Sequence[str], at: datetime, timeout_s: float | None = None
    ) -> list[list[Sample] | SourceError]:
        """Each of ``queries`` at ``at`` (the answers in their order), asked in one request.

        One condition read over many families (each recognised histogram, each resource with a
        limit) is one query per family: sent apart, their number grows with the server's families
        rather than with the rules. They go as one union instead, each part's answers tagged with
        its index, ``label_replace(q0, "diagnoser_part", "0", "", "") or label_replace(q1, ...)``,
        which leaves each part's own series and labels as they are (the tag differs, so ``or``
        keeps them all) and is split again here. Each part is remembered as sent on its own
        (:meth:`prepare`: what evidence shows). When the union fails (one part's many-to-many
        match, a scalar, too many samples together), each part is asked alone, so one bad part
        fails only itself. Past :data:`_UNION_CHARS` of PromQL the parts go as several unions.
        """
        if len(queries) < 2:
            return [await self.query(query, at, timeout_s) for query in queries]
        prepared = [await self._prepared(query, at) for query in queries]
        batches: list[list[int]] = []
        size = 0
        for index, part in enumerate(prepared):
            if isinstance(part, SourceError):
                continue
            if not batches or size + len(part) > _UNION_CHARS:
                batches.append([])
                size = 0
            batches[-1].append(index)
            size += len(part)
        answers: list[list[Sample] | SourceError] = [
            part if isinstance(part, SourceError) else [] for part in prepared
        ]
        # Batches go concurrently, as separate queries would: the server evaluates each on a core.
        done = await asyncio.gather(
            *(self._union_of([queries[i] for i in batch], [str(prepared[i]) for i in batch], at, timeout_s)
              for batch in batches)
        )  # fmt: skip
        for batch, each in zip(batches, done, strict=True):
            for index, answer in zip(batch, each, strict=True):
                answers[index] = answer
        return answers

    async def _union_of(
        self, queries: list[str], prepared: list[str], at: datetime, timeout_s: float | None
    ) -> list[list[Sample] | SourceError]:
        """The answers of ``queries`` (sent as ``prepared``) from one union, or each asked alone."""
        union = await self._evaluate(_union(prepared), at, timeout_s, True) if len(prepared) > 1 else None
        if union is None or isinstance(union, SourceError):
            return list(await asyncio.gather(*(self.query(query, at, timeout_s) for query in queries)))
        answers: list[list[Sample]] = [[] for _ in prepared]
        for sample in union:
            part = sample.labels.get(_PART_LABEL, "")
            if part.isdigit() and int(part) < len(answers):
                labels = {k: v for k, v in sample.labels.items() if k != _PART_LABEL}
                answers[int(part)].append(replace(sample, labels=labels))
        return list(answers)

    async def _prepared(self, query: str, at: datetime) -> str | SourceError:
        """``query`` as it is sent at ``at`` (renamed per config, histograms read as held), remembered."""
        try:
            prepared = self.prepare(query)
        except ExpressionError as exc:  # metric overrides to apply to a query the parser cannot read
            return SourceError(source=SOURCE, message=f"cannot rename metrics per config: {exc}")
        # A query the parser cannot read goes as written: Prometheus says what is wrong with it.
        with contextlib.suppress(PromqlSyntaxError):
            prepared = numbers_as_numbers(without_type_and_unit(await self._as_held(prepared, at)))
        self._remember_sent(query, at, prepared)
        return prepared

    async def _evaluate(
        self, prepared: str, at: datetime, timeout_s: float | None, share: bool
    ) -> list[Sample] | SourceError:
        timeout = timeout_s or self.settings.query_timeout_s
        params = {"query": prepared, "time": f"{at.timestamp():.3f}", "timeout": f"{timeout:g}s"}

        async def ask() -> list[Sample] | SourceError:
            return await self._call("/api/v1/query", params, timeout, _samples_from, prepared)

        if not share:
            return await ask()
        return await self._shared.run(("query", prepared, at.timestamp(), timeout), ask)

    async def metric_names(self, at: datetime, lookback_s: float = 300.0) -> set[str] | SourceError:
        """Names of the metrics with samples in ``[at - lookback_s, at]``, or a SourceError.

        One ``GET /api/v1/label/__name__/values`` call, shared by every caller asking about the
        same instant. Prometheus answers from the blocks overlapping the range, so a name can
        appear whose samples are near but not inside it: a superset, never a subset.
        """
        start = at.timestamp() - lookback_s
        params = {"start": f"{start:.3f}", "end": f"{at.timestamp():.3f}"}
        timeout = self.settings.query_timeout_s

        async def ask() -> set[str] | SourceError:
            return await self._call("/api/v1/label/__name__/values", params, timeout, _names_from, None)

        return await self._shared.run(("names", at.timestamp(), lookback_s), ask)

    async def label_names(
        self, match: str, at: datetime, lookback_s: float = 300.0
    ) -> list[str] | SourceError:
        """``GET /api/v1/labels?match[]=...``: the label names of the series ``match`` selects in
        ``[at - lookback_s, at]`` (a Prometheus 3 UTF-8 family's ``http.route``...), shared per instant."""
        start = at.timestamp() - lookback_s
        params = {"match[]": match, "start": f"{start:.3f}", "end": f"{at.timestamp():.3f}"}
        timeout = self.settings.query_timeout_s

        async def ask() -> list[str] | SourceError:
            return await self._call("/api/v1/labels", params, timeout, _label_names_from, match)

        return await self._shared.run(("labels", match, at.timestamp(), lookback_s), ask)

    async def label_values(
        self, label: str, match: str, at: datetime, lookback_s: float = 300.0
    ) -> list[str] | SourceError:
        """``GET /api/v1/label/<label>/values?match[]=...``: the values ``label`` takes on the series
        ``match`` selects in ``[at - lookback_s, at]``, read from the index (no samples), shared
        per instant. Like the name list, a superset: blocks overlapping the range answer whole."""
        start = at.timestamp() - lookback_s
        params = {"match[]": match, "start": f"{start:.3f}", "end": f"{at.timestamp():.3f}"}
        timeout = self.settings.query_timeout_s
        path = f"/api/v1/label/{quote_path(label, safe='')}/values"

        async def ask() -> list[str] | SourceError:
            return await self._call(path, params, timeout, _label_values_from, match)

        return await self._shared.run(("values", label, match, at.timestamp(), lookback_s), ask)

    async def metadata(self, at: datetime) -> dict[str, dict[str, str]] | SourceError:
        """``GET /api/v1/metadata``: type, unit and help per metric family (the first entry of each).

        Prometheus serves it only for targets it scrapes now (nothing for backfilled data or past
        targets) and VictoriaMetrics answers ``{}``: an empty answer is normal, not an error.
        Asked once per evaluation instant ``at`` (the metadata has no time of its own), like the
        metric-name list.
        """
        timeout = self.settings.query_timeout_s

        async def ask() -> dict[str, dict[str, str]] | SourceError:
            return await self._call("/api/v1/metadata", {}, timeout, _metadata_from, None)

        return await self._shared.run(("metadata", at.timestamp()), ask)

    async def shared(self, key: tuple[object, ...], start: Callable[[], Awaitable[T]]) -> T:
        """The answer of ``start()`` for ``key``, computed once and shared with every caller that
        asks while this source is open (as the metric-name list is): for what is derived from
        this source's answers at one instant, such as the signals recognised there."""
        return await self._shared.run(("derived", *key), start)

    async def _call(
        self,
        path: str,
        params: dict[str, str],
        timeout_s: float,
        parse: Callable[[Any], T],
        query: str | None,
    ) -> T | SourceError:
        timeout = timeout_s
        remembered = self._remembered_failure()
        if remembered is not None:
            return remembered
        client, semaphore = self._client_for_loop()
        try:
            async with semaphore:
                # Queued behind others: one of them may have found the endpoint unusable meanwhile.
                remembered = self._remembered_failure()
                if remembered is not None:
                    return remembered
                # The socket waits a little longer than Prometheus' own timeout, so a slow query
                # comes back as Prometheus' 503 (that query's problem) and a socket timeout means
                # the server itself is stuck: an endpoint failure, not asked again this run.
                response = await _send(client, path, params, timeout + _SERVER_TIMEOUT_SLACK_S)
            return parse(_api_data(response, self.url, query))
        except _EndpointFailure as exc:
            return self._remember(str(exc))
        except _QueryFailure as exc:
            return self._error(str(exc))
        except httpx.TimeoutException:
            # Queries in flight when the endpoint proved unusable fail of that, not of their own.
            return self._remembered_failure() or self._remember(
                f"no answer within {timeout:g}s from {self.url}"
            )
        except httpx.ConnectError as exc:
            return self._remember(f"cannot connect to {self.url}: {_root_cause(exc)}")
        except (httpx.HTTPError, httpx.InvalidURL, ssl.SSLError, OSError) as exc:
            return self._error(f"request to {self.url} failed: {_root_cause(exc)}")
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return self._error(f"unexpected result shape from {self.url}: {exc}")

    @contextlib.contextmanager
    def holding_answers(self) -> Iterator[None]:
        """Share every answer of the block (one diagnosis) however many it asks: nothing is
        evicted for room until it ends (:meth:`SingleFlight.holding`)."""
        try:
            with self._shared.holding():
                yield
        finally:
            self._trim_sent()

    def _remember_sent(self, query: str, at: datetime, sent: str) -> None:
        self._sent[(query, at.timestamp())] = sent
        self._trim_sent()

    def _trim_sent(self) -> None:
        while not self._shared.held and len(self._sent) > _SHARED_ANSWERS:
            self._sent.pop(next(iter(self._sent)))

    def _remembered_failure(self) -> SourceError | None:
        if self._endpoint_failure is None:
            return None
        until, error = self._endpoint_failure
        if time.monotonic() < until:
            return error
        self._endpoint_failure = None
        return None

    def _remember(self, message: str) -> SourceError:
        error = SourceError(source=SOURCE, message=scrub_text(message), scope="endpoint")
        self._endpoint_failure = (time.monotonic() + _ENDPOINT_FAILURE_MEMORY_S, error)
        return error

    def _error(self, message: str) -> SourceError:
        return SourceError(source=SOURCE, message=scrub_text(message))


async def _send(
    client: httpx.AsyncClient, path: str, params: dict[str, str], wait_s: float
) -> httpx.Response:
    """A GET, or a form POST when the parameters would make the URL too long for the path."""
    if path in _POSTABLE and len(urlencode(params)) > _GET_QUERY_LIMIT:
        return await client.post(path, data=params, timeout=wait_s)
    return await client.get(path, params=params, timeout=wait_s)


#: The label :meth:`PrometheusSource.query_each` tags each part's answers with.
_PART_LABEL = "diagnoser_part"
#: The most PromQL one union carries (each query of a condition over hundreds of families is a few
#: hundred characters): more go as further unions, concurrently.
_UNION_CHARS = 64_000


def _union(parts: Sequence[str]) -> str:
    """One query answering each of ``parts``, every answer tagged with its part's index."""
    return " or ".join(
        f'label_replace({part}, "{_PART_LABEL}", "{index}", "", "")' for index, part in enumerate(parts)
    )


def _api_data(response: httpx.Response, url: str, query: str | None) -> Any:
    """The ``data`` of a Prometheus API envelope, or a failure naming one cause."""
    content_type = response.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or payload.get("status") not in ("success", "error"):
        # A login page, a proxy's error page, the wrong port: summarise, never dump the body.
        raise _EndpointFailure(f"{url} is not a Prometheus API: HTTP {response.status_code} {content_type}")
    if payload["status"] == "success" and response.is_success:
        return payload.get("data")
    detail = str(payload.get("error") or payload.get("errorType") or "error")[:300]
    status = response.status_code
    if status in (401, 403):
        raise _EndpointFailure(f"HTTP {status}: {detail} ({url})")
    if status == 404:
        raise _EndpointFailure(f"{url} is not a Prometheus API: HTTP 404: {detail}")
    where = f": {_short(query)}" if query else ""
    raise _QueryFailure(f"HTTP {status}: {detail}{where}")


def _samples_from(data: Any) -> list[Sample]:
    """Instant-query ``data`` as samples; handles vector and scalar result types."""
    if not isinstance(data, dict):
        raise TypeError(f"data is a {type(data).__name__}, expected an object")
    result = data["result"]
    if data.get("resultType") == "matrix":
        raise ValueError("a range vector came back: rules must use instant vectors")
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        return [Sample(labels={}, value=float(result[1]))]  # scalar: [ts, "value"]
    if not isinstance(result, list):
        raise TypeError(f"result is a {type(result).__name__}, expected a list")
    samples: list[Sample] = []
    for item in result:
        # Prometheus 3's __type__/__unit__ describe a series; they are not who it is.
        labels = {str(k): str(v) for k, v in item.get("metric", {}).items() if k not in TYPE_AND_UNIT_LABELS}
        if "value" in item:
            samples.append(Sample(labels=labels, value=float(item["value"][1])))
        elif "histogram" in item:  # a native histogram: [ts, {count, sum, buckets}]
            histogram = native_histogram(item["histogram"][1])
            samples.append(Sample(labels=labels, value=histogram.count, histogram=histogram))
        else:
            raise ValueError("a range vector came back: rules must use instant vectors")
    return samples


def native_histogram(data: Any) -> NativeHistogram:
    """A native histogram as the query API writes it (``{"count": "3", "sum": "0.5", "buckets":
    [[boundaries, "lower", "upper", "count"], ...]}``), in ``histogram`` and ``histograms``."""
    if not isinstance(data, dict):
        raise TypeError(f"a histogram is a {type(data).__name__}, expected an object")
    buckets = tuple(
        HistogramBucket(int(b[0]), float(b[1]), float(b[2]), float(b[3])) for b in data.get("buckets") or ()
    )
    return NativeHistogram(count=float(data["count"]), sum=float(data["sum"]), buckets=buckets)


def _names_from(data: Any) -> set[str]:
    if not isinstance(data, list):
        raise TypeError(f"label values are a {type(data).__name__}, expected a list")
    return {str(name) for name in data}


def _label_values_from(data: Any) -> list[str]:
    if not isinstance(data, list):
        raise TypeError(f"label values are a {type(data).__name__}, expected a list")
    return sorted(str(value) for value in data)


def _label_names_from(data: Any) -> list[str]:
    if not isinstance(data, list):
        raise TypeError(f"label names are a {type(data).__name__}, expected a list")
    return sorted(str(name) for name in data)


def _metadata_from(data: Any) -> dict[str, dict[str, str]]:
    if not isinstance(data, dict):
        raise TypeError(f"metadata is a {type(data).__name__}, expected an object")
    found: dict[str, dict[str, str]] = {}
    for name, entries in data.items():
        if isinstance(entries, list) and entries and isinstance(entries[0], dict):
            found[str(name)] = {key: str(entries[0].get(key) or "") for key in ("type", "unit", "help")}
    return found


def _root_cause(exc: BaseException) -> str:
    seen: BaseException = exc
    while True:
        nested = seen.__cause__ or seen.__context__
        if nested is None or nested is seen:
            break
        seen = nested
    text = str(seen) or type(seen).__name__
    if "Connection refused" in text or isinstance(seen, ConnectionRefusedError):
        return "connection refused"
    return text[:300]


def _short(query: str, limit: int = 160) -> str:
    flat = " ".join(query.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def rewrite_metric_names(query: str, overrides: dict[str, str]) -> str:
    """Rename metrics in ``query`` per ``overrides`` (exporter name -> installed name).

    A histogram or counter's series follow their base name: overriding
    ``http_server_request_duration_seconds`` renames its ``_bucket``, ``_count`` and ``_sum``.
    String literals are left alone (:func:`diagnoser.promql.rename_metrics`, on the syntax tree).
    """
    return rename_metrics(query, overrides)
