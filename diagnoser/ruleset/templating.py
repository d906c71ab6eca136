"""Placeholders and text templates in rules.

Two small languages, both deliberately tiny:

* ``${slo.p99_seconds}`` placeholders in condition parameters, resolved from config and rule
  params before the check kind validates them. A value that is exactly one placeholder keeps the
  placeholder's type (a float stays a float); inside a longer string it is formatted as text.
* ``{name:.1f}`` format fields in a rule's title, summary and recommendation, filled from the
  finding's labels and named values. A missing value renders as ``not measured`` instead of
  failing (a report with one hole beats no report; a rule leaves a clause about a value some
  libraries do not export in ``{?name ...?}``, so the sentence drops out instead), and a missing
  ``..._detail`` or ``caveats`` field as nothing: they are optional remarks. Numbers never come
  out in scientific notation (:func:`~diagnoser.numbers.format_number`). A count and its noun
  agree with ``{name:spec|singular|plural}``: ``{calls:.2g|call|calls}`` reads "1 call" or
  "1.5 calls", the noun chosen from the number as printed.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diagnoser.config.sections import SloSettings
from diagnoser.errors import MissingVariable
from diagnoser.numbers import NOT_MEASURED, format_number

if TYPE_CHECKING:
    from diagnoser.config import Settings

__all__ = [
    "MISSING_TEXT",
    "MissingVariable",
    "RuleVariables",
    "format_text",
    "optional_clauses",
    "resolve_placeholders",
    "variables_for",
]

_PLACEHOLDER = re.compile(r"\$\{\s*([A-Za-z_][\w.\-/]*)\s*\}")


def _lookup(name: str, variables: Mapping[str, Any]) -> Any:
    if name in variables:
        return variables[name]
    raise MissingVariable(name)


def resolve_placeholders(value: Any, variables: Mapping[str, Any]) -> Any:
    """Return ``value`` (any YAML tree) with every ``${name}`` replaced from ``variables``."""
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value.strip())
        if whole:
            return _lookup(whole.group(1), variables)
        return _PLACEHOLDER.sub(lambda m: _as_text(_lookup(m.group(1), variables)), value)
    if isinstance(value, dict):
        return {key: resolve_placeholders(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve_placeholders(item, variables) for item in value]
    return value


def _as_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def variables_for(
    *,
    slo_p99_ms: float,
    slo_error_ratio: float,
    signals: Mapping[str, str],
    params: Mapping[str, Any],
    window: str = "5m",
    confirm_window: str = "2m",
) -> dict[str, Any]:
    """The flat placeholder namespace a rule sees.

    ``window`` is the range rules average and rate over (``avg_over_time(x[${window}])``): 5m
    for a diagnosis of the present, the length of one load step for ``diagnose capacity``.
    ``confirm_window`` is the shorter range conditions confirm a problem over.
    """
    variables: dict[str, Any] = {
        "slo.p99_ms": slo_p99_ms,
        "slo.p99_seconds": slo_p99_ms / 1000.0,
        "slo.error_ratio": slo_error_ratio,
        "window": window,
        "confirm_window": confirm_window,
    }
    variables.update({f"signals.{name}": metric for name, metric in signals.items()})
    variables.update({f"params.{name}": value for name, value in params.items()})
    return variables


_SLO = SloSettings()


@dataclass(frozen=True)
class RuleVariables:
    """What a rule's ``${...}`` placeholders and templates resolve from: the part of the settings
    rules see, taken once per run (:meth:`from_settings`), never the whole settings.

    The defaults are the settings' own, so a rule loaded without settings (placeholders checked
    at load time) sees what an empty config gives. ::

        variables = RuleVariables.from_settings(settings)
        namespace = variables.for_rule(rule.id, rule.params)   # {"slo.p99_ms": 500.0, ...}
    """

    slo_p99_ms: float = _SLO.p99_ms
    slo_error_ratio: float = _SLO.error_ratio
    window: str = "5m"
    confirm_window: str = "2m"
    signals: Mapping[str, str] = field(default_factory=dict)
    #: ``rule_params``: per rule id, overrides of its parameters.
    rule_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> RuleVariables:
        return cls(
            slo_p99_ms=settings.slo.p99_ms,
            slo_error_ratio=settings.slo.error_ratio,
            window=settings.window,
            confirm_window=settings.effective_confirm_window,
            signals=dict(settings.signals),
            rule_params={k: dict(v) for k, v in settings.rule_params.items()},
        )

    def params_for(self, rule_id: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """A rule's parameters: its defaults, overridden by ``rule_params.<id>``."""
        return {**defaults, **self.rule_params.get(rule_id, {})}

    def for_rule(
        self, rule_id: str, defaults: Mapping[str, Any], *, signals: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The ``${...}`` namespace of one rule (``signals``: in place of the configured ones)."""
        return variables_for(
            slo_p99_ms=self.slo_p99_ms,
            slo_error_ratio=self.slo_error_ratio,
            signals=self.signals if signals is None else signals,
            params=self.params_for(rule_id, defaults),
            window=self.window,
            confirm_window=self.confirm_window,
        )

    def template_values(self) -> dict[str, Any]:
        """What every finding's templates can name besides its own values."""
        return {
            "slo.p99_ms": self.slo_p99_ms,
            "slo.error_ratio": self.slo_error_ratio,
            "window": self.window,
            "confirm_window": self.confirm_window,
        }


class _LenientFormatter(string.Formatter):
    def get_value(self, key: int | str, args: Any, kwargs: Mapping[str, Any]) -> Any:
        if isinstance(key, str):
            if key in kwargs and kwargs[key] is not None:
                return kwargs[key]
            return _Missing(optional=_is_optional(key))
        return super().get_value(key, args, kwargs)

    def get_field(self, field_name: str, args: Any, kwargs: Mapping[str, Any]) -> Any:
        # Dotted names (``params.headroom``) are flat keys here, not attribute access.
        if field_name in kwargs:
            value = kwargs[field_name]
            return (value if value is not None else _Missing(optional=_is_optional(field_name))), field_name
        return super().get_field(field_name, args, kwargs)

    def format_field(self, value: Any, format_spec: str) -> str:
        spec, bar, nouns = format_spec.partition("|")
        if bar:
            return _counted(self.format_field(value, spec), nouns)
        if isinstance(value, _Missing):
            return value.text
        if value is None:
            return MISSING_TEXT
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return format_number(value)
        try:
            text = str(super().format_field(value, format_spec))
        except (ValueError, TypeError):
            return str(value)
        if _EXPONENT.search(text) and isinstance(value, int | float) and not isinstance(value, bool):
            # ``{x:.3g}`` turns 17923 into 1.79e+04: the same significant digits, readable.
            digits = _precision(format_spec)
            return format_number(float(value), digits) if digits else format_number(float(value))
        return text


_EXPONENT = re.compile(r"\d[eE][+-]?\d")


def _counted(number: str, nouns: str) -> str:
    """``number`` and the noun of ``singular|plural`` that agrees with it as printed: "1 call",
    "0 calls", "1.5 calls" (a value not measured keeps its text, without a noun)."""
    singular, _, plural = nouns.partition("|")
    if not re.fullmatch(r"-?\d+(?:\.\d+)?", number.replace(",", "")):
        return number
    noun = singular if number.lstrip("-") == "1" else (plural or singular)
    return f"{number} {noun}"


def _precision(format_spec: str) -> int | None:
    match = re.search(r"\.(\d+)", format_spec)
    return int(match.group(1)) if match else None


#: What a value that was not measured (or a label a series lacks) reads as in a report.
MISSING_TEXT = NOT_MEASURED


def _is_optional(name: str) -> bool:
    return name.endswith("_detail") or name == "caveats"


class _Missing:
    def __init__(self, *, optional: bool = False) -> None:
        self.text = "" if optional else MISSING_TEXT

    def __format__(self, spec: str) -> str:
        return self.text


_FORMATTER = _LenientFormatter()


#: ``{?name text?}``: ``text`` (itself a template) only when ``name`` has a value;
#: ``{?!name text?}`` only when it has none.
_OPTIONAL = re.compile(r"\{\?(!?)([A-Za-z_][\w.]*)\s(.*?)\?\}", re.S)


def optional_clauses(template: str, values: Mapping[str, Any] | None = None) -> str:
    """Resolve ``{?name text?}`` and ``{?!name text?}`` clauses (without values, keep every text)."""

    def keep(match: re.Match[str]) -> str:
        if values is None:
            return match.group(3)
        present = values.get(match.group(2)) is not None
        return match.group(3) if present != (match.group(1) == "!") else ""

    return _OPTIONAL.sub(keep, template)


def format_text(template: str, values: Mapping[str, Any]) -> str:
    """Fill ``template``'s ``{field:spec}`` from ``values``; missing fields render as ``not measured``.

    ``{?name text?}`` keeps ``text`` only when ``name`` has a value (``{?!name text?}`` only when
    it has none), so a sentence about a measurement a library does not export can be left out
    instead of reading "not measured".
    """
    try:
        return _FORMATTER.vformat(optional_clauses(template, values), (), values)
    except (ValueError, IndexError, KeyError, AttributeError):
        # A malformed template is shown as written rather than losing the finding.
        return template
