"""The signal catalogue: named concepts (``pool.used``) and the metric names each convention uses.

Real services expose the same concept under many names: OpenTelemetry's current semantic
conventions, its older ``db_client_connections_*`` names, go-redis, HikariCP through Micrometer,
Go's ``database/sql`` collector, pgbouncer, Envoy... Rules name *signals*; the catalogue says, per
*convention*, which series hold each signal, what unit they are in and which labels identify the
service and the pool. At evaluation the engine asks Prometheus once which metric names exist and
instantiates each rule query for every convention present (:mod:`diagnoser.signals.expand`).

A catalogue file::

    signals:
      pool.used: {type: gauge, unit: connections, help: Connections lent out.}
      pool.hold_seconds: {type: histogram, unit: seconds}
    conventions:
      - name: hikaricp-micrometer
        title: HikariCP through Micrometer's Prometheus registry
        labels: {pool: pool}                 # normalised label: the convention's label
        signals:
          pool.used: hikaricp_connections_active
          pool.hold_seconds: hikaricp_connections_usage_seconds
          pool.wait_seconds_total: {metric: x_wait_nanoseconds_total, unit: nanoseconds}

The shipped files are ``signals/*.yaml`` (inside the wheel); ``signal_files`` in the config adds
more, read after them: a convention with the same name replaces the shipped one, a new one is
appended, and earlier conventions win when two answer for the same series.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from diagnoser.errors import ConfigError
from diagnoser.promql import parse_selector, selector_text
from diagnoser.signals.otlp import escape_label, spellings
from diagnoser.signals.resources import Resource, ResourceSpec, resource_from_spec
from diagnoser.yamlfile import read_yaml

__all__ = [
    "Catalogue",
    "Convention",
    "Form",
    "SignalDef",
    "builtin_signals_dir",
    "load_catalogue",
]

_SIGNAL_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
#: Seconds per unit, for durations; any other unit is a count and is not scaled.
TIME_UNITS: dict[str, float] = {
    "seconds": 1.0,
    "milliseconds": 1e-3,
    "microseconds": 1e-6,
    "nanoseconds": 1e-9,
}
#: Names whose last word is a time unit carry it (``..._use_time_milliseconds``).
_UNIT_SUFFIX = re.compile(r"_(seconds|milliseconds|microseconds|nanoseconds)(_total)?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SignalDef(_Strict):
    """What a signal is, whatever its name in a given convention."""

    type: Literal["gauge", "counter", "histogram"]
    #: ``seconds`` for durations (every convention's values are converted to seconds), or a count.
    unit: str
    help: str = ""


@dataclass(frozen=True)
class Form:
    """How one convention exposes one signal: a metric name, fixed matchers, a unit and a caveat."""

    metric: str
    #: Fixed ``(label, op, value)`` matchers: ``(("state", "=", "used"),)``.
    matchers: tuple[tuple[str, str, str], ...] = ()
    #: Multiply values by this to get the signal's unit (1 for counts and for seconds).
    scale: float = 1.0
    #: Said in the evidence whenever this form answered (``includes pool wait``).
    note: str | None = None
    #: The setting this value is configured by, as the library spells it (``SetMaxOpenConns``):
    #: a finding about a limit names what to change.
    setting: str | None = None
    #: For an OpenTelemetry convention: the escaped names this form has under every OTLP
    #: translation strategy (:func:`diagnoser.signals.otlp.spellings`); empty: its name only.
    spellings: frozenset[str] = frozenset()

    def selector(self, suffix: str = "") -> str:
        """The PromQL selector of this form's series (``suffix``: a histogram's ``_bucket``...)."""
        return selector_text(f"{self.metric}{suffix}", self.matchers)


class _FormSpec(_Strict):
    metric: str
    unit: str | None = None
    note: str | None = None
    setting: str | None = None


class _ConventionSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    title: str
    #: Normalised label -> this convention's label. ``service`` defaults to ``job``.
    labels: dict[str, str] = Field(default_factory=dict)
    #: Metric names that must all exist for this convention to count as present (default: the
    #: names a query needs), to tell apart conventions that share some names.
    detect: list[str] = Field(default_factory=list)
    #: OpenTelemetry's names: found under all four OTLP translation strategies (signals/otlp.py).
    #: Default: the convention's name says so (``otel-http``, ``otelsql``, ``go-redis-redisotel``).
    otel: bool | None = None
    signals: dict[str, str | _FormSpec]


class _FileSpec(_Strict):
    signals: dict[str, SignalDef] = Field(default_factory=dict)
    conventions: list[_ConventionSpec] = Field(default_factory=list)
    #: Resources with a limit, for exporters whose names no shape gives away (signals/resources.py).
    resources: list[ResourceSpec] = Field(default_factory=list)

    @field_validator("signals")
    @classmethod
    def _names(cls, value: dict[str, SignalDef]) -> dict[str, SignalDef]:
        bad = [name for name in value if not _SIGNAL_NAME.match(name)]
        if bad:
            raise ValueError(f"signal names are dotted lower_snake_case like pool.used: {bad}")
        return value


@dataclass(frozen=True)
class Convention:
    """One naming convention: its forms for the signals it has, and its label names."""

    name: str
    title: str
    labels: Mapping[str, str]
    forms: Mapping[str, Form]
    detect: tuple[str, ...] = ()
    #: Its names are OpenTelemetry's: each form also answers under the other OTLP spellings.
    otel: bool = False

    def source_label(self, normalised: str) -> str:
        """The convention's name for a normalised label (``pool`` -> ``db_client_connection_pool_name``)."""
        return self.labels.get(normalised, normalised)

    def normalised_label(self, source: str) -> str | None:
        """The normalised name of one of this convention's labels, or ``None`` if it has none."""
        for normalised, own in self.labels.items():
            if own == source:
                return normalised
        if self.otel:  # http.route where the convention says http_route
            escaped = escape_label(source)
            return next((n for n, own in self.labels.items() if own == escaped), None)
        return None


@dataclass
class Catalogue:
    """Every known signal and convention, in precedence order."""

    signals: dict[str, SignalDef] = field(default_factory=dict)
    conventions: list[Convention] = field(default_factory=list)
    #: Catalogued resources with a limit (``resources:`` sections), in file order.
    resources: list[Resource] = field(default_factory=list)
    #: Rule queries already instantiated, by (template, convention name): every evaluation
    #: expands the same templates (filled by :func:`diagnoser.signals.expand.expansions`).
    expanded: dict[tuple[object, ...], Any] = field(default_factory=dict, repr=False, compare=False)

    def convention(self, name: str) -> Convention | None:
        return next((c for c in self.conventions if c.name == name), None)

    def otel_spellings(self) -> frozenset[str]:
        """Every escaped name an OpenTelemetry convention's forms have under any strategy."""
        return frozenset(
            name for c in self.conventions for form in c.forms.values() for name in form.spellings
        )

    def metric_names(self) -> set[str]:
        """Every metric name any convention uses, histogram series included."""
        names: set[str] = set()
        for convention in self.conventions:
            for signal, form in convention.forms.items():
                names.update(series_names(form, self.signals[signal]))
        return names


def series_names(form: Form, signal: SignalDef) -> list[str]:
    """The series names a form stands for: a histogram's ``_bucket``, ``_sum`` and ``_count``, and
    its own name, under which Prometheus 3 keeps it as a native histogram."""
    if signal.type == "histogram":
        return [form.metric, *(f"{form.metric}_{part}" for part in ("bucket", "sum", "count"))]
    return [form.metric]


def _form(signal: str, spec: str | _FormSpec, definition: SignalDef, where: str) -> Form:
    metric_text = spec if isinstance(spec, str) else spec.metric
    try:
        metric, matchers = parse_selector(metric_text)
    except ValueError as exc:
        raise ConfigError(f"{where}: {signal}: {metric_text!r} is not a metric selector ({exc})") from exc
    unit = spec.unit if isinstance(spec, _FormSpec) and spec.unit else _unit_in_name(metric)
    scale = 1.0
    if definition.unit == "seconds":
        unit = unit or "seconds"
        if unit not in TIME_UNITS:
            raise ConfigError(f"{where}: {signal}: unit {unit!r} is not one of {sorted(TIME_UNITS)}")
        scale = TIME_UNITS[unit]
    note = spec.note if isinstance(spec, _FormSpec) else None
    setting = spec.setting if isinstance(spec, _FormSpec) else None
    return Form(metric=metric, matchers=tuple(matchers), scale=scale, note=note, setting=setting)


def _otel_form(form: Form, definition: SignalDef) -> Form:
    """``form`` with the names it has under every OTLP translation strategy."""
    unit = (
        next((u for u, scale in TIME_UNITS.items() if scale == form.scale), "")
        if definition.unit == "seconds"
        else ""
    )
    names = spellings(form.metric, unit)
    if definition.type == "histogram":
        names |= {f"{name}{part}" for name in names for part in ("_bucket", "_count", "_sum")}
    return replace(form, spellings=names)


def _unit_in_name(metric: str) -> str | None:
    match = _UNIT_SUFFIX.search(metric)
    return match.group(1) if match else None


def builtin_signals_dir() -> Path:
    """The shipped catalogue: inside the wheel, or ``signals/`` of a source checkout."""
    packaged = Path(str(resources.files("diagnoser"))) / "_data" / "signals"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "signals"


def _read(path: Path) -> _FileSpec:
    document: Any = read_yaml(path, "signal catalogue")
    try:
        return _FileSpec.model_validate(document or {})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"{path}: invalid signal catalogue: {problems}") from exc


def _files(paths: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(path.glob("*.y*ml")))
        elif path.exists():
            found.append(path)
        else:
            raise ConfigError(f"{path}: signal catalogue file does not exist")
    return found


@lru_cache(maxsize=8)
def load_catalogue(extra: tuple[Path, ...] = ()) -> Catalogue:
    """The shipped catalogue plus ``extra`` files or directories (``signal_files`` in config).

    Raises :class:`ConfigError` naming the file and field of the first bad file.
    """
    specs = [(path, _read(path)) for path in _files([builtin_signals_dir(), *extra])]
    catalogue = Catalogue()
    for path, spec in specs:
        for name, definition in spec.signals.items():
            known = catalogue.signals.get(name)
            if known is not None and known != definition:
                raise ConfigError(f"{path}: signal {name} is already defined differently")
            catalogue.signals[name] = definition
    for path, spec in specs:
        for convention_spec in spec.conventions:
            where = f"{path}: convention {convention_spec.name}"
            unknown = sorted(set(convention_spec.signals) - set(catalogue.signals))
            if unknown:
                raise ConfigError(f"{where}: unknown signal(s) {unknown}; known: {sorted(catalogue.signals)}")
            otel = convention_spec.otel
            if otel is None:
                otel = "otel" in convention_spec.name
            forms = {
                name: _form(name, form, catalogue.signals[name], where)
                for name, form in convention_spec.signals.items()
            }
            if otel:
                forms = {name: _otel_form(form, catalogue.signals[name]) for name, form in forms.items()}
            convention = Convention(
                name=convention_spec.name,
                title=convention_spec.title,
                labels={"service": "job", **convention_spec.labels},
                forms=forms,
                detect=tuple(convention_spec.detect),
                otel=otel,
            )
            index = next((i for i, c in enumerate(catalogue.conventions) if c.name == convention.name), None)
            if index is None:
                catalogue.conventions.append(convention)
            else:
                catalogue.conventions[index] = convention
        for resource_spec in spec.resources:
            try:
                where = f"{path}: resource {resource_spec.name}"
                resource = resource_from_spec(resource_spec, where)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
            # Like a convention: one of the same name in a later file replaces the shipped one.
            catalogue.resources = [r for r in catalogue.resources if r.how != resource.how] + [resource]
    return catalogue
