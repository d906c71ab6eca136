"""``diagnose rules test`` reports what ``diagnose now --at`` reports for the same data: the same
pipeline, so the same coverage (a rule with no data says so) and the same silences.

One rule reads a series the test writes, the other a series nobody writes; the coverage of the
rule test's case is compared with ``run_diagnosis`` over a Prometheus backfilled with the same file.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from diagnoser.config import PrometheusSettings, Settings
from diagnoser.engine import DiagnosisConfig, run_diagnosis
from diagnoser.ruleset import load_rules
from diagnoser.testing.prometheus import LocalPrometheus
from diagnoser.testing.rules import backfill_text, run_rule_tests

pytestmark = pytest.mark.integration

HELD = """
cause: queue_backlog
severity: warning
title: backlog
summary: "{value:g} queued"
when:
  - promql: {query: "max(jobs_queued)", op: ">", threshold: 100}
"""
ABSENT = """
cause: memory_leak
severity: warning
title: leak
summary: "{value:g} bytes"
when:
  - promql: {query: "max(never_written_bytes)", op: ">", threshold: 1}
"""
TESTS = """
rule_files: [rules/queues/held.yaml, rules/memory/absent.yaml]
tests:
  - name: backlog
    interval: 30s
    input_series:
      - series: 'jobs_queued{job="worker"}'
        values: '500x40'
    finding_tests:
      - eval_time: 15m
        rule: "*"
        exp_findings: []
"""


def test_a_rule_test_case_has_the_coverage_diagnose_now_reports(tmp_path: Path) -> None:
    for family, name, text in (("queues", "held", HELD), ("memory", "absent", ABSENT)):
        (tmp_path / "rules" / family).mkdir(parents=True)
        (tmp_path / "rules" / family / f"{name}.yaml").write_text(text, encoding="utf-8")
    path = tmp_path / "cases.yaml"
    path.write_text(TESTS, encoding="utf-8")

    [case] = run_rule_tests([path])
    # The backlog is a warning: rule "*" wants none, and says so.
    assert case.problems == ["unexpected finding queues/held [warning] {}: 500 queued"]
    assert case.coverage is not None
    statuses = {r.rule_id: r.status for r in case.coverage.rules}
    assert statuses == {"queues/held": "evaluated", "memory/absent": "no_data"}

    text, [start] = backfill_text(path)
    at = datetime.fromtimestamp(start + 15 * 60, UTC)
    rules = load_rules([tmp_path / "rules"], include_builtin=False)
    with LocalPrometheus(openmetrics=text) as prometheus:
        now = asyncio.run(run_diagnosis(DiagnosisConfig.from_settings(Settings(prometheus=PrometheusSettings(url=prometheus.url))),
                                        rules=rules, at=at))
    assert now.coverage is not None
    assert [r.model_dump() for r in case.coverage.rules] == [r.model_dump() for r in now.coverage.rules]
    assert case.coverage.counts == now.coverage.counts == {"evaluated": 1, "no_data": 1}
    assert case.coverage.summary == now.coverage.summary
