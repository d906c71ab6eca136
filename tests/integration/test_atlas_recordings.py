"""The atlas: every catalogued server, exporter and pool, from its recorded exposition, through the CLI.

Each directory below holds ``/metrics`` as the real software served it (recorded live here, or
reconstructed from its source where it cannot run: see each SOURCE.md and docs/atlas.md). Every
recording is backfilled into one Prometheus, a day apart, as a healthy lead-in followed by its
incident (an exporter's failed scrapes left as gaps, as live). Then:

* at a healthy instant of every recording (all of them side by side on the first day, so one
  diagnosis covers them), ``diagnose now`` has nothing at warning or above, and ``diagnose signals``
  shows the catalogue entry each recording is for and no inferred pair of a status, a size or an
  age with a gauge;
* at the incident of every recording driven to its limit, the cause is named with the limit's own
  name and number, and no finding's advice adds replicas or connections against it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here, shared_bed
from tests.fixtures.expositions.timeline import incident_openmetrics

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

LEAD_IN_S = 1_500
INCIDENT_S = 600
DAY = 86_400
START_S = 1_792_000_000


@dataclass(frozen=True)
class Bed:
    #: Directories replayed together (a server and the service in front of it share a day).
    directories: tuple[str, ...]
    #: The catalogue entry (or convention) ``diagnose signals`` must show for the first directory.
    entry: str


BEDS = {
    "mysql": Bed(("mysqld-exporter-max-connections", "mysql-max-connections-service"), "mysqld-exporter"),
    "postgres": Bed(("postgres-exporter-max-connections", "postgres-max-connections-service"), "postgres-exporter"),
    "memcached": Bed(("memcached-exporter",), "memcached-exporter"),
    "redis": Bed(("redis-exporter-maxclients",), "redis-exporter"),
    "pgbouncer-python": Bed(("pgbouncer-exporter-python",), "pgbouncer-exporter-python"),
    "pgbouncer": Bed(("pgbouncer-exporter",), "pgbouncer-exporter"),
    "pgbouncer-debian": Bed(("pgbouncer-exporter-debian",), "pgbouncer-exporter-debian"),
    "haproxy": Bed(("haproxy-maxconn",), "haproxy-server-maxconn"),
    "apache": Bed(("apache-exporter",), "apache-exporter"),
    "nginx": Bed(("nginx-exporter",), ""),
    "node": Bed(("node-exporter",), "node-exporter-conntrack"),
    "rabbitmq": Bed(("rabbitmq-prometheus",), "rabbitmq-fds"),
    "kafka": Bed(("kafka-exporter-lag",), "kafka-exporter"),
    "tomcat": Bed(("micrometer-tomcat-threads",), "micrometer-tomcat-threads"),
    "jetty": Bed(("micrometer-jetty-threads",), "micrometer-jetty-threads"),
    "hikaricp": Bed(("hikaricp-micrometer",), "hikaricp-micrometer"),
    "go-sql": Bed(("go-sql",), "go-sql"),
    "envoy": Bed(("envoy",), "envoy"),
    "otel-db-client": Bed(("redis-py",), "otel-semconv"),
    "otel-db-client-old": Bed(("sqlalchemy-otel",), "otel-semconv-pre-1.26-unit-suffix"),
    # Runtimes and frameworks: HTTP servers with a 5xx burst and a latency rise (read by shape,
    # their own status and route labels, where no catalogue entry fits their labels).
    "prom-client": Bed(("prom-client",), "prom-client"),
    "express-prom-bundle": Bed(("express-prom-bundle",), "express-prom-bundle"),
    "prometheus-flask-exporter": Bed(("prometheus-flask-exporter",), ""),
    "starlette-exporter": Bed(("starlette-exporter",), ""),
}
NAMES = list(BEDS)
#: The HTTP latency recordings (a 1 % 5xx rate, at the SLO, and a p99 over 2 s), at their incident only.
LATENCY_ONLY = {
    "http-otel-new": Bed(("http-otel-new",), "otel-http"),
    "http-otel-old": Bed(("http-otel-old",), "otel-http-old"),
    "http-client-python": Bed(("http-client-python",), "prometheus-python-instrumentator"),
    "http-promhttp-go": Bed(("http-promhttp-go",), "prometheus-promhttp"),
}
ALL_BEDS = {**BEDS, **LATENCY_ONLY}


#: The beds driven to their limit, each alone on a day of its own after the first.
INCIDENT_BEDS = ["mysql", "memcached", "pgbouncer-python", "pgbouncer", "pgbouncer-debian", "tomcat", "jetty", "kafka"]
#: The runtime recordings, whose incidents share one day: each is its own service.
RUNTIME_BEDS = ["prom-client", "express-prom-bundle", "prometheus-flask-exporter", "starlette-exporter"]
LATENCY_BEDS = list(LATENCY_ONLY)
RUNTIME_DAY = len(INCIDENT_BEDS) + 1


def _bed_text(name: str, day: int) -> list[str]:
    index = list(ALL_BEDS).index(name)
    return [
        incident_openmetrics(
            directory,
            start_s=START_S + DAY * day,
            lead_in_s=LEAD_IN_S,
            incident_s=INCIDENT_S,
            scrape_labels={"job": directory, "instance": f"10.0.{index}.{offset + 1}:9000"},
        ).removesuffix("# EOF\n")
        for offset, directory in enumerate(ALL_BEDS[name].directories)
    ]


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    parts = [text for name in NAMES for text in _bed_text(name, 0)]
    parts += [text for day, name in enumerate(INCIDENT_BEDS, start=1) for text in _bed_text(name, day)]
    parts += [text for name in RUNTIME_BEDS + LATENCY_BEDS for text in _bed_text(name, RUNTIME_DAY)]
    with LocalPrometheus(openmetrics="".join(parts) + "# EOF\n") as prometheus:
        yield prometheus.url


def _at(day: int, seconds_in: float) -> str:
    return datetime.fromtimestamp(START_S + DAY * day + seconds_in, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


HEALTHY = _at(0, LEAD_IN_S - 30)


def _incident(name: str) -> str:
    return _at(INCIDENT_BEDS.index(name) + 1, LEAD_IN_S + INCIDENT_S - 30)


def _diagnose(url: str, at: str) -> tuple[int, list[dict[str, object]]]:
    result = run_cli_here("now", "--prometheus-url", url, "--at", at, "--format", "json")
    assert result.code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == [], report["errors"]
    return result.code, list(report["findings"])


def _signals(url: str, at: str) -> dict[str, object]:
    result = run_cli_here("signals", "--prometheus-url", url, "--at", at, "--format", "json")
    assert result.code == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout)
    return found


def _loud(findings: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(f["rule_id"], f["summary"]) for f in findings if f["severity"] in ("critical", "warning")]


@pytest.fixture(scope="module")
def healthy(prometheus_url: str) -> tuple[list[dict[str, object]], dict[str, object]]:
    """Every recording's healthy instant at once: the diagnosis and the signals inventory."""
    return _diagnose(prometheus_url, HEALTHY)[1], _signals(prometheus_url, HEALTHY)


#: What a healthy recording may show because it is true of the machine it was recorded on:
#: node_exporter scraped this 2-core host while other work kept it busy (load 14).
TRUE_OF_THE_RECORDING_HOST = {"node": {"nodes/node-cpu-saturation"}}


def _of(name: str, finding: dict[str, object]) -> bool:
    labels = finding["labels"]
    assert isinstance(labels, dict)
    index = list(ALL_BEDS).index(name)
    return labels.get("job") in ALL_BEDS[name].directories or str(labels.get("instance", "")).startswith(
        f"10.0.{index}."
    )


def test_the_healthy_recordings_together_give_nothing_unowned(
    healthy: tuple[list[dict[str, object]], dict[str, object]],
) -> None:
    findings, _ = healthy
    orphans = [f for f in findings if not any(_of(name, f) for name in NAMES)]
    assert _loud(orphans) == []


@pytest.mark.parametrize("name", NAMES)
def test_a_healthy_recording_gives_nothing_at_warning_or_above(
    healthy: tuple[list[dict[str, object]], dict[str, object]], name: str
) -> None:
    findings = [f for f in healthy[0] if _of(name, f)]
    allowed = TRUE_OF_THE_RECORDING_HOST.get(name, set())
    assert [loud for loud in _loud(findings) if loud[0] not in allowed] == []


#: Words that make a gauge or limit no count of what a limit caps.
_NOT_COUNTS = ("status", "state", "size", "age", "cluster")


@pytest.mark.parametrize("name", NAMES)
def test_a_healthy_recording_is_read_through_its_entry_and_pairs_nothing_false(
    healthy: tuple[list[dict[str, object]], dict[str, object]], name: str
) -> None:
    services = healthy[1]["services"]
    assert isinstance(services, list)
    rows = [row for service in services for row in service["signals"] if service["service"] in BEDS[name].directories]
    if BEDS[name].entry:
        used = {row["convention"] for row in rows if row["service"] == BEDS[name].directories[0]}
        assert BEDS[name].entry in used, sorted(used)
    for row in rows:
        if row["inferred"] and str(row["signal"]).startswith("resource"):
            used_metric, limit_metric = str(row["metric"]).split(" / ")
            for word in _NOT_COUNTS:
                assert f"_{word}" not in limit_metric.removesuffix("_total"), row
            assert "status" not in used_metric, row
    # No pair that names a count was refused by its day here: the overshoot slack and the limit's
    # changes (signals/infer.py) hold on every recording.
    rejected = [r for service in services for r in service["rejected"] if service["service"] in BEDS[name].directories]
    assert [r for r in rejected if "went above" in r["reason"] or "high-water" in r["reason"]] == []


@dataclass(frozen=True)
class AtLimit:
    bed: str
    #: The rules that may name it (a server with refusals counted, or held there while clients fail).
    rule_ids: tuple[str, ...]
    #: Text the cause's summary must hold: the limit's own name and its number.
    summary: str
    #: Text its recommendation must hold.
    recommendation: str = ""


_SERVER_LIMIT = ("resources/server-connection-limit", "resources/server-connection-limit-slo")
AT_LIMIT = [
    AtLimit("mysql", _SERVER_LIMIT, "mysql max_connections at 20 of the 20 usable", "Raising the pools will not help"),
    AtLimit("memcached", _SERVER_LIMIT, "memcached max_connections reached 64 of the 64 usable",
            "stays under 64"),
    AtLimit("pgbouncer-python", ("pools/pool-exhaustion-inferred",), "all 5 connections lent out",
            "to 26 connections (Little's law on the pooler's own counts: 10.0 transactions/s served x (1.507s waiting"),
    AtLimit("pgbouncer", ("pools/pool-exhaustion-inferred",), "all 5 connections lent out",
            "to 26 connections (Little's law on the pooler's own counts: 10.0 transactions/s served x (1.504s waiting"),
    # No wait time in this exporter: the pool is sized by its floor, and says why.
    AtLimit("pgbouncer-debian", ("pools/pool-exhaustion",), "100% of 5 connections in use",
            "no hold time or served rate is measured"),
    AtLimit("tomcat", ("resources/process-limit",), "tomcat maxThreads (name=http-nio-8080) at 200 of the 200 allowed"),
    AtLimit("jetty", ("resources/process-limit",), "jetty maxThreads at 200 of the 200 allowed"),
    AtLimit("kafka", ("queues/consumer-lag",), "messages waiting in orders for order-processor, growing 69"),
]


@pytest.mark.parametrize("case", AT_LIMIT, ids=[c.bed for c in AT_LIMIT])
def test_at_its_limit_the_cause_is_named_with_the_limit_and_a_fix_that_fits(
    prometheus_url: str, case: AtLimit
) -> None:
    code, findings = _diagnose(prometheus_url, _incident(case.bed))
    assert code == 1
    causes = [f for f in findings if f["rule_id"] in case.rule_ids]
    assert causes, [(f["rule_id"], f["summary"]) for f in findings]
    cause = causes[0]
    assert case.summary in str(cause["summary"]), cause["summary"]
    assert case.recommendation in str(cause["recommendation"]), cause["recommendation"]
    for key in ("title", "summary", "recommendation"):
        assert "unknown" not in str(cause[key]) and "?" not in str(cause[key]), cause[key]
    # The cause comes first, and nothing else advises more of what loads the limit.
    assert findings[0]["rule_id"] in case.rule_ids, [f["rule_id"] for f in findings]
    for finding in findings[1:]:
        assert "current replicas" not in str(finding["recommendation"]), finding


def test_the_503s_in_front_of_a_full_mysql_fold_into_it(prometheus_url: str) -> None:
    _, findings = _diagnose(prometheus_url, _incident("mysql"))
    [shedding] = [f for f in findings if f["cause"] == "load_shedding"]
    assert str(shedding["recommendation"]).startswith("mysql max_connections held at the server's limit"), shedding
    assert "Do not add replicas" in str(shedding["recommendation"])
    [limit] = [f for f in findings if f["rule_id"] in _SERVER_LIMIT]
    evidence = limit["evidence"]
    assert isinstance(evidence, list)
    folded = [e["detail"] for e in evidence if e["source"] == "engine"]
    assert folded == ["explains http/http-load-shedding: Load shedding: mysql-max-connections-service answers 503"]


#: Where each runtime's route label holds the orders route, as the software writes it.
ORDERS_ROUTE = {
    "prom-client": "/api/orders/:id",
    "express-prom-bundle": "/api/orders/#val",
    "prometheus-flask-exporter": "/api/orders/4711",
    "starlette-exporter": "/api/orders/{order_id}",
    "http-otel-new": "/api/orders/{order_id}",
    "http-otel-old": "/api/orders/{order_id}",
    "http-client-python": "/api/orders/{order_id}",
    "http-promhttp-go": "/api/orders/{id}",
}


@pytest.fixture(scope="module")
def runtime_incident(prometheus_url: str) -> list[dict[str, object]]:
    code, findings = _diagnose(prometheus_url, _at(RUNTIME_DAY, LEAD_IN_S + INCIDENT_S - 30))
    assert code == 1
    return findings


@pytest.mark.parametrize("name", RUNTIME_BEDS)
def test_a_runtime_incident_reports_its_5xx_rate_and_latency_by_service_and_route(
    runtime_incident: list[dict[str, object]], name: str
) -> None:
    mine = {str(f["rule_id"]): f for f in runtime_incident if _of(name, f)}
    assert {"http/error-rate-breach", "http/latency-slo-breach"} <= set(mine), sorted(mine)
    for rule_id in ("http/error-rate-breach", "http/latency-slo-breach"):
        summary = str(mine[rule_id]["summary"])
        assert summary.startswith(f"{name}: "), summary
        assert f"route {ORDERS_ROUTE[name]}" in summary, summary
        assert "highest finite bucket" not in str(mine[rule_id]["recommendation"]), mine[rule_id]["recommendation"]


@pytest.mark.parametrize("name", LATENCY_BEDS)
def test_a_latency_incident_names_the_slowest_route(runtime_incident: list[dict[str, object]], name: str) -> None:
    [latency] = [f for f in runtime_incident if _of(name, f) and f["rule_id"] == "http/latency-slo-breach"]
    assert f"{name}: p99 " in str(latency["summary"]), latency["summary"]
    assert f"slowest route {ORDERS_ROUTE[name]}" in str(latency["summary"]), latency["summary"]
