"""Prometheus 3 in PromQL: native histograms read where they are held, UTF-8 names quoted, and the
OTLP translation strategies' spellings of one catalogued OpenTelemetry metric."""

from __future__ import annotations

import pytest

from diagnoser.promql import (
    kind_from_names,
    normalise,
    number_spellings,
    numbers_as_numbers,
    parse,
    read_histograms,
    selector_text,
    without_type_and_unit,
)
from diagnoser.signals import load_catalogue, normalise_labels
from diagnoser.signals.expand import expansions
from diagnoser.signals.holdings import Holdings, resolve
from diagnoser.signals.otlp import escape_label, escape_metric, spellings
from diagnoser.signals.target_info import identities_from
from diagnoser.sources.prometheus import _samples_from


def native(_: str) -> str:
    return "native"


def both(_: str) -> str:
    return "both"


@pytest.mark.parametrize(
    ("query", "kind_of", "expected"),
    [
        (
            "histogram_quantile(0.99, sum by (job, le) (rate(x_bucket[5m])))",
            native,
            "histogram_quantile(0.99, sum by (job) (rate(x[5m])))",
        ),
        ("sum(rate(x_count[5m]))", native, "sum(histogram_count(rate(x[5m])))"),
        ("rate(x_sum[5m] offset 1h)", native, "histogram_sum(rate(x[5m] offset 1h))"),
        ("x_count", native, "histogram_count(x)"),
        (
            'rate(x_bucket{le="0.3"}[5m])',
            native,
            "(histogram_fraction(-Inf, 0.3, rate(x[5m])) * histogram_count(rate(x[5m])))",
        ),
        ("rate(x_count[5m])", both, "(histogram_count(rate(x[5m])) or rate(x_count[5m]))"),
        # No native equivalent per sample: left as written.
        ("max_over_time(x_count[5m])", native, "max_over_time(x_count[5m])"),
        ("rate(x_count[5m])", lambda _: "classic", "rate(x_count[5m])"),
        ('rate({"a.b_count", "c.d"="1"}[5m])', native, 'histogram_count(rate({"a.b", "c.d"="1"}[5m]))'),
    ],
)
def test_histograms_are_read_as_held(query: str, kind_of: object, expected: str) -> None:
    assert read_histograms(query, kind_of) == expected  # type: ignore[arg-type]
    parse(read_histograms(query, kind_of))  # type: ignore[arg-type]


def test_kind_from_names() -> None:
    assert kind_from_names("x", {"x_bucket", "x_count", "x_sum"}) == "classic"
    assert kind_from_names("x", {"x"}) == "native"
    assert kind_from_names("x", {"x", "x_count"}) == "both"
    assert kind_from_names("x", {"y"}) is None


def test_utf8_names_are_printed_quoted() -> None:
    query = 'sum by ("http.route", job) (rate({"http.server.request.duration_seconds_bucket", "http.route"="/x"}[5m]))'
    assert normalise(query) == query
    assert normalise('a / on ("service.name") group_left ("k8s.pod.name") b') == (
        'a / on ("service.name") group_left ("k8s.pod.name") b'
    )
    assert selector_text("http.server.duration", [("http.route", "=", "/x")]) == (
        '{"http.server.duration", "http.route"="/x"}'
    )
    assert selector_text("x", [("a", "=", "b")]) == 'x{a="b"}'


def test_otlp_strategies_are_one_rule() -> None:
    assert (
        escape_metric("http.server.request.duration_seconds_bucket")
        == "http_server_request_duration_seconds_bucket"
    )
    assert escape_label("http.response.status_code") == "http_response_status_code"
    assert escape_label("2xx") == "key_2xx"
    assert spellings("http_server_request_duration_seconds") == {
        "http_server_request_duration_seconds",
        "http_server_request_duration",
    }
    # A form written without its unit gets the suffixed spelling from the unit it declares.
    assert "http_server_request_duration_seconds" in spellings("http_server_request_duration", "seconds")
    assert spellings("db_client_connections_timeouts_total") == {
        "db_client_connections_timeouts_total",
        "db_client_connections_timeouts",
    }


@pytest.mark.parametrize(
    "names",
    [
        {"http.server.request.duration_seconds"},  # NoUTF8EscapingWithSuffixes, native
        {"http.server.request.duration_seconds_bucket", "http.server.request.duration_seconds_count"},
        {"http.server.request.duration"},  # NoTranslation
        {"http_server_request_duration"},  # UnderscoreEscapingWithoutSuffixes
    ],
)
def test_an_otel_convention_is_found_in_every_spelling(names: set[str]) -> None:
    convention = load_catalogue().convention("otel-http")
    assert convention is not None
    labels = {n: frozenset({"http.route", "http.response.status_code", "job"}) for n in names if "." in n}
    held = resolve(convention, Holdings.of(names, labels))
    metric = held.forms["http.server.duration"].metric
    assert escape_metric(metric) in spellings("http_server_request_duration_seconds")
    if labels:
        assert held.labels["route"] == "http.route"
        assert held.forms["http.server.errors"].matchers == (("http.response.status_code", "=~", "5.."),)
        assert held.normalised_label("http.route") == "route"


def test_two_services_in_two_spellings_are_both_read() -> None:
    # One Prometheus 3, one OTel service scraped with UTF-8 names and another with escaped ones (the
    # Prometheus 3 variation harness replays both): each convention's forms in one spelling, never
    # the escaped count with the UTF-8 status label (which matched neither service's errors).
    escaped = {f"http_server_request_duration_seconds{p}" for p in ("_bucket", "_count", "_sum")}
    utf8 = {f"http.server.request.duration_seconds{p}" for p in ("_bucket", "_count", "_sum")}
    labels = {n: frozenset({"http.route", "http.response.status_code", "job"}) for n in utf8}
    queries = [
        e.query
        for e in expansions("sum by (service) (rate({{http.server.errors}}[5m]))", load_catalogue(), Holdings.of(escaped | utf8, labels))
    ]
    assert queries == [
        'sum by (job) (rate(http_server_request_duration_seconds_count{http_response_status_code=~"5.."}[5m]))',
        'sum by (job) (rate({"http.server.request.duration_seconds_count", "http.response.status_code"=~"5.."}[5m]))',
    ]


def test_native_histogram_results_are_samples() -> None:
    data = {
        "resultType": "vector",
        "result": [
            {
                "metric": {"__name__": "x", "job": "a"},
                "histogram": [1.0, {"count": "3", "sum": "0.5", "buckets": [[0, "0.1", "0.11", "3"]]}],
            }
        ],
    }
    (sample,) = _samples_from(data)
    assert sample.value == 3.0 and sample.histogram is not None and sample.histogram.sum == 0.5


def test_native_families_are_recognised_by_their_samples() -> None:
    from diagnoser.signals.infer import recognise
    from diagnoser.signals.shapes import families_of, native_candidates

    name = "shop_api_request_latency_seconds"
    assert native_candidates({name, "up"}, {}) == [name]
    assert families_of({name}, {}, native={name})[name].histogram == "native"
    found = recognise(
        {name}, {}, {name: frozenset({"job", "code", "handler"})}, load_catalogue(), native={name}
    )
    (convention,) = found.conventions
    assert convention.name.startswith(f"inferred (native histogram {name}, server side, status label code")
    assert convention.forms["http.server.duration"].metric == name
    # Without the samples' word, the same name is a gauge and nothing is inferred.
    assert recognise({name}, {}, {}, load_catalogue()).conventions == ()


def test_a_classic_histograms_parts_are_never_asked_as_native_histograms() -> None:
    """A histogram whose ``_sum`` was dropped (relabelling, a synthetic bed) still has its
    ``_bucket`` and ``_count`` named as classic parts: asking ``histogram_count`` of every bucket
    series of an estate found nothing and cost more than any rule's query."""
    from diagnoser.signals.shapes import native_candidates

    base = "shop_api_request_duration_seconds"
    assert native_candidates({f"{base}_bucket", f"{base}_count", "up"}, {}) == []
    assert native_candidates({f"{base}_bucket", "up"}, {}) == []
    # A family named ..._count with no bucket series beside it may still be a native histogram.
    assert native_candidates({"jobs_wait_seconds_count", "up"}, {}) == ["jobs_wait_seconds_count"]


@pytest.mark.parametrize(
    ("value", "spellings"),
    [
        ("1", ("1", "1.0")),
        ("1.0", ("1.0", "1")),
        ("0.25", ("0.25",)),
        ("1e+06", ("1e+06", "1000000", "1000000.0")),
        ("1000000", ("1000000", "1e+06", "1000000.0")),
        ("1e-05", ("1e-05", "0.00001")),
        ("+Inf", ("+Inf",)),
        ("Inf", ("Inf", "+Inf")),
        ("NaN", ("NaN",)),
        ("p99", ("p99",)),
    ],
)
def test_a_number_has_every_spelling_servers_write(value: str, spellings: tuple[str, ...]) -> None:
    assert number_spellings(value) == spellings


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ('rate(x_bucket{le="1", job="a"}[5m])', 'rate(x_bucket{le=~"1|1\\\\.0", job="a"}[5m])'),
        ('x{quantile!="1.0"}', 'x{quantile!~"1\\\\.0|1"}'),
        ('{"a.b_bucket", le="10"}', '{"a.b_bucket", le=~"10|10\\\\.0"}'),
        # One spelling only, another label, or a regex already: as written.
        ('x_bucket{le="0.25"}', 'x_bucket{le="0.25"}'),
        ('x{leader="1"}', 'x{leader="1"}'),
        ('x_bucket{le=~"1|2"}', 'x_bucket{le=~"1|2"}'),
    ],
)
def test_bounds_and_quantiles_match_as_numbers(query: str, expected: str) -> None:
    assert numbers_as_numbers(query) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("a / b", "a / ignoring (__type__, __unit__) b"),
        ("a > bool b", "a > bool ignoring (__type__, __unit__) b"),
        ("rate(a[5m]) and b", "rate(a[5m]) and ignoring (__type__, __unit__) b"),
        ("sum without (i) (a)", "sum without (i, __type__, __unit__) (a)"),
        ("a * ignoring (y) group_left () b", "a * ignoring (y, __type__, __unit__) group_left () b"),
        # Already matched on named labels, a scalar side, or aggregations that keep no type: as written.
        ("a / on (job) b", "a / on (job) b"),
        ("a / 2", "a / 2"),
        ("scalar(a) * b", "scalar(a) * b"),
        ("sum by (job) (a) / sum by (job) (b)", "sum by (job) (a) / sum by (job) (b)"),
    ],
)
def test_type_and_unit_never_split_a_join(query: str, expected: str) -> None:
    assert without_type_and_unit(query) == expected


def test_target_info_says_who_a_pushed_service_is() -> None:
    rows = [
        {"job": "team/a/checkout", "instance": "1", "service.name": "checkout", "service.namespace": "team/a"},
        {"job": "team/a/checkout", "instance": "2", "service.name": "checkout", "service.namespace": "team/a"},
        {"job": "shop/cart", "service_name": "cart"},
        {"job": "x/y", "service_name": "y"},
        {"job": "x/y", "service_name": "z"},  # rows that disagree say nothing
        {"job": "a/b"},
    ]
    assert identities_from(rows) == {"team/a/checkout": ("checkout", "team/a"), "shop/cart": ("cart", None)}
    convention = next(c for c in load_catalogue().conventions if c.otel)
    labels = {"job": "team/a/checkout"}
    split = normalise_labels(labels, convention)
    assert split.get("service") != "checkout"
    known = normalise_labels(labels, convention, identities_from(rows))
    assert (known["service"], known["namespace"]) == ("checkout", "team/a")
