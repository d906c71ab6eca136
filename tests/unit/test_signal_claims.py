"""Claims decided by labels: a convention claims a family only when the family's labels fit it.

Each case reads the label values of a real recording (the seen beds of tests/fixtures/unseen and
the recorded expositions), as the one query of :func:`diagnoser.signals.claims.claims` would, and
checks which conventions claim which families and what recognition by shape then makes of the rest.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from diagnoser.signals import Catalogue, expansions, load_catalogue, normalise_labels
from diagnoser.signals.claims import Claims, fit_conventions, probes, read_values, values_query
from diagnoser.signals.holdings import Holdings
from diagnoser.signals.infer import recognise

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _series(path: Path) -> dict[str, list[dict[str, str]]]:
    """Every distinct label set per series name of a recording (OpenMetrics or text exposition)."""
    opener = gzip.open if path.suffix == ".gz" else open
    seen: dict[str, dict[tuple[tuple[str, str], ...], dict[str, str]]] = {}
    with opener(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            match = _SAMPLE.match(line)
            if match is None:
                continue
            labels = dict(_LABEL.findall(match.group(2) or ""))
            seen.setdefault(match.group(1), {})[tuple(sorted(labels.items()))] = labels
    return {name: list(sets.values()) for name, sets in seen.items()}


def _claims(path: Path) -> tuple[Claims, dict[str, list[dict[str, str]]], Holdings]:
    """The claims at an instant of the recording: the values query answered from its series."""
    series = _series(path)
    held_now = Holdings.of(series)
    wanted = probes(load_catalogue(), held_now)
    assert values_query(wanted) is not None
    # What `group by (__name__, label)` answers, each row tagged with its label as the query does.
    rows = [
        {"__name__": name, "diagnoser_claim_label": label, **({label: s[label]} if s.get(label) else {})}
        for name, labels in wanted.items()
        for label in labels
        for s in series.get(name, [])
    ]
    return fit_conventions(load_catalogue(), held_now, read_values(rows)), series, held_now


def _recognised(path: Path) -> dict[str, str]:
    """Inferred convention per family, by name: what recognition makes of what no claim took."""
    claimed, series, _ = _claims(path)
    labels = {name: frozenset().union(*sets) for name, sets in series.items()}
    found = recognise(set(series), {}, labels, load_catalogue(), None, claims=claimed)
    return {c.forms[next(iter(c.forms))].metric: c.name for c in found.conventions}


def _convention(claimed: Claims, name: str) -> list[str]:
    return sorted(form.metric for c in claimed.conventions if c.name == name for form in c.forms.values())


def _bed(name: str) -> Path:
    return FIXTURES / "unseen" / name / "series.om.gz"


def test_a_peer_label_the_convention_does_not_read_leaves_the_family_to_recognition() -> None:
    # client_golang's round tripper curried with {peer}: OpenTelemetry's name, no server_address.
    claimed, _, _ = _claims(_bed("go-http-peer-slow"))
    assert not _convention(claimed, "otel-http-client")
    [why] = [r.reason for r in claimed.rejected if r.entry == "otel-http-client"]
    assert "server_address" in why
    inferred = _recognised(_bed("go-http-peer-slow"))
    assert "peer label peer" in inferred["http_client_request_duration_seconds"]
    # Its server side keeps promhttp's claim: the code and handler... labels it reads are there.
    assert _convention(claimed, "prometheus-promhttp")
    assert "http_request_duration_seconds" not in inferred


def test_a_status_label_no_claimant_reads_gives_the_errors_by_shape() -> None:
    # A hand-written prometheus_client histogram with {handler, method, status}: promhttp reads
    # code (absent), so it does not claim it; the fastapi instrumentator's entry fits its duration
    # but reads errors from http_requests_total, which is absent. The status label gives them.
    claimed, _, _ = _claims(_bed("pg-connect-per-request-limit"))
    assert not _convention(claimed, "prometheus-promhttp")
    assert "code" in next(r.reason for r in claimed.rejected if r.entry == "prometheus-promhttp")
    inferred = _recognised(_bed("pg-connect-per-request-limit"))
    assert "status label status" in inferred["http_request_duration_seconds"]


def test_grpc_type_in_upper_case_is_claimed_with_matchers_for_either_spelling() -> None:
    # py-grpc-prometheus writes grpc_type="UNARY" and codes as DEADLINE_EXCEEDED.
    claimed, _, held_now = _claims(_bed("py-grpc-client-slow"))
    [client] = [c for c in claimed.conventions if c.name == "go-grpc-prometheus-client"]
    [(label, op, pattern)] = client.forms["dependency.duration"].matchers
    assert (label, op) == ("grpc_type", "=~")
    assert re.fullmatch(pattern, "UNARY") and re.fullmatch(pattern, "unary")
    assert not re.fullmatch(pattern, "SERVER_STREAM")
    [server] = [c for c in claimed.conventions if c.name == "go-grpc-prometheus"]
    codes = dict((m[0], m[2]) for m in server.forms["grpc.server.deadline_exceeded"].matchers)["grpc_code"]
    assert re.fullmatch(codes, "DEADLINE_EXCEEDED") and re.fullmatch(codes, "DeadlineExceeded")
    assert not re.fullmatch(codes, "OK")
    template = "sum by (service, peer) (rate({{dependency.duration:count}}[5m]))"
    [query] = [e.query for e in expansions(template, claimed.catalogue(load_catalogue()), held_now)]
    assert 'grpc_type=~"(?i)unary"' in query and "by (job, grpc_service)" in query


def test_go_grpc_prometheus_keeps_its_exact_matchers() -> None:
    claimed, _, _ = _claims(FIXTURES / "expositions" / "grpc-go-prometheus-client" / "incident-1.prom")
    [client] = [c for c in claimed.conventions if c.name == "go-grpc-prometheus-client"]
    assert client.forms["dependency.duration"].matchers == (("grpc_type", "=", "unary"),)


@pytest.mark.parametrize(
    ("labels", "claimant"),
    [
        # client_golang promhttp: code and handler.
        ({"code": "200", "handler": "/checkout", "method": "get"}, "prometheus-promhttp"),
        # prometheus-fastapi-instrumentator: handler, and no status on the duration.
        ({"handler": "/api/catalog", "method": "GET"}, "prometheus-python-instrumentator"),
        # prom-client by hand: route and status_code.
        ({"route": "/api/orders", "status_code": "200", "method": "GET"}, "prom-client"),
        # express-prom-bundle: path and status_code.
        ({"path": "/api/orders/#val", "status_code": "200", "method": "GET"}, "express-prom-bundle"),
        # A hand-written one: status, no entry's labels (read by shape).
        ({"path": "/api/orders", "status": "200", "method": "GET"}, None),
    ],
)
def test_two_conventions_for_one_family_the_labels_decide(
    labels: dict[str, str], claimant: str | None
) -> None:
    names = [f"http_request_duration_seconds{part}" for part in ("_bucket", "_count", "_sum")]
    held_now = Holdings.of(names)
    wanted = probes(load_catalogue(), held_now)
    rows = [
        {
            "__name__": name,
            "diagnoser_claim_label": label,
            **({label: labels[label]} if label in labels else {}),
        }
        for name, asked in wanted.items()
        for label in asked
    ]
    claimed = fit_conventions(load_catalogue(), held_now, read_values(rows))
    claimants = {
        c.name
        for c in claimed.conventions
        if any(f.metric.startswith("http_request_duration") for f in c.forms.values())
    }
    assert claimants == ({claimant} if claimant else set())


def test_a_peer_label_nobody_anticipated_is_the_one_left_beside_known_dimensions() -> None:
    # prometheus_client by hand: outbound_request_duration_seconds{dest_service, method, status_code}.
    inferred = _recognised(_bed("py-hand-dest-slow"))
    assert "peer label dest_service" in inferred["outbound_request_duration_seconds"]


@pytest.mark.parametrize(
    ("labels", "splits", "peer"),
    [
        # A name of nobody's list, beside the request's own dimensions and the target's.
        (("callee", "http_request_method", "status_code", "otel_scope_name", "pod"), None, "callee"),
        # Two candidates: the one whose values split the slowdown (one callee rose 40x, its zone 3x).
        (("callee", "callee_zone", "method"), {"callee": 40.0, "callee_zone": 3.0}, "callee"),
        (("callee", "callee_zone", "method"), {"callee": 1.1, "callee_zone": 6.0}, "callee_zone"),
        # Two candidates not compared (the query failed): no peer rather than a guess.
        (("callee", "callee_zone"), None, None),
    ],
)
def test_the_peer_of_a_client_duration_comes_from_its_labels(
    labels: tuple[str, ...], splits: dict[str, float] | None, peer: str | None
) -> None:
    family = "shop_outbound_call_seconds"
    label_sets = {
        f"{family}_count": frozenset({"job", "instance", *labels}),
        f"{family}_sum": frozenset({"job", "instance"}),
        f"{family}_bucket": frozenset({"job", "instance", "le"}),
    }
    found = recognise(
        set(label_sets), {}, label_sets, load_catalogue(), None, splits={family: splits} if splits else None
    )
    [convention] = found.conventions
    assert convention.labels.get("peer") == peer


@pytest.mark.parametrize(
    ("convention", "labels", "peer", "address"),
    [
        # OpenTelemetry JS instrumentation-pg 0.76: semantic conventions 1.30+ (db.system.name).
        (
            "otel-db-client-js",
            {"db_namespace": "inventory", "db_system_name": "postgresql", "server_address": "127.0.0.1",
             "server_port": "45881", "db_operation_name": "SELECT"},
            "postgresql database inventory",
            "127.0.0.1:45881",
        ),
        # redis-py 8's own metrics: db.system and db.namespace (the generation before 1.30).
        (
            "otel-db-client",
            {"db_namespace": "0", "db_system": "redis", "server_address": "127.0.0.1", "server_port": "48207"},
            "redis database 0",
            "127.0.0.1:48207",
        ),
        # No server address: the system names the peer, with the database where there is one.
        ("otel-db-client-system", {"db_system": "postgresql", "db_name": "orders"}, "postgresql database orders", None),
        # An HTTP peer keeps its address.
        ("otel-http-client", {"server_address": "pricing", "server_port": "8080"}, "pricing", None),
    ],
)  # fmt: skip
def test_a_database_is_named_by_its_system_and_name(
    convention: str, labels: dict[str, str], peer: str, address: str | None
) -> None:
    catalogue = load_catalogue()
    found = catalogue.convention(convention)
    assert found is not None
    template = "sum by (service, peer, peer_port, db_system, db_name) (rate({{dependency.duration:count}}[5m]))"
    [query] = [e.query for e in expansions(template, Catalogue(catalogue.signals, [found]))]
    assert "db_system_name, db_system" in query or found.labels["peer"] == "db_system"
    normalised = normalise_labels({"job": "shop-api", **labels}, found)
    assert normalised["peer"] == peer
    assert normalised.get("peer_address") == address
