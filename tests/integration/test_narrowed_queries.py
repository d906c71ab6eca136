"""A query narrowed to some jobs answers, on a real Prometheus, exactly the rows of the whole query
that carry one of those jobs or none (:func:`diagnoser.promql.restrict`).

The bed has three services in two namespaces, a series without a ``job``, histograms, counters and
a pool with its limit, so each way a label flows (or does not) through an aggregation, a function
and a vector match is answered by the server itself, and compared with the whole query's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from diagnoser.config import PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.promql import restrict
from diagnoser.promql.restrict import restricted_to_one
from diagnoser.sources.prometheus import PrometheusSource, Sample
from diagnoser.testing.prometheus import LocalPrometheus

pytestmark = pytest.mark.integration

START = 1_795_000_000
POINTS = 41  # ten minutes at 15 s
AT = datetime.fromtimestamp(START + 15 * (POINTS - 1), UTC)
JOBS = {"cart": "shop", "pay": "shop", "search": "web"}
KEPT = frozenset({"cart", "search"})


def _openmetrics() -> str:
    series: list[tuple[str, str, float]] = []
    for index, (job, namespace) in enumerate(JOBS.items()):
        for pod in range(2):
            target = f'job="{job}",namespace="{namespace}",pod="{job}-{pod}"'
            for code, rate in (("200", 10 + index), ("500", index * 0.5 + pod)):
                series.append(("req_total", f'{target},code="{code}"', rate))
            for le, share in (("0.1", 0.5 + index * 0.1), ("0.5", 0.9), ("+Inf", 1.0)):
                series.append(("lat_bucket", f'{target},le="{le}"', 10 * share))
            series.append(("pool_used", target, -(3 + index + pod)))
            series.append(("pool_max", f'job="{job}",namespace="{namespace}"', -10.0))
    # A series with no job at all (remote-written): its rows agree with every candidate.
    series.append(("pool_used", 'namespace="shop",pod="batch-0"', -4.0))
    series.append(("pool_max", 'namespace="shop"', -9.0))
    samples = []
    for name, labels, step in series:
        for i in range(POINTS):
            # A negative step is a gauge's constant value; a positive one a counter's increment.
            value = -step if step < 0 else step * i
            samples.append(f"{name}{{{labels}}} {value:g} {START + 15 * i}\n")
    return "".join(samples) + "# EOF\n"


@pytest.fixture(scope="module")
def source() -> Iterator[PrometheusSource]:
    with LocalPrometheus(openmetrics=_openmetrics()) as prometheus:
        source = PrometheusSource(PrometheusSettings(url=prometheus.url))
        yield source
        source.close()


QUERIES = [
    # Aggregations that keep the job, and ones that do not (left whole).
    "sum by (namespace, job) (rate(req_total[5m]))",
    "sum without (pod, code) (rate(req_total[5m]))",
    "sum by (namespace) (rate(req_total[5m]))",
    "topk(2, rate(req_total[5m]))",
    'topk by (job) (1, rate(req_total{code="500"}[5m]))',  # no ties: the server's pick is the same
    "histogram_quantile(0.9, sum by (job, le) (rate(lat_bucket[5m])))",
    # Ratios matched on the job, and on other labels.
    'sum by (job) (rate(req_total{code="500"}[5m])) / on (job) sum by (job) (rate(req_total[5m]))',
    "sum by (namespace, job, pod) (pool_used) / on (namespace, job) group_left () max by (namespace, job) (pool_max)",
    "pool_used / on (namespace) group_left () max by (namespace) (pool_max)",
    'pool_used / on (namespace) group_left (job) max by (namespace, job) (pool_max{job=~"pay|search"})',
    "sum by (namespace, job) (pool_used) / on (namespace) group_left () sum by (namespace) (pool_used)",
    "sum by (namespace, job) (pool_used) > on (namespace) group_left () (max by (namespace) (pool_max) * 0)",
    "max by (namespace) (pool_max) * on (namespace) group_right () pool_used",
    "sum by (namespace, pod) (pool_used) / on (namespace) group_left () sum by (namespace) (pool_used)",
    # A side that carries its job, matched on other labels: narrowing it would change its partners.
    'pool_used / on (namespace) group_left () max by (namespace, job) (pool_max{job=~"pay|search"})',
    'pool_used and on (namespace) max by (namespace, job) (pool_max{job="pay"})',
    'rate(req_total{code="200", job="pay"}[5m]) or on (namespace) rate(req_total{code="500"}[5m])',
    # Set operators.
    "pool_used and on (namespace) pool_max",
    "pool_used unless on (job) (pool_used > 4)",
    'rate(req_total{code="200"}[5m]) or on (namespace) rate(req_total{code="500"}[5m])',
    "pool_used or on (namespace, job) pool_max",
    "pool_used or vector(0)",
    # Functions over the job, and those writing it.
    'label_replace(pool_used, "job", "x", "pod", ".*")',
    'label_replace(pool_used, "owner", "$1", "job", "(.*)")',
    "max_over_time((sum by (namespace, job) (pool_used) / max by (namespace, job) (pool_max))[5m:15s])",
    "absent(pool_used{pod=\"cart-0\"})",
    "count_values by (job) (\"used\", pool_used)",
    "scalar(sum(pool_max)) - sum by (job) (pool_used)",
]


def _answer(source: PrometheusSource, query: str) -> list[Sample]:
    samples = asyncio.run(source.query(query, AT, share=False))
    assert not isinstance(samples, SourceError), (query, samples)
    return samples


def _rows(samples: list[Sample]) -> set[tuple[tuple[tuple[str, str], ...], float]]:
    return {(tuple(sorted(s.labels.items())), round(s.value, 9)) for s in samples}


def _kept(samples: list[Sample]) -> set[tuple[tuple[tuple[str, str], ...], float]]:
    """The rows a candidate of the kept jobs can agree with: those jobs' and those with none."""
    return _rows([s for s in samples if s.labels.get("job", "") in KEPT | {""}])


@pytest.mark.parametrize("query", QUERIES)
def test_a_narrowed_query_answers_the_kept_rows_of_the_whole(source: PrometheusSource, query: str) -> None:
    narrowed = restrict(query, "job", KEPT)
    assert _kept(_answer(source, narrowed)) == _kept(_answer(source, query)), narrowed


def test_narrowing_reads_fewer_series_where_the_job_flows() -> None:
    # The test above cannot fail by narrowing nothing; these say where the matcher goes.
    assert 'req_total{code="500", job=~"cart|search|"}' in restrict(QUERIES[6], "job", KEPT)
    assert restrict(QUERIES[2], "job", KEPT) == QUERIES[2]
    assert restrict(QUERIES[8], "job", KEPT).count("job=~") == 1  # the many side only
    assert "pool_max{job=~" in restrict(QUERIES[9], "job", KEPT)  # group_left copies the job
    assert restrict(QUERIES[16], "job", KEPT) == QUERIES[16]
    assert restrict("absent(x)", "job", KEPT) == "absent(x)"
    assert restrict('x{job="a"}', "job", {"a.b"}) == 'x{job="a", job=~"a\\\\.b|"}'


@pytest.mark.parametrize("query", QUERIES)
def test_evidence_of_one_candidate_shows_its_own_job(query: str) -> None:
    # What a row's evidence shows: the query as narrowed to that row's job alone.
    narrowed = restrict(query, "job", KEPT)
    assert restricted_to_one(narrowed, "job", KEPT, "cart") == restrict(query, "job", {"cart"})


def test_narrowing_keeps_utf8_names_and_native_histogram_reads() -> None:
    # A Prometheus 3 UTF-8 family keeps its quoted name; the native rewrite that follows (the
    # source reads a histogram as held) keeps the job matcher the narrowing added.
    from diagnoser.promql import parse, read_histograms

    utf8 = 'sum by (job) (rate({"http.server.request.duration_count", "http.route"="/x"}[5m]))'
    narrowed = restrict(utf8, "job", KEPT)
    assert '{"http.server.request.duration_count", "http.route"="/x", job=~"cart|search|"}' in narrowed
    parse(narrowed)
    quantile = "histogram_quantile(0.99, sum by (job, le) (rate(lat_bucket[5m])))"
    native = read_histograms(restrict(quantile, "job", KEPT), lambda base: "native")
    assert 'lat{job=~"cart|search|"}' in native, native
