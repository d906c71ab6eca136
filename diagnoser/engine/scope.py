"""What one ``diagnose now`` asks about: ``--severity``, ``--cause``, ``--rule`` and ``-n/--namespace``.

Rule filters (severity, cause, rule id) narrow the rules evaluated, so a focused question costs
only its own queries and the coverage line counts only those rules. The namespace scopes every
source: the Kubernetes reads themselves, and findings from the other sources by their
``namespace`` label (or their evidence's, for a finding grouped by service); a finding about no
namespace at all (a node, the whole cluster) stays. Findings about the diagnosis itself
(``source_unavailable``, ``no_data``) are never filtered out, and the report says how many
findings the filters left out.

The label part, :func:`in_label_scope`, is the one rule for "is this finding about that
workload": the namespace flag uses it here and the Alertmanager receiver
(:mod:`diagnoser.daemon.alerts`) with a firing alert's labels.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from diagnoser.errors import ConfigError
from diagnoser.models import CAUSES, SYMPTOMS, Diagnosis, Finding, Severity
from diagnoser.ruleset import Rule, RuleSet

__all__ = ["ReportScope", "in_label_scope"]

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
        return not self.namespaces or in_label_scope(finding, {"namespace": self.namespaces})

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


def in_label_scope(finding: Finding, scope: Mapping[str, Collection[str]]) -> bool:
    """True when ``finding`` is about something ``scope`` (label: the values it allows) covers, or
    about nothing narrower than it.

    The finding's own labels and each evidence row's are looked at (a pool finding grouped by job
    still names its namespace in its evidence): a label set that names scope labels must agree
    on every one it names, and one such set is enough. A finding none of whose label sets names
    a scope label (a node, the whole cluster) may explain anything and is in every scope. An
    empty value names nothing, as in PromQL.
    """
    named = False
    for labels in [finding.labels, *(row.labels for row in finding.evidence)]:
        shared = [key for key in scope if labels.get(key)]
        if shared:
            named = True
            if all(labels[key] in scope[key] for key in shared):
                return True
    return not named
