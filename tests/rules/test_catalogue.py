"""The rule pack as a whole: every rule loads, has its runbook, and is tested both ways."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diagnoser.models import CAUSES, SYMPTOMS
from diagnoser.ruleset import builtin_rules_dir, load_rules
from diagnoser.testing.rules import load_test_file

RULES = load_rules([], include_builtin=True)
SECTIONS = ["Meaning", "Impact", "Diagnosis", "Mitigation", "Verify"]
SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))


def test_pack_loads_without_problems() -> None:
    assert not RULES.problems, "\n".join(map(str, RULES.problems))
    assert len(RULES) >= 20


@pytest.mark.parametrize("rule_id", sorted(RULES.rules))
def test_rule_has_runbook_with_every_section(rule_id: str) -> None:
    rule = RULES.rules[rule_id]
    assert rule.runbook_path is not None, f"{rule.path} has no runbook beside it"
    text = rule.runbook_path.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+?)\s*$", text, flags=re.M)
    assert headings[: len(SECTIONS)] == SECTIONS, f"{rule.runbook_path}: sections {headings}"


@pytest.mark.parametrize("rule_id", sorted(RULES.rules))
def test_rule_cause_is_in_the_vocabulary(rule_id: str) -> None:
    rule = RULES.rules[rule_id]
    assert rule.cause in (SYMPTOMS if rule.kind == "symptom" else CAUSES)
    # What a cause explains: symptoms, or a cause downstream of it (a pool and the 503s it causes).
    assert set(rule.explains) <= SYMPTOMS | CAUSES
    assert rule.cause not in rule.explains


@pytest.mark.parametrize("rule_id", sorted(RULES.rules))
def test_rule_id_is_its_path_and_runbook_url(rule_id: str) -> None:
    rule = RULES.rules[rule_id]
    assert rule.path.relative_to(builtin_rules_dir()).with_suffix("").as_posix() == rule_id
    assert rule.runbook_url("https://example.test/rules/") == f"https://example.test/rules/{rule_id}.md"


def _scenario_cases() -> dict[str, set[str]]:
    """rule id -> {"fires", "silent"} as covered by the Prometheus scenarios."""
    covered: dict[str, set[str]] = {}
    for path in SCENARIOS:
        for group in load_test_file(path).tests:
            for test in group.finding_tests:
                covered.setdefault(test.rule, set()).add("fires" if test.exp_findings else "silent")
    return covered


PROMETHEUS_RULES = sorted(r.id for r in RULES if set(r.sources) == {"prometheus"})


@pytest.mark.parametrize("rule_id", PROMETHEUS_RULES)
def test_prometheus_rule_has_firing_and_silent_scenarios(rule_id: str) -> None:
    covered = _scenario_cases().get(rule_id, set())
    assert covered == {"fires", "silent"}, f"{rule_id}: scenarios cover only {sorted(covered) or 'nothing'}"


def test_source_unavailable_has_a_runbook() -> None:
    runbook = builtin_rules_dir() / "sources" / "source-unavailable.md"
    assert runbook.exists()


def test_probe_latency_summary_says_each_percentile_once() -> None:
    # The summary's detail already carries the p50: "p50 228.6 ms, p50 228.607 ms" said it twice.
    summary = RULES.rules["probe/probe-latency-slo-breach"].summary
    assert summary.count("p50") == 0 and "{detail}" in summary
