"""The engine's guarantees: isolation of failing rules, one deadline, joins, ranking."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from diagnoser.checks import CheckContext, CheckResult, check_kind
from diagnoser.config import load_settings
from diagnoser.engine import DiagnosisConfig, diagnose, rank_findings
from diagnoser.models import Evidence, Finding, Severity, SourceError
from diagnoser.ruleset import load_rules
from diagnoser.sources import Sources


class FakeParams(BaseModel):
    """Rows to return, an error to raise or report, or a delay: a check kind made for these tests."""

    model_config = ConfigDict(extra="forbid")
    rows: list[dict[str, str | float]] = []
    raise_error: bool = False
    source_error: str | None = None
    endpoint_error: bool = False
    sleep_s: float = 0.0


@check_kind("test_fake", params=FakeParams, reads={"prometheus"})
async def fake_check(params: FakeParams, ctx: CheckContext) -> CheckResult:
    if params.sleep_s:
        await asyncio.sleep(params.sleep_s)
    if params.raise_error:
        raise RuntimeError("bug in a check")
    if params.source_error:
        scope = "endpoint" if params.endpoint_error else "query"
        return SourceError(source="prometheus", message=params.source_error, scope=scope)
    return [
        Evidence(
            source="prometheus",
            query="fake",
            labels={k: str(v) for k, v in row.items() if k != "value"},
            value=float(row.get("value", 1.0)),
        )
        for row in params.rows
    ]


def rule(root: Path, rule_id: str, body: str, *, cause: str = "connection_pool_exhaustion", kind: str = "cause",
         severity: str = "critical", extra: str = "") -> None:
    path = root / f"{rule_id}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"cause: {cause}\nkind: {kind}\nseverity: {severity}\ntitle: '{rule_id}'\n"
        f"summary: '{{pool}} at {{value}} pending {{pending}}'\n{extra}when:\n{body}"
    )


SOURCES = Sources(prometheus=object())  # type: ignore[arg-type]  # the fake kind never touches it


def run(root: Path, deadline: float = 5.0) -> tuple[list[Finding], list[SourceError], float]:
    settings = load_settings(overrides={"deadline_s": deadline})
    rules = load_rules([root], include_builtin=False)
    assert not rules.problems, rules.problems
    started = time.perf_counter()
    diagnosis = asyncio.run(diagnose(rules, DiagnosisConfig.from_settings(settings), SOURCES, at=datetime(2026, 11, 29, tzinfo=UTC)))
    return diagnosis.findings, diagnosis.errors, time.perf_counter() - started


def test_failing_rule_does_not_stop_others(tmp_path: Path) -> None:
    rule(tmp_path, "a/broken", "  - test_fake: {raise_error: true}\n")
    rule(tmp_path, "a/works", "  - test_fake: {rows: [{pool: p1}]}\n")
    findings, errors, _ = run(tmp_path)
    assert [f.rule_id for f in findings] == ["a/works"]
    assert [e.source for e in errors] == ["engine"]
    assert "a/broken failed: RuntimeError: bug in a check" in errors[0].message


def test_one_deadline_for_all_rules(tmp_path: Path) -> None:
    for index in range(20):
        rule(tmp_path, f"slow/r{index}", "  - test_fake: {sleep_s: 30}\n")
    rule(tmp_path, "fast/r", "  - test_fake: {rows: [{pool: p1}]}\n")
    findings, errors, elapsed = run(tmp_path, deadline=0.5)
    assert elapsed < 10  # the rules sleep 30 s: only the deadline ends the run this early
    assert [f.rule_id for f in findings if f.cause != "source_unavailable"] == ["fast/r"]
    # One cause, one entry: the rules it cut short are counted, not listed one by one.
    assert [e.message for e in errors] == ["no answer before the diagnosis deadline (20 rules affected)"]


def test_rules_cut_short_by_the_deadline_count_under_the_failed_endpoint_that_held_them(tmp_path: Path) -> None:
    # A stuck Prometheus on a loaded machine: some rules meet its own timeout, the rest the deadline.
    message = "no answer within 1s from http://p:9090"
    for index in range(2):
        rule(tmp_path, f"x/timed-out{index}", f"  - test_fake: {{source_error: '{message}', endpoint_error: true}}\n")
    for index in range(3):
        rule(tmp_path, f"x/cut{index}", "  - test_fake: {sleep_s: 30}\n")
    _, errors, _ = run(tmp_path, deadline=0.5)
    assert [e.message for e in errors] == [f"{message} (5 rules affected)"]


def test_a_query_error_does_not_absorb_the_deadline(tmp_path: Path) -> None:
    rule(tmp_path, "x/bad", "  - test_fake: {source_error: 'HTTP 400: parse error'}\n")
    rule(tmp_path, "x/cut", "  - test_fake: {sleep_s: 30}\n")
    _, errors, _ = run(tmp_path, deadline=0.5)
    assert sorted(e.message for e in errors) == ["HTTP 400: parse error", "no answer before the diagnosis deadline"]


def test_source_errors_collapse_and_become_one_source_unavailable_finding(tmp_path: Path) -> None:
    for index in range(3):
        rule(tmp_path, f"x/r{index}", "  - test_fake: {source_error: 'cannot connect to http://p:9090'}\n")
    findings, errors, _ = run(tmp_path)
    assert len(errors) == 1
    assert errors[0].message == "cannot connect to http://p:9090 (3 rules affected)"
    assert [(f.cause, f.severity) for f in findings] == [("source_unavailable", Severity.warning)]


def test_conditions_join_on_shared_labels(tmp_path: Path) -> None:
    rule(
        tmp_path,
        "pools/join",
        "  - test_fake: {rows: [{pool: a, value: 1}, {pool: b, value: 1}, {pool: c, value: 1}]}\n"
        "  - name: pending\n"
        "    test_fake: {rows: [{pool: b, value: 7}, {pool: c, value: 2}, {pool: c, job: x, value: 9}]}\n"
        "  - test_fake: {rows: [{}]}\n",  # label-less: holds for every candidate
    )
    findings, _, _ = run(tmp_path)
    assert sorted((f.labels["pool"], f.summary) for f in findings) == [
        ("b", "b at 1.0 pending 7.0"),
        ("c", "c at 1.0 pending 9.0"),
    ]


def test_group_by_empty_makes_one_finding(tmp_path: Path) -> None:
    rule(
        tmp_path,
        "k/hpas",
        "  - test_fake: {rows: [{hpa: a}, {hpa: b}, {hpa: c}]}\n",
        extra="group_by: []\n",
    )
    findings, _, _ = run(tmp_path)
    assert len(findings) == 1
    assert len(findings[0].evidence) == 3


def _finding(rule_id: str, cause: str, kind: str = "cause", severity: str = "critical",
             explains: list[str] | None = None) -> Finding:
    return Finding(rule_id=rule_id, cause=cause, kind=kind, severity=Severity(severity),  # type: ignore[arg-type]
                   title="", summary="", explains=explains or [])


def test_ranking_puts_causes_explaining_active_symptoms_first() -> None:
    ranked = rank_findings([
        _finding("n/cpu", "node_cpu_saturation", severity="critical"),
        _finding("h/lat", "latency_slo_breach", kind="symptom"),
        _finding("z/pool", "connection_pool_exhaustion", severity="warning", explains=["latency_slo_breach"]),
        _finding("a/info", "duplicate_scrape", severity="info", explains=["latency_slo_breach"]),
        _finding("e/shed", "load_shedding", explains=["error_rate_breach"]),
    ])
    assert [f.rule_id for f in ranked] == ["z/pool", "h/lat", "e/shed", "n/cpu", "a/info"]


def test_ranking_prefers_the_cause_on_the_same_service_as_the_symptom() -> None:
    symptom = _finding("h/lat", "latency_slo_breach", kind="symptom")
    symptom.labels = {"namespace": "shop", "job": "checkout"}
    elsewhere = _finding("a/pool", "connection_pool_exhaustion", explains=["latency_slo_breach"])
    elsewhere.labels = {"namespace": "shop", "job": "billing"}
    same = _finding("b/pool", "connection_pool_exhaustion", explains=["latency_slo_breach"])
    same.labels = {"namespace": "shop", "job": "checkout", "pool": "orders"}
    assert [f.rule_id for f in rank_findings([elsewhere, symptom, same])] == ["b/pool", "a/pool", "h/lat"]


def test_ranking_puts_the_cause_upstream_of_another_cause_first_even_from_another_service() -> None:
    symptom = _finding("h/err", "error_rate_breach", kind="symptom")
    symptom.labels = {"job": "orders"}
    shedding = _finding("http/shed", "load_shedding", explains=["error_rate_breach"])
    shedding.labels = {"job": "orders"}
    database = _finding("resources/limit", "connection_limit_reached", severity="warning",
                        explains=["error_rate_breach", "load_shedding"])
    database.labels = {"job": "postgres"}
    ranked = rank_findings([shedding, symptom, database])
    assert [f.rule_id for f in ranked] == ["resources/limit", "http/shed", "h/err"]


def test_a_cause_explained_by_another_folds_into_it_once() -> None:
    from diagnoser.engine.rank import rank_findings
    from diagnoser.models import Finding, Severity

    limit = Finding(
        rule_id="resources/server-connection-limit", cause="connection_limit_reached", kind="cause",
        severity=Severity.critical, title="mysql max_connections at the server's limit: mysql",
        summary="mysql max_connections reached 20 of the 20 allowed", recommendation="Put a pooler in front.",
        runbook_url="https://runbooks/resources/server-connection-limit.md", labels={"job": "mysql"},
        explains=["load_shedding", "error_rate_breach"],
    )
    shedding = Finding(
        rule_id="http/http-load-shedding", cause="load_shedding", kind="cause", severity=Severity.critical,
        title="Load shedding: orders answers 503", summary="orders: 95% of requests get 503",
        recommendation="about 28.00x the current replicas", labels={"job": "orders"},
        explains=["error_rate_breach"],
    )
    elsewhere = shedding.model_copy(update={"labels": {"job": "billing", "namespace": "billing"}})
    mine = limit.model_copy(update={"labels": {"job": "mysql", "namespace": "shop"}})
    ranked = rank_findings(rank_findings([shedding, limit]))
    assert [f.rule_id for f in ranked] == ["resources/server-connection-limit", "http/http-load-shedding"]
    folded = ranked[1]
    assert folded.recommendation.startswith("mysql max_connections at the server's limit: mysql explains this")
    assert "replicas" in folded.recommendation and "28.00x" not in folded.recommendation
    assert [e.detail for e in folded.evidence] == [
        "explained by resources/server-connection-limit: mysql max_connections at the server's limit: mysql"
    ]
    assert [e.detail for e in ranked[0].evidence] == [
        "explains http/http-load-shedding: Load shedding: orders answers 503"
    ]
    # Another namespace's 503s keep their own advice.
    apart = rank_findings([elsewhere, mine])
    assert [f.recommendation for f in apart if f.cause == "load_shedding"] == ["about 28.00x the current replicas"]


def test_rows_found_by_index_are_the_rows_that_agree_in_their_order() -> None:
    """The candidates' join (:class:`AgreeingRows`) gives exactly what a scan with ``agrees`` gives,
    whatever labels rows and candidates carry: shared, missing, extra, and more shapes than indexed."""
    import random

    from diagnoser.engine.rank import AgreeingRows, agrees

    generator = random.Random(20261203)
    names = ["namespace", "job", "instance", "pool", "route", "le"]
    for shapes in (1, 3, 40):
        layouts = [generator.sample(names, generator.randint(0, 4)) for _ in range(shapes)]
        rows = [
            Evidence(
                source="prometheus",
                query="q",
                labels={name: f"v{generator.randint(0, 3)}" for name in generator.choice(layouts)},
                value=float(index),
            )
            for index in range(300)
        ]
        index = AgreeingRows(rows)
        for _ in range(200):
            labels = {name: f"v{generator.randint(0, 3)}" for name in generator.sample(names, 3)}
            assert index.agreeing(labels) == [row for row in rows if agrees(labels, row.labels)]
        assert index.agreeing({}) == rows
