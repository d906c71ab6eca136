"""Every finding the shipped rules raise over recorded beds reads as a person would write it.

The beds are real exporters' and libraries' expositions (tests/fixtures/expositions), replayed as
incidents on one timeline, each under its own job, and diagnosed once through the real CLI. Each
finding is then rendered as the console, Markdown and Slack show it. None of those texts may hold
scientific notation (``1.79e+04``), ``unknown``, ``nan`` or ``inf``, and no evidence line may be a
bare number (``• 1 [prometheus]``): every line names what it measures before its value.
"""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime

import pytest
from rich.console import Console

from diagnoser.models import Diagnosis, Finding
from diagnoser.notify import render_markdown, render_table
from diagnoser.notify.slack import evidence_lines, render_finding
from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here, shared_bed
from tests.fixtures.expositions.timeline import incident_openmetrics

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

#: Beds cheap to replay that, together, make every family of rules fire: pools of every
#: convention, servers and proxies at their limits, HTTP and gRPC services, client-side
#: dependencies, queues, and the exporter that cannot scrape a Redis at maxclients.
BEDS = (
    "redis-exporter-maxclients", "http-promhttp-go", "http-client-python", "otel-http-legacy",
    "grpc-otel-new", "grpc-go-prometheus", "grpc-go-prometheus-client", "go-redis-redisotel",
    "go-sql", "hikaricp-micrometer", "otelsql-go", "sqlalchemy-otel", "pgbouncer-exporter-debian",
    "otel-js-pg", "envoy", "kafka-exporter-lag", "micrometer-tomcat-threads", "memcached-exporter",
    "apache-exporter", "otel-requests-client-old", "otel-httpx-client-old", "micrometer-spring-checkout",
)  # fmt: skip
LEAD_IN_S = 600
INCIDENT_S = 300
START_S = 1_790_000_000
#: What a person should never have to read in a finding (gRPC's own ``Unknown`` status is a name).
UNREADABLE = re.compile(r"\d[eE][+-]\d|\bunknown\b|\bnan\b|\binf\b")
#: Markdown's `code`: the PromQL sent, as written (``1e-06`` is a literal there, not prose).
CODE = re.compile(r"`[^`]*`")
#: An evidence line that starts with its number: nothing says what the number is.
BARE_NUMBER = re.compile(r"^\W*[-\d.,]+(\s|$)")


@pytest.fixture(scope="module")
def findings() -> list[Finding]:
    text = "".join(
        incident_openmetrics(
            bed,
            start_s=START_S,
            lead_in_s=LEAD_IN_S,
            incident_s=INCIDENT_S,
            scrape_labels={"job": bed, "instance": f"10.0.{index}.1:9000"},
        ).removesuffix("# EOF\n")
        for index, bed in enumerate(BEDS)
    )
    with LocalPrometheus(openmetrics=text + "# EOF\n") as prometheus:
        at = datetime.fromtimestamp(START_S + LEAD_IN_S + INCIDENT_S - 30, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        result = run_cli_here("now", "--prometheus-url", prometheus.url, "--at", at, "--format", "json")
    assert result.code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == [], report["errors"]
    return [Finding.model_validate(finding) for finding in report["findings"]]


def _console_text(finding: Finding, verbose: bool) -> str:
    diagnosis = Diagnosis(evaluated_at=datetime.now(UTC), findings=[finding])
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_table(diagnosis, verbose=verbose, width=200))
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


def _problems(finding: Finding) -> list[str]:
    diagnosis = Diagnosis(evaluated_at=datetime.now(UTC), findings=[finding])
    slack = json.dumps(render_finding(finding, at=datetime.now(UTC)).payload(), ensure_ascii=False)
    texts = {
        "title": finding.title,
        "summary": finding.summary,
        "recommendation": finding.recommendation,
        "console": _console_text(finding, verbose=False),
        "console -v": _console_text(finding, verbose=True),
        "markdown": CODE.sub("", render_markdown(diagnosis)),
        "slack": slack,
    }
    problems = [f"{where}: {match.group(0)!r} in {text!r}" for where, text in texts.items()
                for match in [UNREADABLE.search(text)] if match]  # fmt: skip
    for line in evidence_lines(finding, limit=len(finding.evidence)):
        if BARE_NUMBER.match(line.removeprefix("• ")):
            problems.append(f"evidence line without a name: {line!r}")
    return problems


def test_the_beds_raise_findings_of_every_family(findings: list[Finding]) -> None:
    families = {finding.rule_id.split("/")[0] for finding in findings}
    assert {"pools", "resources", "http", "dependencies", "queues", "sources"} <= families, families


def test_every_finding_reads_as_numbers_a_person_reads(findings: list[Finding]) -> None:
    problems = {f"{finding.rule_id} ({finding.labels.get('job')})": _problems(finding) for finding in findings}
    assert {where: found for where, found in problems.items() if found} == {}


def test_the_exporter_is_never_named_as_the_redis_it_cannot_read(findings: list[Finding]) -> None:
    [blind] = [f for f in findings if f.rule_id == "pools/redis-maxclients-exporter-blind"]
    exporter = blind.labels["instance"]
    assert f"Redis at maxclients: {exporter}" not in blind.title
    assert f"exporter {exporter}" in blind.title
    assert not blind.summary.startswith(exporter)
