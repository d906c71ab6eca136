"""Rule files: schema, validation and loading.

A rule is one YAML file; its id is its path below the rule directory without the extension
(``rules/pools/pool-exhaustion.yaml`` is ``pools/pool-exhaustion``) and its runbook
is the Markdown file beside it. Loading validates everything up front and gathers every
problem with its file, rule id and field, so one bad file never hides or stops the others::

    ruleset = load_rules([Path("/etc/diagnoser/rules")])
    for problem in ruleset.problems:
        print(problem)          # rules/x/y.yaml: rule x/y: field when[0].promql.op: ...
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from diagnoser.checks import CheckKind, check_kinds
from diagnoser.errors import RuleProblem
from diagnoser.models import CAUSES, SYMPTOMS, Severity
from diagnoser.recommend import ExpressionError, parse_expression
from diagnoser.templating import MissingVariable, resolve_placeholders, variables_for

if TYPE_CHECKING:
    from diagnoser.config import Settings

__all__ = [
    "Condition",
    "Rule",
    "RuleSet",
    "builtin_rules_dir",
    "load_rules",
    "resolve_condition",
]

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class _RuleFile(BaseModel):
    """The YAML document as written; conditions are checked against the check-kind registry after."""

    model_config = ConfigDict(extra="forbid")

    cause: str
    kind: Literal["cause", "symptom"] = "cause"
    severity: Severity
    title: str = Field(min_length=1)
    summary: str = Field(min_length=1)
    description: str = ""
    explains: list[str] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)
    when: list[dict[str, Any]] = Field(min_length=1)
    evidence: list[dict[str, Any]] = Field(default_factory=list)
    compute: dict[str, str] = Field(default_factory=dict)
    recommendation: str = ""
    #: Labels that identify one finding; ``None`` means every row of the first condition is one.
    group_by: list[str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    #: Rules whose finding for the same labels makes this one redundant (a generic rule yields to
    #: the specific one that measured what this one infers).
    yields_to: list[str] = Field(default_factory=list)

    @field_validator("explains")
    @classmethod
    def _known_symptoms(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - SYMPTOMS)
        if unknown:
            raise ValueError(f"unknown symptom(s) {unknown}; known: {sorted(SYMPTOMS)}")
        return value

    @field_validator("compute")
    @classmethod
    def _valid_expressions(cls, value: dict[str, str]) -> dict[str, str]:
        for name, expression in value.items():
            if not _NAME.match(name):
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

    @property
    def family(self) -> str:
        return self.id.split("/", 1)[0] if "/" in self.id else ""

    @property
    def sources(self) -> tuple[str, ...]:
        seen = dict.fromkeys(name for c in (*self.when, *self.evidence) for name in c.kind.sources)
        return tuple(seen)

    def runbook_url(self, base_url: str) -> str:
        return f"{base_url}{self.id}.md"

    def params_for(self, settings: Settings) -> dict[str, Any]:
        """The rule's parameters: its defaults, overridden by ``rule_params.<id>`` in config."""
        return {**self.params, **settings.rule_params.get(self.id, {})}

    def variables(self, settings: Settings, *, signals: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The ``${...}`` namespace this rule's conditions are resolved in."""
        return variables_for(
            slo_p99_ms=settings.slo.p99_ms,
            slo_error_ratio=settings.slo.error_ratio,
            signals=settings.signals if signals is None else signals,
            params=self.params_for(settings),
            window=settings.window,
            confirm_window=settings.effective_confirm_window,
        )


@dataclass
class RuleSet:
    """Loaded rules by id, and every problem met while loading."""

    rules: dict[str, Rule] = field(default_factory=dict)
    problems: list[RuleProblem] = field(default_factory=list)

    def __iter__(self) -> Any:
        return iter(self.rules.values())

    def __len__(self) -> int:
        return len(self.rules)


def builtin_rules_dir() -> Path:
    """Where the shipped rule pack is: inside the wheel, or ``rules/`` of a source checkout."""
    packaged = Path(str(resources.files("diagnoser"))) / "_data" / "rules"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "rules"


def load_rules(dirs: Iterable[Path], *, include_builtin: bool = True) -> RuleSet:
    """Load every ``*.yaml`` rule below ``dirs`` (after the built-in pack, when included).

    A rule in a later directory replaces a rule with the same id from an earlier one, so users
    can override a shipped rule by writing a file at the same relative path.
    """
    ruleset = RuleSet()
    roots = [builtin_rules_dir()] if include_builtin else []
    roots.extend(Path(d) for d in dirs)
    for root in roots:
        if not root.exists():
            ruleset.problems.append(RuleProblem(str(root), "-", "", "rule directory does not exist"))
            continue
        files = [root.resolve()] if root.is_file() else sorted(root.rglob("*.y*ml"))
        base = _rule_root_of(root) if root.is_file() else root
        for path in files:
            rule_id = path.relative_to(base).with_suffix("").as_posix()
            try:
                rule = load_rule_file(path, rule_id)
            except _RuleFileInvalid as invalid:
                ruleset.problems.extend(invalid.problems)
                continue
            ruleset.rules[rule.id] = rule
    return ruleset


def _rule_root_of(path: Path) -> Path:
    """The rule directory a rule file named on its own belongs to, so its id is the same as when
    its directory is given: ``rules/pools/orders-pool.yaml`` is ``pools/orders-pool`` either way.

    That is the nearest ancestor called ``rules``, else the file's family directory's parent
    (rules live at ``<rule dir>/<family>/<rule>.yaml``).
    """
    absolute = path.resolve()
    for ancestor in absolute.parents:
        if ancestor.name == "rules":
            return ancestor
    return absolute.parent.parent


class _RuleFileInvalid(Exception):
    def __init__(self, problems: list[RuleProblem]) -> None:
        self.problems = problems


def load_rule_file(path: Path, rule_id: str) -> Rule:
    """Load and validate one rule file; raises ``_RuleFileInvalid`` with every problem in it."""
    where = str(path)

    def problem(field_name: str, message: str) -> RuleProblem:
        return RuleProblem(where, rule_id, field_name, message)

    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _RuleFileInvalid([problem("", f"cannot read: {exc.strerror or exc}")]) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _RuleFileInvalid([problem("", f"YAML error{at}: {reason}")]) from exc
    if not isinstance(document, dict):
        raise _RuleFileInvalid([problem("", "a rule file must be a YAML mapping")])

    try:
        spec = _RuleFile.model_validate(document)
    except ValidationError as exc:
        raise _RuleFileInvalid([problem(_loc(err["loc"]), _message(err)) for err in exc.errors()]) from exc

    problems: list[RuleProblem] = []
    known = SYMPTOMS if spec.kind == "symptom" else CAUSES
    if spec.cause not in known:
        problems.append(
            problem("cause", f"unknown {spec.kind} {spec.cause!r}; known: {', '.join(sorted(known))}")
        )

    kinds = check_kinds()
    # Placeholders are checked against defaults now, and resolved for real at evaluation time.
    defaults = variables_for(slo_p99_ms=500.0, slo_error_ratio=0.01, signals={}, params=spec.params)
    conditions: dict[str, list[Condition]] = {"when": [], "evidence": []}
    for section in ("when", "evidence"):
        for index, raw in enumerate(getattr(spec, section)):
            try:
                conditions[section].append(_condition(raw, kinds, defaults))
            except _ConditionInvalid as invalid:
                problems.append(problem(f"{section}[{index}]{invalid.field}", invalid.message))

    names = [c.name for c in (*conditions["when"], *conditions["evidence"]) if c.name]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(problem("when/evidence", f"condition names must be unique: {duplicates}"))
    if problems:
        raise _RuleFileInvalid(problems)

    runbook = path.with_suffix(".md")
    return Rule(
        id=rule_id,
        path=path,
        cause=spec.cause,
        kind=spec.kind,
        severity=spec.severity,
        title=spec.title,
        summary=spec.summary,
        description=spec.description,
        explains=tuple(spec.explains),
        params=spec.params,
        when=tuple(conditions["when"]),
        evidence=tuple(conditions["evidence"]),
        compute=spec.compute,
        recommendation=spec.recommendation,
        group_by=tuple(spec.group_by) if spec.group_by is not None else None,
        labels=spec.labels,
        runbook_path=runbook if runbook.exists() else None,
        yields_to=tuple(spec.yields_to),
    )


class _ConditionInvalid(Exception):
    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        self.message = message


def _condition(
    raw: Mapping[str, Any], kinds: Mapping[str, CheckKind], defaults: Mapping[str, Any]
) -> Condition:
    if not isinstance(raw, Mapping):
        raise _ConditionInvalid("", "a condition must be a mapping like {promql: {...}}")
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        raise _ConditionInvalid(".name", f"{name!r} is not a valid name (lower_snake_case)")
    keys = [k for k in raw if k != "name"]
    if len(keys) != 1:
        raise _ConditionInvalid(
            "", f"needs exactly one check kind, got {keys or 'none'}; known: {', '.join(_kind_names(kinds))}"
        )
    kind, params = _kind_of(keys[0], raw[keys[0]], kinds)
    try:
        resolve_condition(kind, params, defaults)
    except MissingVariable:
        pass  # e.g. ${signals.queue_length}: legitimately unset until configured
    except ValidationError as exc:
        err = exc.errors()[0]
        raise _ConditionInvalid(f".{keys[0]}.{_loc(err['loc'])}", _message(err)) from exc
    return Condition(kind=kind, raw_params=params, name=name)


def _kind_of(key: str, params: Any, kinds: Mapping[str, CheckKind]) -> tuple[CheckKind, Mapping[str, Any]]:
    """The kind a condition names, and its parameters.

    ``promql: {...}`` names the kind ``promql``. A family of checks over one API is written
    ``k8s: {check: crash_loop, ...}`` and names the kind ``k8s.crash_loop``, which gets the
    other parameters.
    """
    if not isinstance(params, Mapping):
        raise _ConditionInvalid(f".{key}", "parameters must be a mapping")
    if key in kinds:
        return kinds[key], params
    family = sorted(name.split(".", 1)[1] for name in kinds if name.startswith(f"{key}."))
    if not family:
        known = ", ".join(_kind_names(kinds))
        raise _ConditionInvalid(f".{key}", f"unknown check kind {key!r}; known: {known}")
    check = params.get("check")
    if check not in family:
        raise _ConditionInvalid(f".{key}.check", f"unknown check {check!r}; known: {', '.join(family)}")
    return kinds[f"{key}.{check}"], {name: value for name, value in params.items() if name != "check"}


def _kind_names(kinds: Mapping[str, CheckKind]) -> list[str]:
    """What a condition can name: each kind, a family of checks once (``k8s``)."""
    return sorted({name.split(".", 1)[0] for name in kinds})


def resolve_condition(
    kind: CheckKind, raw_params: Mapping[str, Any], variables: Mapping[str, Any]
) -> BaseModel:
    """Resolve ``${...}`` placeholders and validate against the kind's parameter model."""
    return kind.params.model_validate(resolve_placeholders(dict(raw_params), variables))


def _loc(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _message(err: Mapping[str, Any]) -> str:
    if err.get("type") == "extra_forbidden":
        return "unknown field"
    if err.get("type") == "missing":
        return "field required"
    return str(err.get("msg", "invalid"))
