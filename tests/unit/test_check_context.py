"""Checks see a narrow context, and the settings' signal catalogue travels with the run, not as a global."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from datetime import UTC, datetime
from pathlib import Path

from diagnoser.checks import CheckContext, check_kinds
from diagnoser.config import Settings
from diagnoser.engine import DiagnosisConfig, RulePack, load_ruleset
from diagnoser.engine.coverage import CoverageInputs, metric_names_of
from diagnoser.engine.evaluate import evaluate
from diagnoser.ruleset import load_rules
from diagnoser.ruleset.lint import LintInputs, lint_static
from diagnoser.sources import Sources

CATALOGUE = """\
signals:
  queue.depth: {type: gauge, unit: items, help: Items waiting.}
conventions:
  - name: acme-queue
    title: ACME's in-house queue
    labels: {queue: acme_queue}
    signals:
      queue.depth: acme_queue_waiting
"""
RULE = """\
cause: queue_backlog
severity: warning
title: Queue backlog on {subject}
summary: "{value} items waiting"
when:
  - signal:
      query: max by (namespace, service, queue) ({{queue.depth}})
      op: ">"
      threshold: 100
"""


def test_a_check_is_given_no_settings() -> None:
    fields = {f.name for f in dataclasses.fields(CheckContext)}
    assert fields == {"at", "sources", "catalogue", "window", "recognised_at", "narrowed_to"}
    for kind in check_kinds().values():
        if kind.queries is not None:
            # The catalogue (a lambda that ignores it has no annotation), never the settings.
            second = list(inspect.signature(kind.queries).parameters.values())[1]
            assert second.annotation in ("Catalogue", inspect.Parameter.empty), kind.name
            assert second.name != "settings", kind.name


def _user_catalogue(tmp_path: Path) -> Settings:
    (tmp_path / "acme.yaml").write_text(CATALOGUE, encoding="utf-8")
    (tmp_path / "rules" / "queues").mkdir(parents=True)
    (tmp_path / "rules" / "queues" / "acme-backlog.yaml").write_text(RULE, encoding="utf-8")
    return Settings(signal_files=[tmp_path / "acme.yaml"], rule_dirs=[tmp_path / "rules"])


def test_rules_naming_a_configured_signal_load_evaluate_and_lint_with_it(tmp_path: Path) -> None:
    settings = _user_catalogue(tmp_path)
    ruleset = load_ruleset(RulePack.from_settings(settings))
    assert [str(p) for p in ruleset.problems] == []
    rule = ruleset.rules["queues/acme-backlog"]
    assert metric_names_of(rule, CoverageInputs.of(DiagnosisConfig.from_settings(settings))) == {
        "acme_queue_waiting"
    }
    assert lint_static(ruleset, LintInputs.from_settings(settings)) == []
    # Evaluated with the same catalogue: without Prometheus the rule is skipped, not failed.
    outcomes: list = []
    at = datetime(2026, 11, 29, tzinfo=UTC)
    asyncio.run(evaluate([rule], DiagnosisConfig.from_settings(settings), Sources(), at=at, record=outcomes))
    assert [(o.skipped, o.errors) for o in outcomes] == [("source prometheus not configured", [])]


def test_without_the_configured_catalogue_the_signal_is_unknown(tmp_path: Path) -> None:
    settings = _user_catalogue(tmp_path)
    loaded = load_rules(settings.rule_dirs, include_builtin=False)  # the shipped catalogue only
    assert "unknown signal 'queue.depth'" in " ".join(str(p) for p in loaded.problems)
    # ...and loading with it once leaves no trace for the next load.
    load_ruleset(RulePack.from_settings(settings))
    again = load_rules(settings.rule_dirs, include_builtin=False)
    assert "unknown signal 'queue.depth'" in " ".join(str(p) for p in again.problems)
