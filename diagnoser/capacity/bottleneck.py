"""What gave way at the knee: the cause that appeared between the last step that held and the next.

Pure functions over each step's findings (the rule pack evaluated as of the step's end, over a
window that covers the step). The knee is the pair of the highest-rate step that held (H) and
the lowest-rate step that failed (F). A cause found at F qualifies when it

- was absent at H (it *appeared* at the knee), or
- was present at H too but its measured values rose markedly from H to F (a pool already near
  its limit at H that is pinned at F with a growing queue).

If the first failing step shows no such cause (a step just past the knee, stopped early, may
not have pushed any signal over its threshold yet), the failing steps above it are read in rate
order, and a note says at which rate the cause showed. Among the causes, one that appeared ranks
before one that only rose; then a cause that explains the symptom the step failed on
(``latency_slo_breach`` for latency, ``error_rate_breach`` for errors); then one on the service
whose symptom fired; then the one whose values rose most.
Nothing here reads a rule's query text or assumes label names: findings are compared by rule
id and labels, values by the evidence rows' positions. When no cause qualifies, nothing is
named and a note says so plainly: the limit is outside what Prometheus sees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from diagnoser.capacity.report import Bottleneck
from diagnoser.models import Evidence, Finding

__all__ = ["EvaluatedStep", "find_bottleneck", "finding_key"]

#: A finding present at both steps qualifies when one of its values rose by this share.
MIN_RISE = 0.25
_SYMPTOM_FOR = {"latency": "latency_slo_breach", "errors": "error_rate_breach"}

FindingKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class EvaluatedStep:
    """A step's rate, verdict and findings (``None`` when no rule pack was evaluated)."""

    rate: float
    held: bool
    failed_on: str | None
    findings: Sequence[Finding] | None


#: Causes about the evidence, not the service: never what gave way.
_NOT_A_BOTTLENECK = frozenset({"source_unavailable", "no_data"})


def finding_key(finding: Finding) -> FindingKey:
    return finding.rule_id, tuple(sorted(finding.labels.items()))


def _rows_by_position(evidence: Sequence[Evidence]) -> dict[tuple[tuple[tuple[str, str], ...], int], float]:
    """Evidence values keyed by (labels, how many rows with those labels came before)."""
    seen: dict[tuple[tuple[str, str], ...], int] = {}
    rows: dict[tuple[tuple[tuple[str, str], ...], int], float] = {}
    for row in evidence:
        labels = tuple(sorted(row.labels.items()))
        index = seen.get(labels, 0)
        seen[labels] = index + 1
        if row.value is not None and math.isfinite(row.value):
            rows[(labels, index)] = row.value
    return rows


def rise(before: Finding | None, after: Finding) -> float:
    """How far ``after``'s values rose from ``before``'s (relative; ``inf`` from zero or from absent).

    For a finding absent before, its primary value's distance past its threshold stands in: the
    value was on the other side of the threshold one step lower.
    """
    if before is None:
        primary = after.evidence[0] if after.evidence else None
        if primary is None or primary.value is None or primary.threshold is None:
            return math.inf
        scale = abs(primary.threshold) or 1.0
        return abs(primary.value - primary.threshold) / scale
    old, new = _rows_by_position(before.evidence), _rows_by_position(after.evidence)
    best = 0.0
    for key, value in new.items():
        if key not in old:
            continue
        previous = old[key]
        if previous == 0:
            best = max(best, math.inf if value > 0 else 0.0)
        else:
            best = max(best, (value - previous) / abs(previous))
    return best


def _knee(steps: Sequence[EvaluatedStep]) -> tuple[EvaluatedStep | None, list[EvaluatedStep]]:
    """The highest-rate step that held below every failure, and the failing steps by rate."""
    failing = sorted((s for s in steps if s.failed_on is not None), key=lambda s: s.rate)
    ceiling = failing[0].rate if failing else None
    held = [s for s in steps if s.held and (ceiling is None or s.rate < ceiling)]
    return (max(held, key=lambda s: s.rate) if held else None), failing


def _first_seen(key: FindingKey, steps: Sequence[EvaluatedStep], ceiling: float) -> float:
    """The lowest rate from which the finding is present at every evaluated step up to ``ceiling``."""
    evaluated = sorted(
        (s for s in steps if s.findings is not None and s.rate <= ceiling), key=lambda s: -s.rate
    )
    first = ceiling
    for step in evaluated:
        assert step.findings is not None
        if not any(finding_key(f) == key for f in step.findings):
            break
        first = step.rate
    return first


Ranked = list[tuple[tuple[bool, bool, bool, float], Finding]]


def _candidates(failing: EvaluatedStep, before: dict[FindingKey, Finding]) -> Ranked:
    """Causes at ``failing`` that appeared or rose since the last held step, best first."""
    assert failing.findings is not None
    symptom = _SYMPTOM_FOR.get(failing.failed_on or "", "")
    services = {_service(f) for f in failing.findings if f.kind == "symptom"} - {("", "")}
    ranked: Ranked = []
    for finding in failing.findings:
        if finding.kind != "cause" or finding.cause in _NOT_A_BOTTLENECK:
            continue
        previous = before.get(finding_key(finding))
        grown = rise(previous, finding)
        if previous is not None and grown < MIN_RISE:
            continue
        order = (
            previous is not None,
            symptom not in finding.explains,
            _service(finding) not in services,
            -grown,
        )
        ranked.append((order, finding))
    return sorted(ranked, key=lambda item: item[0])


def find_bottleneck(steps: Sequence[EvaluatedStep]) -> tuple[Bottleneck | None, list[str]]:
    """The bottleneck at the knee, or ``None`` and the plain reason why none is named.

    The first failing step decides; when nothing there appeared or rose (a step just past the
    knee, stopped early, may not have pushed any signal over its threshold yet), the failing
    steps above it are read in rate order, and a note says at which rate the cause showed.
    """
    last_held, failing = _knee(steps)
    if not failing:
        return None, []
    if failing[0].findings is None:
        return None, ["no Prometheus configured: the bottleneck was not looked for (give --prometheus-url)"]
    before = {finding_key(f): f for f in (last_held.findings or [])} if last_held else {}
    for step in failing:
        ranked = _candidates(step, before) if step.findings is not None else []
        if ranked:
            notes = []
            if step is not failing[0]:
                notes.append(
                    f"nothing in Prometheus crossed a threshold at {failing[0].rate:g} req/s, the first "
                    f"failing step; {ranked[0][1].cause} did at {step.rate:g} req/s"
                )
            return _bottleneck(ranked[0][1], before, steps, step.rate), notes
    held = f"{last_held.rate:g} req/s (held)" if last_held else "the first step"
    return None, [
        f"no saturation signal found: nothing in Prometheus appeared or rose between {held} and "
        f"{failing[0].rate:g} req/s (failed on {failing[0].failed_on}); the limit is outside what "
        "Prometheus sees. Look at the service's CPU and event loop, its dependencies' own latency, "
        "the network and the load balancer in front of it, or export the metric that saturates."
    ]


def _bottleneck(
    chosen: Finding, before: dict[FindingKey, Finding], steps: Sequence[EvaluatedStep], seen_at: float
) -> Bottleneck:
    key = finding_key(chosen)
    first_seen = _first_seen(key, steps, seen_at)
    # The number to act on is computed from the load measured closest to the knee: the held
    # step's evaluation when the cause was already visible there, else that of the lowest rate
    # it was seen at (further into overload, queued requests inflate the measured demand).
    at_knee = before.get(key) or _instance_at(key, steps, first_seen) or chosen
    return Bottleneck(
        cause=chosen.cause,
        rule_id=chosen.rule_id,
        summary=chosen.summary,
        recommendation=at_knee.recommendation or chosen.recommendation,
        runbook_url=chosen.runbook_url,
        first_seen_at_rate=first_seen,
        evidence=list(chosen.evidence),
        labels=dict(chosen.labels),
    )


def _instance_at(key: FindingKey, steps: Sequence[EvaluatedStep], rate: float) -> Finding | None:
    for step in steps:
        if step.rate == rate and step.findings is not None:
            for finding in step.findings:
                if finding_key(finding) == key:
                    return finding
    return None


def _service(finding: Finding) -> tuple[str, str]:
    return finding.labels.get("namespace", ""), finding.service
