"""The one exception tree of diagnoser.

Everything diagnoser raises on purpose derives from :class:`DiagnoserError`::

    DiagnoserError
    ├── ConfigError            bad configuration file, environment or flag (CLI exit code 2)
    ├── RuleLoadError          one or more rule files failed validation; carries every problem
    ├── SourceNotConfigured    a check needs a source the user did not configure: the rule is skipped
    ├── ProbeSafetyError       a probe asked for more than its caps or a host outside the allowlist
    └── StateError             the daemon's state file cannot be opened or written (``reason`` says why)

Sources never let a client library's exception (requests, urllib3, httpx, elasticsearch,
kubernetes) escape: they return a :class:`diagnoser.models.SourceError` value instead, so a
down, slow or lying source becomes an entry in the report rather than a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ConfigError",
    "DiagnoserError",
    "ProbeSafetyError",
    "RuleLoadError",
    "RuleProblem",
    "SourceNotConfigured",
    "StateError",
]


class DiagnoserError(Exception):
    """Base class of every error diagnoser raises on purpose."""


class ConfigError(DiagnoserError):
    """The configuration (file, environment or command-line flag) is invalid."""


@dataclass(frozen=True)
class RuleProblem:
    """One problem found while loading a rule file: where it is and what is wrong."""

    path: str
    rule_id: str
    field: str
    message: str

    def __str__(self) -> str:
        field = f" field {self.field}:" if self.field else ""
        return f"{self.path}: rule {self.rule_id}:{field} {self.message}"


class RuleLoadError(DiagnoserError):
    """Rule files failed to load; ``problems`` lists each one with its location."""

    def __init__(self, problems: list[RuleProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class SourceNotConfigured(DiagnoserError):
    """A check needs a source (Elasticsearch, Kubernetes, probe...) that is not configured."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__(f"source {source!r} is not configured")


class ProbeSafetyError(DiagnoserError):
    """A probe definition or flag exceeds a safety cap, or targets a host not allowed."""


class StateError(DiagnoserError):
    """The state file cannot be used: ``reason`` is ``disk_full``, ``read_only``, ``corrupt``,
    ``locked``, ``unopenable`` or ``io``; the message names the file and what to do."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
