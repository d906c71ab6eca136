"""docs/extending.md's check kind, registered as written and run by a rule on a real Prometheus."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docs.examples import only

pytestmark = pytest.mark.integration  # the rule test starts a real Prometheus

RULE = """\
cause: queue_backlog
kind: cause
severity: warning
title: "Consumers of {group} fall behind"
summary: "{group}: lag {value:.0f}"
when:
  - kafka_lag: {topic: orders, max_lag: 1000}
"""

RULE_TEST = """\
rule_files: [rules/queues/orders-lag.yaml]
tests:
  - interval: 1m
    input_series:
      - series: 'kafka_lag{topic="orders", group="billing"}'
        values: '10x5 5000x10'
      - series: 'kafka_lag{topic="orders", group="search"}'
        values: '10x15'
      - series: 'kafka_lag{topic="payments", group="billing"}'
        values: '9000x15'
    finding_tests:
      - eval_time: 12m
        rule: queues/orders-lag
        exp_findings:
          - exp_labels: {group: billing}
            exp_summary_contains: "billing: lag 5000"
      - eval_time: 3m
        rule: queues/orders-lag
        exp_findings: []
"""

# A process of its own: the kind registers in that process's registry, not in the test run's.
DRIVER = textwrap.dedent("""\
    import sys
    sys.path.insert(0, ".")
    import kafka_lag_check  # the page's module: registers kafka_lag
    from diagnoser.cli import app
    app(["rules", "test", "orders-lag-test.yaml"])
""")


def test_the_check_kind_example_registers_and_runs(tmp_path: Path) -> None:
    (tmp_path / "kafka_lag_check.py").write_text(only("check-kind").text, encoding="utf-8")
    rule = tmp_path / "rules" / "queues" / "orders-lag.yaml"
    rule.parent.mkdir(parents=True)
    rule.write_text(RULE, encoding="utf-8")
    (tmp_path / "orders-lag-test.yaml").write_text(RULE_TEST, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", DRIVER], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed, 0 failed" in done.stdout
