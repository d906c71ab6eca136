"""Recognition by shape: families no convention claims, read from names, labels and metadata.

Table-driven over the shapes real exporters have (HAProxy, redis_exporter, memcached_exporter,
client_python's process collector, Ktor's Micrometer HTTP histogram, families named without
their unit), each as the names and label sets a Prometheus holds for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.signals import load_catalogue
from diagnoser.signals.catalogue import Catalogue
from diagnoser.signals.infer import (
    CAVEAT,
    Recognition,
    candidate_pairs,
    candidate_series,
    overshoot_query,
    recognise,
)
from diagnoser.signals.resources import resource_query

TARGET = frozenset({"job", "instance"})


def _labels(**families: tuple[str, ...]) -> dict[str, frozenset[str]]:
    return {name: TARGET | set(labels) for name, labels in families.items()}


def _recognise(
    labels: dict[str, frozenset[str]],
    metadata: dict[str, dict[str, str]] | None = None,
    bounds: dict[str, float] | None = None,
    catalogue_files: tuple[Path, ...] = (),
) -> Recognition:
    return recognise(set(labels), metadata or {}, labels, load_catalogue(catalogue_files), bounds)


def test_haproxy_is_catalogued_with_both_its_queues() -> None:
    found = _recognise(
        _labels(
            haproxy_server_current_sessions=("proxy", "server"),
            haproxy_server_limit_sessions=("proxy", "server"),
            haproxy_server_max_sessions=("proxy", "server"),
            haproxy_backend_current_queue=("proxy",),
            haproxy_server_current_queue=("proxy", "server"),
        )
    )
    [resource] = [r for r in found.resources if r.used == "haproxy_server_current_sessions"]
    assert (resource.name, resource.how, resource.limit) == (
        "haproxy server maxconn", "haproxy-server-maxconn", "haproxy_server_limit_sessions"
    )
    assert resource.queued == ("haproxy_backend_current_queue", "haproxy_server_current_queue")


def test_proxy_sessions_pair_with_the_configured_limit_not_the_highest_seen() -> None:
    # HAProxy's exporter shape under another prefix (HAProxy's own stats via a renaming relabel
    # rule, "lb_"), so that no catalogue entry claims it.
    found = _recognise(
        _labels(
            lb_server_current_sessions=("proxy", "server"),
            lb_server_limit_sessions=("proxy", "server"),
            lb_server_max_sessions=("proxy", "server"),
            lb_server_current_queue=("proxy", "server"),
            lb_server_max_queue=("proxy", "server"),
            lb_backend_current_queue=("proxy",),
            lb_process_current_run_queue=(),
        )
    )
    [resource] = [r for r in found.resources if r.name == "lb_server sessions"]
    assert (resource.used, resource.limit) == (
        "lb_server_current_sessions",
        "lb_server_limit_sessions",
    )
    assert (
        resource.labels == ("proxy", "server") and resource.role == "proxy" and resource.kind == "connections"
    )
    # The backend holds the queue of a one-server backend; the process run queue is no request's.
    assert resource.queued == ("lb_backend_current_queue", "lb_server_current_queue")
    assert resource.how.startswith("inferred (gauge lb_server_current_sessions with its limit")
    assert resource.caveat == CAVEAT
    assert not [r for r in found.resources if "queue" in r.name]
    # With no proxy name in the prefix, the queue makes it a proxy.
    assert resource.role == "proxy"


@pytest.mark.parametrize(
    ("labels", "name", "used", "limit", "refused", "kind"),
    [
        (
            # redis_exporter run with -namespace keydb: the catalogue's names do not apply.
            _labels(
                keydb_connected_clients=(),
                keydb_config_maxclients=(),
                keydb_rejected_connections_total=(),
                keydb_commands_rejected_calls_total=("cmd",),
                keydb_lazyfree_pending_objects=(),
            ),
            "keydb clients",
            "keydb_connected_clients",
            "keydb_config_maxclients",
            ("keydb_rejected_connections_total",),
            "connections",
        ),
        (
            # Micrometer's Tomcat connector connections against maxConnections: no catalogue entry.
            _labels(
                tomcat_connections_current_connections=("name",),
                tomcat_connections_keepalive_current_connections=("name",),
                tomcat_connections_config_max_connections=("name",),
            ),
            "tomcat_connections connections",
            "tomcat_connections_current_connections",
            "tomcat_connections_config_max_connections",
            (),
            "connections",
        ),
        (
            _labels(process_open_fds=(), process_max_fds=()),
            "process fds",
            "process_open_fds",
            "process_max_fds",
            (),
            "file_descriptors",
        ),
    ],
    ids=["redis-exporter-namespaced", "micrometer-tomcat-connections", "process-fds"],
)
def test_a_gauge_beside_its_limit_is_a_resource(
    labels: dict[str, frozenset[str]], name: str, used: str, limit: str, refused: tuple[str, ...], kind: str
) -> None:
    [resource] = [r for r in _recognise(labels).resources if r.name == name]
    assert (resource.used, resource.limit, resource.refused, resource.kind) == (used, limit, refused, kind)
    assert resource.queued == ()


def test_limits_of_bytes_or_rates_and_limits_without_a_sibling_are_no_resources() -> None:
    found = _recognise(
        _labels(
            container_memory_usage_bytes=(),
            container_spec_memory_limit_bytes=(),
            haproxy_process_current_connection_rate=(),
            haproxy_process_limit_connection_rate=(),
            widget_config_max_client_connections=(),
        )
    )
    assert found.resources == ()
    assert [(m.metric, m.looks_like) for m in found.lookalikes] == [
        ("widget_config_max_client_connections", "limit")
    ]


def test_a_limit_whose_gauge_lacks_its_labels_is_listed_not_used() -> None:
    found = _recognise(_labels(widget_current_sessions=(), widget_limit_sessions=("backend",)))
    assert found.resources == ()
    [missed] = found.lookalikes
    assert "lacks the labels ['backend']" in missed.reason


def test_an_uncatalogued_server_histogram_with_a_status_label_gives_http_signals() -> None:
    # Ktor's Micrometer plugin: ktor_http_server_requests_seconds{status, route}, no metadata
    # (backfilled); the catalogue has Spring Boot's spelling, not Ktor's.
    labels = _labels(
        ktor_http_server_requests_seconds_count=("status", "route", "method"),
        ktor_http_server_requests_seconds_bucket=("status", "route", "le"),
        ktor_http_server_requests_seconds_sum=("status", "route"),
    )
    [convention] = _recognise(labels).conventions
    assert convention.name == (
        "inferred (histogram ktor_http_server_requests_seconds, server side, status label status, "
        "seconds from its name)"
    )
    assert convention.labels == {"service": "job", "route": "route"}
    errors = convention.forms["http.server.errors"]
    assert (errors.metric, errors.matchers) == (
        "ktor_http_server_requests_seconds_count",
        (("status", "=~", "5.."),),
    )
    assert convention.forms["http.server.duration"].scale == 1.0
    assert CAVEAT in str(convention.forms["http.server.duration"].note)


@pytest.mark.parametrize(
    ("metadata", "bounds", "unit_said", "scale"),
    [
        (
            {},
            {"shop_http_server_duration_bucket": 10000.0},
            "milliseconds from its bucket bounds (up to 10000)",
            1e-3,
        ),
        ({}, {"shop_http_server_duration_bucket": 10.0}, "seconds from its bucket bounds (up to 10)", 1.0),
        ({}, {}, "seconds assumed (no unit in metadata, name or buckets)", 1.0),
        (
            {"shop_http_server_duration": {"type": "histogram", "unit": "ms", "help": ""}},
            {},
            "milliseconds from its metadata",
            1e-3,
        ),
    ],
    ids=["ms-buckets", "s-buckets", "assumed", "metadata"],
)
def test_a_duration_without_a_unit_in_its_name_says_where_its_unit_came_from(
    metadata: dict[str, dict[str, str]], bounds: dict[str, float], unit_said: str, scale: float
) -> None:
    # A family named without its unit, as OpenTelemetry JS's exporter names them (its own
    # spelling, http_server_duration, is catalogued): an application's own histogram.
    labels = _labels(
        shop_http_server_duration_count=("http_status_code",),
        shop_http_server_duration_bucket=("le",),
        shop_http_server_duration_sum=(),
    )
    [convention] = _recognise(labels, metadata, bounds).conventions
    assert convention.name.endswith(f"status label http_status_code, {unit_said})")
    assert convention.forms["http.server.duration"].scale == scale


def test_a_server_duration_without_status_is_a_lookalike_and_a_catalogued_one_is_left_alone() -> None:
    labels = _labels(
        http_request_duration_highr_seconds_count=(),
        http_request_duration_highr_seconds_bucket=("le",),
        http_request_duration_highr_seconds_sum=(),
        http_server_request_duration_seconds_count=("http_response_status_code",),
        http_server_request_duration_seconds_bucket=("le",),
        http_server_request_duration_seconds_sum=(),
    )
    found = _recognise(labels)
    assert found.conventions == ()
    assert [(m.metric, m.looks_like) for m in found.lookalikes] == [
        ("http_request_duration_highr_seconds", "server duration")
    ]


def test_metadata_types_a_family_whose_name_does_not(tmp_path: Path) -> None:
    # A summary by metadata: _count and _sum without buckets, named as any family.
    labels = _labels(api_request_latency_count=("code",), api_request_latency_sum=("code",))
    metadata = {"api_request_latency": {"type": "summary", "unit": "", "help": "API latency."}}
    [convention] = _recognise(labels, metadata).conventions
    assert convention.name.startswith("inferred (summary api_request_latency, server side, status label code")


def test_a_client_duration_with_a_peer_label_gives_the_dependency_signal_where_defined() -> None:
    # An application's own client histogram with the OTel peer label (the OTel spelling itself,
    # http_client_request_duration_seconds, is catalogued).
    labels = _labels(
        shop_upstream_request_duration_seconds_count=("server_address", "http_response_status_code"),
        shop_upstream_request_duration_seconds_bucket=("le",),
        shop_upstream_request_duration_seconds_sum=(),
    )
    catalogue = load_catalogue()
    [convention] = recognise(set(labels), {}, labels, catalogue, None).conventions
    assert convention.labels == {"service": "job", "peer": "server_address"}
    assert set(convention.forms) == {"dependency.duration"}
    # A catalogue without the signal (the cached shipped one is left as it is).
    without = Catalogue(
        signals={k: v for k, v in catalogue.signals.items() if k != "dependency.duration"},
        conventions=[c for c in catalogue.conventions if "dependency.duration" not in c.forms],
        resources=list(catalogue.resources),
    )
    missing = recognise(set(labels), {}, labels, without, None)
    assert missing.conventions == ()
    assert missing.lookalikes[0].reason == "no dependency.duration signal in the catalogue"


@pytest.mark.parametrize(
    ("peer_label", "port_label", "expected"),
    [
        # client_golang's curried transport wrapper, and services instrumented by hand.
        ("upstream", None, {"service": "job", "peer": "upstream"}),
        ("peer", None, {"service": "job", "peer": "peer"}),
        ("target", None, {"service": "job", "peer": "target"}),
        ("server_address", "server_port", {"service": "job", "peer": "server_address", "peer_port": "server_port"}),
    ],
)
def test_a_client_duration_names_its_peer_by_any_peer_label(
    peer_label: str, port_label: str | None, expected: dict[str, str]
) -> None:
    extra = (port_label,) if port_label else ()
    labels = _labels(
        orders_outbound_request_duration_seconds_count=(peer_label, "code", *extra),
        orders_outbound_request_duration_seconds_bucket=("le",),
        orders_outbound_request_duration_seconds_sum=(),
    )
    [convention] = recognise(set(labels), {}, labels, load_catalogue(), None).conventions
    assert convention.labels == expected
    assert f"peer label {peer_label}" in convention.name


def test_an_upstream_label_makes_a_duration_a_clients_whatever_its_name() -> None:
    labels = _labels(
        api_request_duration_seconds_count=("upstream", "code"),
        api_request_duration_seconds_bucket=("le",),
        api_request_duration_seconds_sum=(),
    )
    [convention] = recognise(set(labels), {}, labels, load_catalogue(), None).conventions
    assert set(convention.forms) == {"dependency.duration"}
    assert convention.labels["peer"] == "upstream"


def test_a_service_label_is_never_taken_for_the_peer() -> None:
    # In Kubernetes the scrape puts the target's own Service in `service`.
    labels = _labels(
        orders_outbound_request_duration_seconds_count=("service", "code"),
        orders_outbound_request_duration_seconds_bucket=("le",),
        orders_outbound_request_duration_seconds_sum=(),
    )
    [convention] = recognise(set(labels), {}, labels, load_catalogue(), None).conventions
    assert "peer" not in convention.labels


def test_candidates_are_every_duration_family_and_the_unclaimed_limit_families() -> None:
    # A catalogued duration family is a candidate too: its labels decide whether the claim holds.
    names = {
        "ktor_http_server_requests_seconds_count",
        "ktor_http_server_requests_seconds_sum",
        "ktor_http_server_requests_seconds_bucket",
        "http_server_request_duration_seconds_count",
        "http_server_request_duration_seconds_sum",
        "http_server_request_duration_seconds_bucket",
        # Catalogued (signals/servers.yaml): claimed, so no candidates.
        "redis_connected_clients",
        "redis_config_maxclients",
        "keydb_connected_clients",
        "keydb_config_maxclients",
        "go_goroutines",
        "up",
    }
    assert candidate_series(names, {}, load_catalogue()) == [
        "http_server_request_duration_seconds_count",
        "keydb_config_maxclients",
        "keydb_connected_clients",
        "ktor_http_server_requests_seconds_count",
    ]


def test_resource_queries_read_the_peak_between_scrapes_and_sum_to_the_resource_labels() -> None:
    [resource] = [r for r in load_catalogue().resources if r.how == "postgres-exporter"]
    by = "by (namespace, job, instance, server)"
    usable = "(pg_settings_max_connections - pg_settings_superuser_reserved_connections)"
    # PostgreSQL 16's reserved_connections is taken off where the series exists, never required.
    limit = f"({usable} - ((pg_settings_reserved_connections) or {usable} * 0))"
    peak = f"max_over_time((sum {by} (pg_stat_activity_count) / (max {by} {limit} > 0))[2m:15s])"
    target = "by (namespace, job, instance)"
    # A scrape the exporter failed counts as one at the limit when the landed ones came near it.
    # Either the exporter's own gauge or the target's up failing counts.
    own = f'label_replace(max {target} (pg_up) < bool 1, "failed_by", "exporter", "", "")'
    scrape = f'label_replace(max {target} (up) < bool 1, "failed_by", "scrape", "", "")'
    failed = f"max_over_time((max {target} ({own} or {scrape}))[2m:15s])"
    assert resource_query(resource, "peak", "2m", "15s", 0.95) == (
        f"(({peak} >= 0.75) * 0 + on (namespace, job, instance) group_left {failed} > 0) or {peak}"
    )
    assert resource_query(resource, "queued", "2m", "15s", 0.95) is None
    assert resource_query(resource, "pressure", "2m", "15s", 0.95) is None


def test_a_status_a_cluster_size_or_an_age_is_never_a_limit() -> None:
    # mysqld_exporter on a Galera node, and InnoDB's checkpoint age (recorded: mysqld-exporter-*).
    found = _recognise(
        _labels(
            mysql_global_status_wsrep_cluster_status=(),
            mysql_global_status_wsrep_cluster_size=(),
            mysql_global_status_innodb_checkpoint_age=(),
            mysql_global_status_innodb_checkpoint_max_age=(),
        )
    )
    assert found.resources == ()
    reasons = {r.entry: r.reason for r in found.rejected}
    assert reasons == {
        "inferred pair mysql_global_status_wsrep_cluster_status / mysql_global_status_wsrep_cluster_size": (
            "mysql_global_status_wsrep_cluster_size caps 'cluster', not a count a server holds at once "
            "(connections, clients, sessions, workers, threads, descriptors, entries)"
        ),
        "inferred pair mysql_global_status_innodb_checkpoint_age / mysql_global_status_innodb_checkpoint_max_age": (
            "mysql_global_status_innodb_checkpoint_max_age caps 'age', not a count a server holds at once "
            "(connections, clients, sessions, workers, threads, descriptors, entries)"
        ),
    }


@pytest.mark.parametrize(
    ("verdict", "kept", "reason"),
    [
        (0.0, True, ""),
        (1.0, False, "went above lb_server_limit_sessions in the last 1d, so that is not its limit"),
        (2.0, False, "changed more than 3 times in 1d: a high-water mark, not a configured limit"),
        (3.0, False, "changed more than 3 times in 1d: a high-water mark, not a configured limit"),
    ],
    ids=["within", "gauge-above-it", "limit-moves", "both"],
)
def test_a_pair_is_kept_only_when_its_day_agrees(verdict: float, kept: bool, reason: str) -> None:
    labels = _labels(lb_server_current_sessions=("server",), lb_server_limit_sessions=("server",))
    catalogue = load_catalogue()
    [pair] = candidate_pairs(set(labels), {}, labels, catalogue)
    # What the pair's day is asked, per pair, in one query.
    assert overshoot_query(pair) == (
        "max(max_over_time((sum by (namespace, job, instance, server) (lb_server_current_sessions) > bool "
        "((max by (namespace, job, instance, server) (lb_server_limit_sessions) > 0) * 1.05 + 1))[1d:5m]))"
        " + 2 * (max(changes(lb_server_limit_sessions[1d])) > bool 3)"
    )
    found = recognise(set(labels), {}, labels, catalogue, overshoots={(pair.used, pair.limit): verdict})
    assert bool(found.resources) is kept
    if kept:
        assert "the gauge never above it over the day" in found.resources[0].how
    else:
        [rejected] = found.rejected
        assert reason in rejected.reason


def test_an_unchecked_pair_says_so() -> None:
    labels = _labels(lb_server_current_sessions=(), lb_server_limit_sessions=())
    [resource] = _recognise(labels).resources
    assert resource.how == (
        "inferred (gauge lb_server_current_sessions with its limit lb_server_limit_sessions: both count "
        "sessions, 'limit' in the limit's name, no labels of its own, the day's peak not checked)"
    )


def test_a_catalogued_entry_missing_its_limit_is_rejected_with_the_name_missing() -> None:
    # mysqld_exporter run with --no-collect.global_variables: no max_connections.
    labels = _labels(
        mysql_global_status_threads_connected=(),
        mysql_global_status_connection_errors_total=("error",),
    )
    found = _recognise(labels)
    # Both entries of the exporter read a global variable as their limit.
    assert [r.entry for r in found.rejected] == ["mysqld-exporter", "mysqld-exporter-max-user-connections"]
    assert "mysql_global_variables_max_user_connections absent" in found.rejected[1].reason
    assert found.rejected[0].reason == (
        "mysql_global_variables_max_connections absent, so the entry cannot compare use and limit"
    )
