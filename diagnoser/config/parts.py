"""Small config objects handed to the parts that need them, instead of the whole settings.

As httpx passes a ``Timeout`` or a ``Limits`` rather than its client's whole configuration, a
part of diagnoser gets the few values it reads, taken from the settings once per run by whoever
assembles the run (the CLI, the daemon). ::

    style = FindingStyle.from_settings(settings)
    finding.runbook_url == style.runbook_url("pools/pool-exhaustion")
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diagnoser.config.sections import DEFAULT_RUNBOOK_BASE_URL
from diagnoser.models import Finding

if TYPE_CHECKING:
    from diagnoser.config.settings import Settings

__all__ = ["FindingStyle"]


@dataclass(frozen=True)
class FindingStyle:
    """How every finding is labelled and linked, whoever makes it (a rule, a failing source, no data)."""

    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    #: Added to every finding (``cluster``, ``environment``).
    context_labels: Mapping[str, str] = field(default_factory=dict)
    #: Named in the no-data finding ("none of the metrics exist in <url>").
    prometheus_url: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> FindingStyle:
        return cls(settings.runbook_base_url, dict(settings.context_labels), settings.prometheus.url)

    def runbook_url(self, rule_id: str) -> str:
        return f"{self.runbook_base_url}{rule_id}.md"

    def finding(
        self, *, rule_id: str, runbook: str | None = None, labels: Mapping[str, str], **fields: Any
    ) -> Finding:
        """A finding the engine makes (a rule's, a failing source's, no data): linked to the
        runbook of ``runbook`` (default its rule id) and labelled with the context labels."""
        url = self.runbook_url(runbook or rule_id)
        return Finding(rule_id=rule_id, runbook_url=url, labels=self.labels(labels), **fields)

    def labels(self, *more: Mapping[str, str]) -> dict[str, str]:
        """The context labels, then ``more`` over them."""
        merged = dict(self.context_labels)
        for labels in more:
            merged.update(labels)
        return merged
