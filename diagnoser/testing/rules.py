"""Rule unit tests in promtool's style, evaluated on a real, backfilled Prometheus.

A test file looks like a promtool rule test, with findings instead of alerts::

    rule_files: [my-rules/pools/orders-pool.yaml]   # optional: default is the built-in pack
    config: {slo: {p99_ms: 250}}                     # optional: settings for these tests
    tests:
      - name: pool exhausted at peak
        interval: 30s
        input_series:
          - series: 'hikaricp_connections_active{pool="orders"}'
            values: '10x40'
        finding_tests:
          - eval_time: 15m
            rule: pools/pool-exhaustion
            exp_findings:
              - exp_labels: {pool: orders}
                exp_summary_contains: "10/10"
          - eval_time: 15m
            rule: pools/pool-exhaustion
            exp_findings: []                          # must stay silent

``rule: "*"`` with ``exp_findings: []`` asserts that no rule reports anything at warning or above.
All test groups of all files share one Prometheus: each group's series are shifted to its own
day, far enough apart that no window or lookback reaches another group's data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from diagnoser.config import Settings, load_settings
from diagnoser.engine.config import DiagnosisConfig
from diagnoser.engine.run import BuiltSources, load_ruleset, run_diagnosis
from diagnoser.errors import ConfigError
from diagnoser.models import Coverage, Diagnosis, Finding
from diagnoser.promql import duration_seconds
from diagnoser.ruleset import Rule, RuleSet, load_rules
from diagnoser.sources import Sources
from diagnoser.sources.prometheus import PrometheusSource
from diagnoser.testing.prometheus import LocalPrometheus
from diagnoser.testing.remote_write import FloatSeries, HistogramSeries
from diagnoser.testing.series import (
    NotationError,
    SeriesSpec,
    expand_native,
    expand_values,
    parse_series,
    to_openmetrics,
)
from diagnoser.yamlfile import read_yaml

__all__ = ["CaseResult", "RuleTestFile", "backfill_text", "load_test_file", "run_rule_tests"]

#: Each test group gets its own day of the backfilled timeline, from a fixed Friday 18:00 UTC
#: (2026-11-27) so reports read like real incidents rather than 1970.
GROUP_SPACING_S = 86_400
TIMELINE_START_S = 1_795_802_400


def parse_duration(text: str | int | float) -> float:
    """``30s``, ``1h30m`` (a PromQL duration, as promtool reads them) or a number of seconds, as seconds."""
    if isinstance(text, int | float):
        return float(text)
    return duration_seconds(text.strip())


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSeries(_Strict):
    series: str
    values: str

    @field_validator("series")
    @classmethod
    def _series(cls, value: str) -> str:
        parse_series(value)
        return value

    @field_validator("values", mode="before")
    @classmethod
    def _values(cls, value: Any) -> str:
        if expand_native(str(value)) is None:
            expand_values(str(value))
        return str(value)


class ExpectedFinding(_Strict):
    exp_labels: dict[str, str] = Field(default_factory=dict)
    exp_severity: str | None = None
    exp_summary_contains: str | None = None
    exp_recommendation_contains: str | None = None


class FindingTest(_Strict):
    eval_time: str
    rule: str
    exp_findings: list[ExpectedFinding] = Field(default_factory=list)

    @field_validator("eval_time")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value


class TestGroup(_Strict):
    name: str = ""
    interval: str = "1m"
    input_series: list[InputSeries] = Field(default_factory=list)
    finding_tests: list[FindingTest] = Field(min_length=1)

    @field_validator("interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value


class RuleTestFile(_Strict):
    rule_files: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    tests: list[TestGroup] = Field(min_length=1)


@dataclass
class CaseResult:
    """The outcome of one finding test."""

    file: str
    group: str
    rule: str
    eval_time: str
    problems: list[str] = field(default_factory=list)
    #: What was checked at the instant, as ``diagnose now --at`` reports it (the same pipeline).
    coverage: Coverage | None = None

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def name(self) -> str:
        group = f" {self.group!r}" if self.group else ""
        return f"{self.file}{group} {self.rule} @ {self.eval_time}"


def load_test_file(path: Path) -> RuleTestFile:
    """Read and validate one test file; raises :class:`ConfigError` naming file and field."""
    try:
        return RuleTestFile.model_validate(read_yaml(path, "rule test"))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{path}: {where}: {err['msg']}") from exc
    except NotationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


@dataclass
class _PlannedGroup:
    path: Path
    spec: RuleTestFile
    group: TestGroup
    start_s: float
    rules: RuleSet
    config: DiagnosisConfig


def run_rule_tests(
    paths: Sequence[Path], *, base_config: Mapping[str, Any] | None = None
) -> list[CaseResult]:
    """Run every test in ``paths`` on one local Prometheus; returns one result per finding test.

    Each file's ``config:`` is merged over ``base_config`` (the configuration as data, as
    ``Settings.model_dump(mode="json")`` writes it; default: the settings of the environment),
    its ``prometheus`` section left out since the tests bring their own.
    """
    planned: list[_PlannedGroup] = []
    samples: list[tuple[SeriesSpec, float, float]] = []
    natives: list[HistogramSeries] = []
    for path in paths:
        spec = load_test_file(path)
        config = DiagnosisConfig.from_settings(_settings_for(spec, base_config))
        rules = _rules_for(path, spec, config)
        if rules.problems:
            raise ConfigError("\n".join(str(p) for p in rules.problems))
        for group in spec.tests:
            start = TIMELINE_START_S + GROUP_SPACING_S * len(planned)
            planned.append(_PlannedGroup(path, spec, group, start, rules, config))
            samples.extend(_group_samples(group, start))
            natives.extend(_native_series(group, start))
    if not natives:
        with LocalPrometheus(openmetrics=to_openmetrics(samples)) as prometheus:
            return asyncio.run(_evaluate_all(planned, prometheus.url))
    # Native histograms reach Prometheus 3 by remote write only, the float series with them (a
    # backfilled block's time range is closed to later writes).
    grouped: dict[SeriesSpec, list[tuple[float, float]]] = {}
    for spec_, timestamp, value in samples:
        grouped.setdefault(spec_, []).append((timestamp, value))
    floats = [FloatSeries({"__name__": k.name, **dict(k.labels)}, v) for k, v in grouped.items()]
    with LocalPrometheus(major="3", series=[*floats, *natives]) as prometheus:
        return asyncio.run(_evaluate_all(planned, prometheus.url))


def _native_series(group: TestGroup, start: float) -> Iterable[HistogramSeries]:
    interval = parse_duration(group.interval)
    for series in group.input_series:
        values = expand_native(series.values)
        if values is None:
            continue
        spec = parse_series(series.series)
        samples = [(start + i * interval, v) for i, v in enumerate(values) if v is not None]
        yield HistogramSeries({"__name__": spec.name, **dict(spec.labels)}, samples)


def backfill_text(path: Path) -> tuple[str, list[float]]:
    """OpenMetrics for every group of one test file, and each group's start (unix seconds).

    The demo and benchmarks use it to load a scenario into a Prometheus of their own.
    """
    spec = load_test_file(path)
    starts = [float(TIMELINE_START_S + GROUP_SPACING_S * index) for index in range(len(spec.tests))]
    samples = [
        s for group, start in zip(spec.tests, starts, strict=True) for s in _group_samples(group, start)
    ]
    return to_openmetrics(samples), starts


def _settings_for(spec: RuleTestFile, base: Mapping[str, Any] | None) -> Settings:
    if base is None:
        base = load_settings().model_dump(mode="json")
    without_prometheus = {key: value for key, value in base.items() if key != "prometheus"}
    return load_settings(overrides=_merge(without_prometheus, dict(spec.config)))


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = (
            _merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged


def _rules_for(path: Path, spec: RuleTestFile, config: DiagnosisConfig) -> RuleSet:
    if not spec.rule_files:
        return load_ruleset(config.rules)
    files = [(path.parent / name).resolve() for name in spec.rule_files]
    return load_rules(files, include_builtin=False, catalogue=config.catalogue)


def _group_samples(group: TestGroup, start: float) -> Iterable[tuple[SeriesSpec, float, float]]:
    interval = parse_duration(group.interval)
    for series in group.input_series:
        if expand_native(series.values) is not None:
            continue
        spec = parse_series(series.series)
        for index, value in enumerate(expand_values(series.values)):
            if value is not None:
                yield spec, start + index * interval, value


async def _evaluate_all(planned: list[_PlannedGroup], url: str) -> list[CaseResult]:
    results: list[CaseResult] = []
    for plan in planned:
        source = PrometheusSource(
            plan.config.sources.prometheus.model_copy(update={"url": url}),
            metric_overrides=dict(plan.config.sources.metrics),
        )
        try:
            for test in plan.group.finding_tests:
                results.append(await _run_case(plan, test, source))
        finally:
            await source.aclose()
    return results


async def _run_case(plan: _PlannedGroup, test: FindingTest, source: PrometheusSource) -> CaseResult:
    result = CaseResult(str(plan.path), plan.group.name, test.rule, test.eval_time)
    at = datetime.fromtimestamp(plan.start_s + parse_duration(test.eval_time), UTC)
    if test.rule == "*":
        selected: list[Rule] = list(plan.rules)
    elif test.rule in plan.rules.rules:
        selected = [plan.rules.rules[test.rule]]
    else:
        loaded = ", ".join(sorted(plan.rules.rules)) or "none"
        result.problems.append(f"no rule {test.rule!r} in the rules under test (loaded: {loaded})")
        return result
    # The pipeline of ``diagnose now``: the same coverage, silences and ranking.
    chosen = RuleSet(rules={rule.id: rule for rule in selected})
    # The scenario's interval is its scrape interval: a backfilled scenario has no ``up`` to read it by.
    config = replace(plan.config, assumed_scrape_interval_s=parse_duration(plan.group.interval))
    diagnosis = await run_diagnosis(
        config, rules=chosen, at=at, sources=BuiltSources(Sources(prometheus=source))
    )
    result.coverage = diagnosis.coverage
    result.problems.extend(f"source error: {e}" for e in diagnosis.errors)
    if test.rule == "*":
        if test.exp_findings:
            result.problems.append('rule "*" only supports exp_findings: [] (nothing at warning or above)')
        loud = [f for f in diagnosis.findings if f.is_actionable]
        result.problems.extend(f"unexpected finding {_describe(f)}" for f in loud)
        return result
    result.problems.extend(_compare(diagnosis, test))
    return result


def _compare(diagnosis: Diagnosis, test: FindingTest) -> list[str]:
    found = [f for f in diagnosis.findings if f.rule_id == test.rule]
    problems: list[str] = []
    unmatched = list(found)
    for expected in test.exp_findings:
        match = next((f for f in unmatched if _matches(f, expected)), None)
        if match is None:
            problems.append(
                f"expected a finding with {expected.model_dump(exclude_none=True)}; got {_list(found)}"
            )
            # Say which field failed, on the finding that came closest.
            closest = min(unmatched, key=lambda f: len(_mismatches(f, expected)), default=None)
            if closest is not None:
                problems.extend(f"  {line}" for line in _mismatches(closest, expected))
        else:
            unmatched.remove(match)
    problems.extend(f"unexpected finding {_describe(f)}" for f in unmatched)
    return problems


def _matches(finding: Finding, expected: ExpectedFinding) -> bool:
    if any(finding.labels.get(k) != v for k, v in expected.exp_labels.items()):
        return False
    if expected.exp_severity and finding.severity.value != expected.exp_severity:
        return False
    if expected.exp_summary_contains and expected.exp_summary_contains not in finding.summary:
        return False
    return not (
        expected.exp_recommendation_contains
        and expected.exp_recommendation_contains not in finding.recommendation
    )


def _mismatches(finding: Finding, expected: ExpectedFinding) -> list[str]:
    """Each expectation ``finding`` fails, naming the field compared and what it held."""
    lines = [
        f"exp_labels.{key}: expected {value!r}, got {finding.labels.get(key)!r}"
        for key, value in expected.exp_labels.items()
        if finding.labels.get(key) != value
    ]
    if expected.exp_severity and finding.severity.value != expected.exp_severity:
        lines.append(f"exp_severity: expected {expected.exp_severity!r}, got {finding.severity.value!r}")
    if expected.exp_summary_contains and expected.exp_summary_contains not in finding.summary:
        lines.append(
            f"exp_summary_contains: {expected.exp_summary_contains!r} not in summary {finding.summary!r}"
        )
    wanted = expected.exp_recommendation_contains
    if wanted and wanted not in finding.recommendation:
        lines.append(
            f"exp_recommendation_contains: {expected.exp_recommendation_contains!r} not in "
            f"recommendation {finding.recommendation!r}"
        )
    return lines


def _describe(finding: Finding) -> str:
    return f"{finding.rule_id} [{finding.severity.value}] {finding.labels}: {finding.summary}"


def _list(findings: list[Finding]) -> str:
    return "; ".join(_describe(f) for f in findings) or "no finding"
