"""The signal catalogue and how a rule query becomes PromQL per convention (pure; real PromQL is
checked against a real Prometheus by ``rules lint`` in tests/integration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.errors import ConfigError
from diagnoser.signals import expansions, load_catalogue, normalise_labels, validate_template
from diagnoser.signals.expand import required_metrics
from tests.conftest import run_cli

USED_SHARE = (
    "max by (namespace, service, pool) (avg_over_time({{pool.used}}[5m]))"
    " / max by (namespace, service, pool) (avg_over_time({{pool.max}}[5m]) > 0)"
)


def by_convention(template: str, present: set[str] | None = None) -> dict[str, str]:
    return {e.convention.name: e.query for e in expansions(template, load_catalogue(), present)}


def test_each_convention_gets_its_names_and_labels() -> None:
    queries = by_convention(USED_SHARE)
    assert queries["otel-semconv"] == (
        'max by (namespace, job, db_client_connection_pool_name) (avg_over_time('
        'db_client_connection_count{db_client_connection_state="used"}[5m]))'
        " / max by (namespace, job, db_client_connection_pool_name) (avg_over_time(db_client_connection_max[5m]) > 0)"
    )
    assert "hikaricp_connections_active[5m]" in queries["hikaricp-micrometer"]
    assert "by (namespace, job, pool)" in queries["hikaricp-micrometer"]
    assert "go_sql_in_use_connections" in queries["go-sql"] and "db_name" in queries["go-sql"]
    # Conventions without a maximum cannot answer a used/max query.
    assert "pgbouncer-exporter" not in queries and "envoy" not in queries


def test_only_conventions_whose_metrics_exist_are_asked() -> None:
    present = {"hikaricp_connections_active", "hikaricp_connections_max", "up"}
    assert list(by_convention(USED_SHARE, present)) == ["hikaricp-micrometer"]
    assert by_convention(USED_SHARE, {"up"}) == {}


def test_go_redis_needs_its_own_metric_to_be_told_from_older_otel() -> None:
    shared = {"db_client_connections_usage", "db_client_connections_max"}
    assert list(by_convention(USED_SHARE, shared)) == ["otel-semconv-pre-1.26"]
    assert list(by_convention(USED_SHARE, shared | {"db_client_connections_waits"})) == [
        "go-redis-redisotel",
        "otel-semconv-pre-1.26",
    ]


@pytest.mark.parametrize(
    ("template", "convention", "expected"),
    [
        # A sum in milliseconds is scaled where the range is read; the count is a count.
        (
            "rate({{pool.use_seconds:sum}}[5m]) / rate({{pool.use_seconds:count}}[5m])",
            "go-redis-redisotel",
            "(rate(db_client_connections_use_time_milliseconds_sum[5m]) * 0.001)"
            " / rate(db_client_connections_use_time_milliseconds_count[5m])",
        ),
        # Buckets in milliseconds: the quantile that reads them is scaled.
        (
            "histogram_quantile(0.99, sum by (service, le) (rate({{http.server.duration:bucket}}[5m]))) > 0.25",
            "otel-http-old",
            "(histogram_quantile(0.99, sum by (job, le) (rate(http_server_duration_milliseconds_bucket{http_route=\"\"}[5m])))"
            " * 0.001) > 0.25",
        ),
        # Nanoseconds in a cumulative gauge, read with rate().
        (
            "sum by (service, pool) (rate({{pool.wait_seconds_total}}[1m]))",
            "go-redis-redisotel",
            "sum by (job, pool_name) ((rate(db_client_connections_waits_duration_nanoseconds[1m]) * 1e-09))",
        ),
        # A mesh names the service by the destination's labels.
        (
            "sum by (namespace, service) (rate({{http.server.errors}}[5m]))",
            "istio",
            "sum by (destination_service_namespace, destination_service_name) ("
            'rate(istio_requests_total{reporter="destination", response_code=~"5.."}[5m]))',
        ),
    ],
)
def test_units_and_labels_are_normalised(template: str, convention: str, expected: str) -> None:
    assert by_convention(template)[convention] == expected


def test_answers_come_back_under_normalised_labels() -> None:
    convention = load_catalogue().convention("go-redis-redisotel")
    assert convention is not None
    labels = normalise_labels({"job": "feature", "pool_name": "redis:6379", "instance": "a:2112"}, convention)
    assert labels == {"service": "feature", "job": "feature", "pool": "redis:6379", "instance": "a:2112"}


def test_required_metrics_include_histogram_series_and_detection() -> None:
    convention = load_catalogue().convention("go-redis-redisotel")
    assert convention is not None
    assert required_metrics("rate({{pool.use_seconds:count}}[5m])", convention) == {
        "db_client_connections_use_time_milliseconds_count",
        "db_client_connections_waits",
    }
    assert required_metrics("{{pool.pending}}", convention) is None


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{pool.nope}}", "unknown signal"),
        ("rate({{pool.hold_seconds}}[5m])", "is a histogram"),
        ("{{pool.used:sum}}", "has no :sum"),
        ("up", "refers to no signal"),
        ("max by (pool) ({{pool.used}}", "does not parse as PromQL"),
    ],
)
def test_bad_references_are_refused(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_template(template, load_catalogue())


def test_a_user_convention_is_added_and_used(tmp_path: Path) -> None:
    extra = tmp_path / "acme.yaml"
    extra.write_text(
        "conventions:\n"
        "  - name: acme-pool\n"
        "    title: ACME's in-house pool\n"
        "    labels: {pool: acme_pool}\n"
        "    signals:\n"
        "      pool.used: acme_pool_busy\n"
        "      pool.max: acme_pool_size\n",
        encoding="utf-8",
    )
    catalogue = load_catalogue((extra,))
    queries = {e.convention.name: e.query for e in expansions(USED_SHARE, catalogue, {"acme_pool_busy", "acme_pool_size"})}
    assert queries == {
        "acme-pool": "max by (namespace, job, acme_pool) (avg_over_time(acme_pool_busy[5m]))"
        " / max by (namespace, job, acme_pool) (avg_over_time(acme_pool_size[5m]) > 0)"
    }


def test_a_bad_catalogue_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("conventions:\n  - name: x\n    title: x\n    signals: {pool.nope: m}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown signal\(s\) \['pool.nope'\]"):
        load_catalogue((bad,))


def test_lint_flags_raw_catalogue_metrics_and_labels_that_may_be_missing(tmp_path: Path) -> None:
    (tmp_path / "pools").mkdir()
    (tmp_path / "pools" / "raw.yaml").write_text(
        "cause: connection_pool_exhaustion\nseverity: critical\ntitle: raw\nsummary: '{job}: {value}'\n"
        "when:\n  - promql:\n      query: max by (job) (hikaricp_connections_active)\n",
        encoding="utf-8",
    )
    (tmp_path / "pools" / "sig.yaml").write_text(
        "cause: connection_pool_exhaustion\nseverity: critical\ntitle: sig\nsummary: '{namespace}/{service}'\n"
        "when:\n  - signal:\n      query: max by (namespace, service, pool) ({{pool.used}})\n",
        encoding="utf-8",
    )
    result = run_cli("rules", "lint", "--rules", str(tmp_path))
    assert result.code == 1
    assert "rule pools/raw: field when[0].promql.query: names hikaricp_connections_active directly" in result.stderr
    assert "rule pools/sig: field summary: {namespace} may be missing" in result.stderr
    assert "rule pools/pool-exhaustion" not in result.stderr  # the shipped pack is clean
    assert result.stdout.strip().endswith("2 problems")
