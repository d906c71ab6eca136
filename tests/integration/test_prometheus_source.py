"""PrometheusSource against a real Prometheus: result types, NaN/Inf, errors as values."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime
from typing import Any

import pytest

import diagnoser.sources.prometheus as prometheus_source
from diagnoser.config import PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.sources.prometheus import PrometheusSource, Sample, rewrite_metric_names
from tests.conftest import IncidentPrometheus


def query(prom: IncidentPrometheus, promql: str, **overrides: str) -> list[Sample] | SourceError:
    source = PrometheusSource(PrometheusSettings(url=prom.url), metric_overrides=dict(overrides))
    at = datetime.fromtimestamp(prom.start_s + 35 * 60, UTC)
    try:
        return asyncio.run(source.query(promql, at))
    finally:
        source.close()


def test_vector_scalar_nan_and_inf(incident_prometheus: IncidentPrometheus) -> None:
    vector = query(incident_prometheus, 'db_client_connection_max{db_client_connection_pool_name="orders-db"}')
    assert isinstance(vector, list) and len(vector) == 1
    assert vector[0].value == 10.0
    assert vector[0].labels["pod"] == "checkout-5d8c7-a"
    scalar = query(incident_prometheus, "scalar(vector(42))")
    assert scalar == [Sample(labels={}, value=42.0)]
    nan = query(incident_prometheus, "vector(0) / 0")
    assert isinstance(nan, list) and math.isnan(nan[0].value)
    inf = query(incident_prometheus, "vector(1) / 0")
    assert isinstance(inf, list) and inf[0].value == math.inf and not inf[0].is_finite
    assert query(incident_prometheus, 'up{job="no-such-job"}') == []


def test_range_vector_and_bad_query_are_errors(incident_prometheus: IncidentPrometheus) -> None:
    ranged = query(incident_prometheus, "db_client_connection_max[5m]")
    assert isinstance(ranged, SourceError)
    assert "range vector" in ranged.message
    broken = query(incident_prometheus, "sum(")
    assert isinstance(broken, SourceError)
    assert broken.message.startswith("HTTP 400: ")
    assert "parse error" in broken.message


def test_metric_overrides_rename_what_is_sent(incident_prometheus: IncidentPrometheus) -> None:
    renamed = query(incident_prometheus, "sum(pool_max_in_my_app)", pool_max_in_my_app="db_client_connection_max")
    assert isinstance(renamed, list) and renamed[0].value == 10.0


@pytest.mark.parametrize(
    ("promql", "overrides", "expected"),
    [
        ("rate(a_total[5m])", {"a_total": "b_total"}, "rate(b_total[5m])"),
        # A renamed query is printed from its syntax tree: the same query, in the printer's layout.
        ("sum(rate(h_bucket[5m])) by (le)", {"h": "x"}, "sum by (le) (rate(x_bucket[5m]))"),
        ('up{job="h"} + h_count', {"h": "x"}, 'up{job="h"} + x_count'),
        ("hh_bucket", {"h": "x"}, "hh_bucket"),
    ],
)
def test_rewrite_metric_names(promql: str, overrides: dict[str, str], expected: str) -> None:
    assert rewrite_metric_names(promql, overrides) == expected


def test_a_query_to_rename_that_does_not_parse_is_an_error_entry(incident_prometheus: IncidentPrometheus) -> None:
    broken = query(incident_prometheus, "sum(h_count", h="x")
    assert isinstance(broken, SourceError)
    assert "cannot rename metrics per config: PromQL does not parse" in broken.message
    assert "sum(h_count" in broken.message


def test_metric_names_at_an_instant(incident_prometheus: IncidentPrometheus) -> None:
    source = PrometheusSource(PrometheusSettings(url=incident_prometheus.url))
    during = datetime.fromtimestamp(incident_prometheus.start_s + 35 * 60, UTC)
    long_before = datetime.fromtimestamp(incident_prometheus.start_s - 30 * 86400, UTC)

    async def ask() -> tuple[object, object, object]:
        try:
            first, again = await asyncio.gather(source.metric_names(during), source.metric_names(during))
            return first, again, await source.metric_names(long_before)
        finally:
            await source.aclose()

    names, shared, before = asyncio.run(ask())
    assert isinstance(names, set)
    assert "db_client_connection_max" in names
    assert "http_server_request_duration_seconds_bucket" in names
    assert shared is names  # one call per instant, shared
    assert before == set()


def test_a_query_longer_than_a_url_can_carry_is_sent_as_a_post(incident_prometheus: IncidentPrometheus) -> None:
    # Recognition over thousands of families writes selectors this long: as a GET's URL it is past
    # httpx's 65,536-character limit (and any proxy's), and every rule reading it used to fail.
    jobs = "|".join(f"no-such-job-{i:05d}" for i in range(5000))
    promql = f'count(up{{job=~"{jobs}"}}) or vector(7)'
    assert len(promql) > 80_000
    answer = query(incident_prometheus, promql)
    assert answer == [Sample(labels={}, value=7.0)]
    source = PrometheusSource(PrometheusSettings(url=incident_prometheus.url))
    at = datetime.fromtimestamp(incident_prometheus.start_s + 35 * 60, UTC)
    try:
        names = asyncio.run(source.label_names(f'{{__name__="up", job=~"{jobs}|incident"}}', at))
    finally:
        source.close()
    assert not isinstance(names, SourceError), names


def query_each(prom: IncidentPrometheus, queries: list[str]) -> tuple[list[list[Sample] | SourceError], int]:
    """The answers of ``queries`` asked together, and how many requests that took."""
    source = PrometheusSource(PrometheusSettings(url=prom.url))
    at = datetime.fromtimestamp(prom.start_s + 35 * 60, UTC)
    sent: list[str] = []
    original = prometheus_source._send

    async def counted(client: Any, path: str, params: dict[str, str], wait_s: float) -> Any:
        sent.append(params.get("query", ""))
        return await original(client, path, params, wait_s)

    prometheus_source._send = counted  # type: ignore[assignment]
    try:
        return asyncio.run(source.query_each(queries, at)), len(sent)
    finally:
        prometheus_source._send = original  # type: ignore[assignment]
        source.close()


def test_queries_asked_together_answer_as_each_alone(incident_prometheus: IncidentPrometheus) -> None:
    # The same series under two queries (identical label sets, values apart), one that answers
    # nothing and a scalar-free computed one: one request, and each part's answer as if alone.
    queries = [
        "db_client_connection_max",
        "db_client_connection_max * 2",
        'up{job="no-such-job"}',
        "sum by (db_client_connection_pool_name) (db_client_connection_max)",
    ]
    together, requests = query_each(incident_prometheus, queries)
    assert requests == 1
    alone = [query(incident_prometheus, q) for q in queries]
    assert together == alone
    assert all(isinstance(a, list) for a in together) and together[2] == []
    assert [s.value * 2 for s in together[0]] == [s.value for s in together[1]]  # type: ignore[union-attr]


def test_one_bad_query_asked_together_fails_only_itself(incident_prometheus: IncidentPrometheus) -> None:
    # A scalar cannot be tagged, and a bad regular expression fails the union: each is then asked alone.
    queries = ["db_client_connection_max", "scalar(vector(42))", 'label_replace(up, "x", "$1", "job", "(")']
    answers, requests = query_each(incident_prometheus, queries)
    assert requests == 1 + len(queries)
    assert answers[0] == query(incident_prometheus, queries[0])
    assert answers[1] == [Sample(labels={}, value=42.0)]
    assert isinstance(answers[2], SourceError)
