"""Silences: known problems kept out of the report and notifications for a while, with a trace.

A silence (``silences:`` in the config) matches a finding when every matcher equals the
finding's ``cause``, ``rule_id``, ``severity`` or label of that name, and it holds until its
``until`` (wall-clock time, also when ``--at`` looks back). ``diagnose now`` and ``diagnose serve``
apply the same silences; what they silence is listed in the report's coverage (``silenced``),
so a silenced problem is quiet, not invisible::

    silences:
      - matchers: {cause: cpu_throttling, namespace: batch}
        until: 2026-12-01T08:00:00Z
        comment: "limits raised in PR 1234, rolling out"
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from diagnoser.config import Silence
from diagnoser.models import Finding, SilencedFinding

__all__ = ["apply_silences", "matching_silence"]


def matching_silence(finding: Finding, silences: Iterable[Silence], now: datetime) -> Silence | None:
    """The first silence in force at ``now`` that covers ``finding``, if any."""
    fields = {
        **finding.labels,
        "cause": finding.cause,
        "rule_id": finding.rule_id,
        "severity": finding.severity.value,
    }
    for silence in silences:
        if silence.until > now and all(fields.get(k) == v for k, v in silence.matchers.items()):
            return silence
    return None


def apply_silences(
    findings: Sequence[Finding], silences: Sequence[Silence], now: datetime | None = None
) -> tuple[list[Finding], list[SilencedFinding]]:
    """Split ``findings`` into those reported and those a silence covers (with its comment)."""
    if not silences:
        return list(findings), []
    now = now or datetime.now(UTC)
    kept: list[Finding] = []
    silenced: list[SilencedFinding] = []
    for finding in findings:
        silence = matching_silence(finding, silences, now)
        if silence is None:
            kept.append(finding)
            continue
        silenced.append(
            SilencedFinding(
                rule_id=finding.rule_id,
                cause=finding.cause,
                severity=finding.severity,
                summary=finding.summary,
                labels=finding.labels,
                comment=silence.comment,
                until=silence.until,
            )
        )
    return kept, silenced
