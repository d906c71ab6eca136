"""What one ``diagnose now`` asks about: ``--severity``, ``--cause``, ``--rule`` and ``-n/--namespace``.

Rule filters (severity, cause, rule id) narrow the rules evaluated, so a focused question costs
only its own queries and the coverage line counts only those rules. The namespace scopes every
source: the Kubernetes reads themselves, and findings from the other sources by their
``namespace`` label (or their evidence's, for a finding grouped by service); a finding about no
namespace at all (a node, the whole cluster) stays. Findings about the diagnosis itself
(``source_unavailable``, ``no_data``) are never filtered out, and the report says how many
findings the filters left out.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field

from diagnoser.errors import ConfigError
from diagnoser.models import CAUSES, SYMPTOMS, Diagnosis, Finding, Severity
from diagnoser.ruleset import Rule, RuleSet

__all__ = ["ReportScope"]

#: Built-in findings about the run itself, which no filter may hide.
_ABOUT_THE_RUN = frozenset({"source_unavailable", "no_data"})


@dataclass(frozen=True)
class ReportScope:
    """The filters of one command; the default scope keeps everything."""

    min_severity: Severity | None = None
    causes: frozenset[str] = field(default_factory=frozenset)
    rule_patterns: tuple[str, ...] = ()
    namespaces: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_flags(
        cls,
        *,
        severity: str | None,
        causes: Iterable[str] = (),
        rules: Iterable[str] = (),
        namespaces: Iterable[str] = (),
    ) -> ReportScope:
        """Validate the flags; raise :class:`ConfigError` for an unknown severity or cause."""
        min_severity = None
        if severity is not None:
            try:
                min_severity = Severity(severity)
            except ValueError:
                raise ConfigError(f"--severity: {severity!r} is not one of critical, warning, info") from None
        known = CAUSES | SYMPTOMS
        for cause in causes:
            if cause not in known:
                close = difflib.get_close_matches(cause, sorted(known), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(f"--cause: unknown cause {cause!r}{hint}")
        return cls(min_severity, frozenset(causes), tuple(rules), frozenset(namespaces))

    @property
    def narrows_rules(self) -> bool:
        return bool(self.min_severity or self.causes or self.rule_patterns)

    def select(self, ruleset: RuleSet) -> RuleSet:
        """The rules this scope asks about; :class:`ConfigError` when a ``--rule`` matches none."""
        for pattern in self.rule_patterns:
            if not any(fnmatch.fnmatchcase(rule_id, pattern) for rule_id in ruleset.rules):
                close = difflib.get_close_matches(pattern, sorted(ruleset.rules), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(f"--rule: no rule matches {pattern!r}{hint}")
        kept = {rule_id: rule for rule_id, rule in ruleset.rules.items() if self._wants_rule(rule)}
        return RuleSet(rules=kept, problems=list(ruleset.problems))

    def _wants_rule(self, rule: Rule) -> bool:
        if self.min_severity and rule.severity.rank < self.min_severity.rank:
            return False
        if self.causes and rule.cause not in self.causes:
            return False
        return not self.rule_patterns or any(fnmatch.fnmatchcase(rule.id, p) for p in self.rule_patterns)

    def keeps(self, finding: Finding) -> bool:
        """True when ``finding`` is inside this scope."""
        if finding.cause in _ABOUT_THE_RUN:
            return True
        if self.min_severity and finding.severity.rank < self.min_severity.rank:
            return False
        if self.causes and finding.cause not in self.causes:
            return False
        if self.namespaces:
            seen = {labels["namespace"] for labels in _label_sets(finding) if labels.get("namespace")}
            if seen and not seen & self.namespaces:
                return False
        return True

    def apply(self, diagnosis: Diagnosis) -> Diagnosis:
        """``diagnosis`` without the findings outside this scope, counting them in its coverage."""
        kept = [finding for finding in diagnosis.findings if self.keeps(finding)]
        left_out = len(diagnosis.findings) - len(kept)
        if not left_out:
            return diagnosis
        coverage = diagnosis.coverage
        if coverage is not None:
            from diagnoser.engine.coverage import summary_line

            coverage = coverage.model_copy(update={"filtered_out": coverage.filtered_out + left_out})
            coverage.summary = summary_line(coverage)
        return diagnosis.model_copy(update={"findings": kept, "coverage": coverage})


def _label_sets(finding: Finding) -> list[dict[str, str]]:
    return [finding.labels, *(row.labels for row in finding.evidence)]
