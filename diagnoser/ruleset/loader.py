"""Loading rule files: every problem gathered with its file, rule id and field, none fatal.

A rule is one YAML file; its id is its path below the rule directory without the extension
(``rules/pools/pool-exhaustion.yaml`` is ``pools/pool-exhaustion``) and its runbook
is the Markdown file beside it. Loading validates everything up front and gathers every
problem, so one bad file never hides or stops the others::

    ruleset = load_rules([Path("/etc/diagnoser/rules")])
    for problem in ruleset.problems:
        print(problem)          # rules/x/y.yaml: rule x/y: field when[0].promql.op: ...
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from diagnoser.checks import CheckKind, check_kinds
from diagnoser.errors import ConfigError, RuleProblem
from diagnoser.models import CAUSES, SYMPTOMS
from diagnoser.ruleset.schema import NAME_PATTERN, Condition, Rule, RuleFile, RuleSet, resolve_condition
from diagnoser.ruleset.templating import MissingVariable, RuleVariables
from diagnoser.signals import Catalogue, load_catalogue
from diagnoser.yamlfile import read_yaml

__all__ = ["builtin_rules_dir", "load_rule_file", "load_rules"]

def builtin_rules_dir() -> Path:
    """Where the shipped rule pack is: inside the wheel, or ``rules/`` of a source checkout."""
    packaged = Path(str(resources.files("diagnoser"))) / "_data" / "rules"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "rules"


def load_rules(
    dirs: Iterable[Path], *, include_builtin: bool = True, catalogue: Catalogue | None = None
) -> RuleSet:
    """Load every ``*.yaml`` rule below ``dirs`` (after the built-in pack, when included).

    A rule in a later directory replaces a rule with the same id from an earlier one, so users
    can override a shipped rule by writing a file at the same relative path. Signal names are
    checked against ``catalogue`` (default: the shipped one).
    """
    catalogue = catalogue if catalogue is not None else load_catalogue()
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
                rule = load_rule_file(path, rule_id, catalogue)
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


def load_rule_file(path: Path, rule_id: str, catalogue: Catalogue | None = None) -> Rule:
    """Load and validate one rule file; raises ``_RuleFileInvalid`` with every problem in it."""
    where = str(path)

    def problem(field_name: str, message: str) -> RuleProblem:
        return RuleProblem(where, rule_id, field_name, message)

    spec = _rule_file(path, problem)
    problems: list[RuleProblem] = []
    known = SYMPTOMS if spec.kind == "symptom" else CAUSES
    if spec.new_cause and (spec.kind == "symptom" or spec.cause in CAUSES | SYMPTOMS):
        problems.append(problem(
            "new_cause", f"{spec.cause!r} is already in the vocabulary (or a symptom): drop new_cause"
        ))  # fmt: skip
    elif spec.cause not in known and not spec.new_cause:
        declare = " (or declare it: new_cause: <what it means>)" if spec.kind == "cause" else ""
        known_text = ", ".join(sorted(known))
        problems.append(problem("cause", f"unknown {spec.kind} {spec.cause!r}{declare}; known: {known_text}"))
    elif spec.new_cause and not re.fullmatch(r"[a-z][a-z0-9_]{1,62}", spec.cause):
        problems.append(problem("cause", f"{spec.cause!r}: a new cause is snake_case (queue_backlog)"))
    kinds = check_kinds()
    # Placeholders are checked against defaults now, and resolved for real at evaluation time.
    defaults = RuleVariables().for_rule("", spec.params)
    conditions: dict[str, list[Condition]] = {"when": [], "evidence": []}
    for section, raws in (("when", spec.when), ("evidence", spec.evidence)):
        for index, raw in enumerate(raws):
            try:
                conditions[section].append(_condition(raw, kinds, defaults, catalogue))
            except _ConditionInvalid as invalid:
                problems.append(problem(f"{section}[{index}]{invalid.field}", invalid.message))
    names = [c.name for c in (*conditions["when"], *conditions["evidence"]) if c.name]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(problem("when/evidence", f"condition names must be unique: {duplicates}"))
    onset_condition = None
    if spec.onset is not None and spec.onset.when is not None:
        try:
            onset_condition = _condition(spec.onset.when, kinds, defaults, catalogue)
        except _ConditionInvalid as invalid:
            problems.append(problem(f"onset.when{invalid.field}", invalid.message))
    if spec.onset is None:
        problems.extend(
            problem(f"evidence[{index}].at", "at: before_onset needs the rule's onset: section")
            for index, condition in enumerate(conditions["evidence"])
            if condition.at == "before_onset"
        )
    problems.extend(
        problem(f"when[{index}].at", "only evidence can be read before the onset")
        for index, condition in enumerate(conditions["when"])
        if condition.at != "now"
    )
    if problems:
        raise _RuleFileInvalid(problems)
    rule = _rule(path, rule_id, spec, conditions["when"], conditions["evidence"])
    return replace(rule, onset_condition=onset_condition)


def _rule_file(path: Path, problem: Callable[[str, str], RuleProblem]) -> RuleFile:
    """The file's YAML, validated against the schema as written."""
    try:
        document = read_yaml(path, "rule")
    except ConfigError as exc:
        raise _RuleFileInvalid([problem("", str(exc).removeprefix(f"{path}: "))]) from exc
    if not isinstance(document, dict):
        raise _RuleFileInvalid([problem("", "a rule file must be a YAML mapping")])
    try:
        return RuleFile.model_validate(document)
    except ValidationError as exc:
        raise _RuleFileInvalid([problem(_loc(err["loc"]), _message(err)) for err in exc.errors()]) from exc


def _rule(path: Path, rule_id: str, spec: RuleFile, when: list[Condition], evidence: list[Condition]) -> Rule:
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
        when=tuple(when),
        evidence=tuple(evidence),
        compute=spec.compute,
        recommendation=spec.recommendation,
        group_by=tuple(spec.group_by) if spec.group_by is not None else None,
        labels=spec.labels,
        runbook_path=runbook if runbook.exists() else None,
        yields_to=tuple(spec.yields_to),
        require=tuple(spec.require),
        new_cause=spec.new_cause,
        onset=spec.onset,
    )


class _ConditionInvalid(Exception):
    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        self.message = message


def _condition(
    raw: Mapping[str, Any],
    kinds: Mapping[str, CheckKind],
    defaults: Mapping[str, Any],
    catalogue: Catalogue | None,
) -> Condition:
    if not isinstance(raw, Mapping):
        raise _ConditionInvalid("", "a condition must be a mapping like {promql: {...}}")
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not NAME_PATTERN.match(name)):
        raise _ConditionInvalid(".name", f"{name!r} is not a valid name (lower_snake_case)")
    at = raw.get("at", "now")
    if at not in ("now", "before_onset"):
        raise _ConditionInvalid(".at", f"{at!r}: now or before_onset")
    keys = [k for k in raw if k not in ("name", "at")]
    if len(keys) != 1:
        raise _ConditionInvalid(
            "", f"needs exactly one check kind, got {keys or 'none'}; known: {', '.join(_kind_names(kinds))}"
        )
    kind, params = _kind_of(keys[0], raw[keys[0]], kinds)
    try:
        resolve_condition(kind, params, defaults, catalogue=catalogue)
    except MissingVariable:
        pass  # e.g. ${signals.queue_length}: legitimately unset until configured
    except ValidationError as exc:
        err = exc.errors()[0]
        raise _ConditionInvalid(f".{keys[0]}.{_loc(err['loc'])}", _message(err)) from exc
    return Condition(kind=kind, raw_params=params, name=name, at=at)


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
