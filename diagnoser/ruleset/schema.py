"""What a loaded rule is: the rule file's schema, its conditions, and the set of rules loaded.

A rule file is validated against :class:`RuleFile` as written; each condition then names a
registered check kind (:mod:`diagnoser.checks`) whose parameter model validates it. A loaded
:class:`Rule` knows the sources it reads (from its kinds) and resolves its ``${...}`` values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from diagnoser.checks import CheckKind
from diagnoser.errors import RuleProblem
from diagnoser.models import CAUSES, SYMPTOMS, Severity
from diagnoser.promql import duration_seconds
from diagnoser.ruleset.expressions import ExpressionError, parse_expression
from diagnoser.ruleset.templating import RuleVariables, resolve_placeholders

if TYPE_CHECKING:
    from diagnoser.signals import Catalogue

__all__ = ["NAME_PATTERN", "Condition", "OnsetSpec", "Rule", "RuleFile", "RuleSet", "resolve_condition"]

#: What a condition's ``name`` and a compute value may be called.
NAME_PATTERN = re.compile(r"^[a-z_][a-z0-9_]*$")


class OnsetSpec(BaseModel):
    """How far back the engine looks for the instant a finding's first condition began to hold
    (:mod:`diagnoser.engine.onset`): "since when", the baseline just before it, the incident's
    opened time."""

    model_config = ConfigDict(extra="forbid")

    #: At most this far back (at most a day: a signal that has held longer has no onset to find).
    lookback: str = "1d"
    #: To within this step: about a scrape interval or four.
    resolution: str = "1m"
    #: The signal whose onset is sought, a condition like those of ``when`` (default: the first
    #: of ``when``). A cheap one: it is read at about 20 earlier instants.
    when: dict[str, Any] | None = None
    #: With ``when``: it holds for a finding where its value is above this expression over the
    #: finding's values (``lowest_before_s + params.min_call_rise_s``), read before the onset.
    above: str | None = None

    @field_validator("above")
    @classmethod
    def _valid_above(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_expression(value)
            except ExpressionError as exc:
                raise ValueError(f"{value!r}: {exc}") from exc
        return value

    @field_validator("lookback", "resolution")
    @classmethod
    def _durations(cls, value: str) -> str:
        seconds = duration_seconds(value)
        if seconds <= 0 or seconds > 86_400:
            raise ValueError(f"{value!r}: a duration above 0 and at most a day")
        return value


class RuleFile(BaseModel):
    """The YAML document as written; conditions are checked against the check-kind registry after."""

    model_config = ConfigDict(extra="forbid")

    cause: str
    kind: Literal["cause", "symptom"] = "cause"
    severity: Severity
    title: str = Field(min_length=1)
    summary: str = Field(min_length=1)
    description: str = ""
    #: What this cause means, in one line: declares a cause the shipped vocabulary does not have
    #: (a rule directory's own; listed by ``rules list``).
    new_cause: str = ""
    explains: list[str] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)
    when: list[dict[str, Any]] = Field(min_length=1)
    evidence: list[dict[str, Any]] = Field(default_factory=list)
    compute: dict[str, str] = Field(default_factory=dict)
    #: Expressions over the condition and ``compute`` values that must all hold for a finding (a
    #: relation between two conditions' values, which no single query can state).
    require: list[str] = Field(default_factory=list)
    recommendation: str = ""
    #: Labels that identify one finding; ``None`` means every row of the first condition is one.
    group_by: list[str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    #: Rules whose finding for the same labels makes this one redundant (a generic rule yields to
    #: the specific one that measured what this one infers).
    yields_to: list[str] = Field(default_factory=list)
    #: Find each finding's onset (``Finding.since``; ``{since}`` in texts); evidence conditions
    #: with ``at: before_onset`` are then read just before it.
    onset: OnsetSpec | None = None

    @field_validator("explains")
    @classmethod
    def _known_symptoms(cls, value: list[str]) -> list[str]:
        """Symptoms, or causes this one is upstream of (a pool that times out explains the 503s)."""
        unknown = sorted(set(value) - SYMPTOMS - CAUSES)
        if unknown:
            raise ValueError(
                f"unknown symptom(s) or cause(s) {unknown}; known symptoms: {sorted(SYMPTOMS)}"
            )
        return value

    @field_validator("require")
    @classmethod
    def _valid_requirements(cls, value: list[str]) -> list[str]:
        for expression in value:
            try:
                parse_expression(expression)
            except ExpressionError as exc:
                raise ValueError(f"{expression!r}: {exc}") from exc
        return value

    @field_validator("compute")
    @classmethod
    def _valid_expressions(cls, value: dict[str, str]) -> dict[str, str]:
        for name, expression in value.items():
            if not NAME_PATTERN.match(name):
                raise ValueError(f"{name!r} is not a valid name (lower_snake_case)")
            try:
                parse_expression(expression)
            except ExpressionError as exc:
                raise ValueError(f"{name}: {exc}") from exc
        return value


@dataclass(frozen=True)
class Condition:
    """One condition of a rule: a check kind and its (unresolved) parameters."""

    kind: CheckKind
    raw_params: Mapping[str, Any]
    name: str | None = None
    #: ``before_onset``: read at the last instant before the finding's onset (its baseline), not
    #: at the instant evaluated; the rule's ``onset:`` finds it.
    at: Literal["now", "before_onset"] = "now"

    @property
    def label(self) -> str:
        return self.name or self.kind.name


@dataclass(frozen=True)
class Rule:
    """A validated rule, ready for the engine."""

    id: str
    path: Path
    cause: str
    kind: Literal["cause", "symptom"]
    severity: Severity
    title: str
    summary: str
    description: str
    explains: tuple[str, ...]
    params: Mapping[str, Any]
    when: tuple[Condition, ...]
    evidence: tuple[Condition, ...]
    compute: Mapping[str, str]
    recommendation: str
    group_by: tuple[str, ...] | None
    labels: Mapping[str, str]
    runbook_path: Path | None
    yields_to: tuple[str, ...] = ()
    require: tuple[str, ...] = ()
    #: The meaning of a cause this rule declares (``new_cause:``), else ``""``.
    new_cause: str = ""
    onset: OnsetSpec | None = None
    #: ``onset.when`` as a condition (``None``: the first of ``when``).
    onset_condition: Condition | None = None

    @property
    def family(self) -> str:
        return self.id.split("/", 1)[0] if "/" in self.id else ""

    @property
    def sources(self) -> tuple[str, ...]:
        seen = dict.fromkeys(name for c in (*self.when, *self.evidence) for name in c.kind.sources)
        return tuple(seen)

    def runbook_url(self, base_url: str) -> str:
        return f"{base_url}{self.id}.md"

    def params_for(self, variables: RuleVariables) -> dict[str, Any]:
        """The rule's parameters: its defaults, overridden by ``rule_params.<id>`` in config."""
        return variables.params_for(self.id, self.params)

    def variables(
        self, variables: RuleVariables, *, signals: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The ``${...}`` namespace this rule's conditions are resolved in."""
        return variables.for_rule(self.id, self.params, signals=signals)


@dataclass
class RuleSet:
    """Loaded rules by id, and every problem met while loading."""

    rules: dict[str, Rule] = field(default_factory=dict)
    problems: list[RuleProblem] = field(default_factory=list)

    def __iter__(self) -> Any:
        return iter(self.rules.values())

    def __len__(self) -> int:
        return len(self.rules)


def resolve_condition(
    kind: CheckKind,
    raw_params: Mapping[str, Any],
    variables: Mapping[str, Any],
    *,
    catalogue: Catalogue | None = None,
) -> BaseModel:
    """Resolve ``${...}`` placeholders and validate against the kind's parameter model.

    ``catalogue`` is what signal names are checked against (default: the shipped catalogue).
    """
    context = {"catalogue": catalogue} if catalogue is not None else None
    return kind.params.model_validate(resolve_placeholders(dict(raw_params), variables), context=context)


