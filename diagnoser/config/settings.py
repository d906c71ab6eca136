"""The whole configuration and how it loads: YAML file, then ``DIAGNOSER_*`` variables, then flags.

Also what a command checks before it starts: the sources configured, the paths that must
exist, the Kubernetes credentials that must load.
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from diagnoser.config.receivers import NotifySettings
from diagnoser.config.sections import (
    DEFAULT_RUNBOOK_BASE_URL,
    CapacitySettings,
    DaemonSettings,
    ElasticsearchSettings,
    KubernetesSettings,
    ProbeSettings,
    PrometheusSettings,
    Silence,
    SlackSettings,
    SloSettings,
    VerifySettings,
)
from diagnoser.errors import ConfigError
from diagnoser.promql import duration_seconds, is_duration
from diagnoser.yamlfile import read_yaml


class Settings(BaseSettings):
    """All of diagnoser's configuration. Build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix="DIAGNOSER_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
        allow_inf_nan=False,
    )

    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    slo: SloSettings = Field(default_factory=SloSettings)
    elasticsearch: ElasticsearchSettings = Field(default_factory=ElasticsearchSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    #: The daemon's confirm probe when an incident resolves (``diagnose verify`` run by the daemon).
    verify: VerifySettings = Field(default_factory=VerifySettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    #: Receivers of the daemon's notifications and the delivery's knobs.
    notify: NotifySettings = Field(default_factory=NotifySettings)
    #: Metric-name overrides: ``real exporter name -> name in this installation``.
    metrics: dict[str, str] = Field(default_factory=dict)
    #: Application signals rules refer to as ``${signals.NAME}``, e.g. ``queue_length``.
    signals: dict[str, str] = Field(default_factory=dict)
    #: More signal catalogue files or directories (conventions of your own), read after the shipped ones.
    signal_files: list[Path] = Field(default_factory=list)
    #: Per-rule parameter overrides: ``rule id -> {param: value}``.
    rule_params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    rule_dirs: list[Path] = Field(default_factory=list)
    #: Skip the rules shipped with diagnoser and use only ``rule_dirs``.
    disable_builtin_rules: bool = False
    #: Overall deadline for one diagnosis, all rules together.
    deadline_s: float = Field(default=30.0, gt=0)
    #: Labels added to every report (cluster name, environment).
    context_labels: dict[str, str] = Field(default_factory=dict)
    #: The range rules average and rate over (``${window}`` in their queries), a PromQL duration:
    #: the evidence and the numbers a finding shows.
    window: str = "5m"
    #: The range rules *confirm* a problem over (``${confirm_window}`` in their conditions), so a
    #: problem that starts is reported within a diagnose interval or two plus this, not after the
    #: whole averaging window. Default: the shorter of ``window`` and 2m.
    confirm_window: str | None = None
    #: Known problems to keep quiet until a time, each with a comment (``diagnose now`` and ``serve``).
    silences: list[Silence] = Field(default_factory=list)

    def input_paths(self, *, daemon: bool = False) -> list[tuple[str, Path | None]]:
        """Every configured input path, with its key (``rule_dirs[0]``); the daemon's probe files too."""
        slowlogs = self.elasticsearch.slowlog_paths
        expected: list[tuple[str, Path | None]] = [
            ("prometheus.ca_file", self.prometheus.ca_file),
            ("elasticsearch.ca_certs", self.elasticsearch.ca_certs),
            ("kubernetes.kubeconfig", self.kubernetes.kubeconfig if self.kubernetes.enabled else None),
            *((f"elasticsearch.slowlog_paths[{i}]", p) for i, p in enumerate(slowlogs)),
            *((f"rule_dirs[{i}]", p) for i, p in enumerate(self.rule_dirs)),
        ]
        if daemon:
            expected += [(f"daemon.probe_files[{i}]", p) for i, p in enumerate(self.daemon.probe_files)]
        return expected

    @property
    def effective_confirm_window(self) -> str:
        """``confirm_window``, or the shorter of ``window`` and 2m."""
        return confirm_window_for(self.window, self.confirm_window)

    @field_validator("window", "confirm_window")
    @classmethod
    def _promql_duration(cls, value: str | None) -> str | None:
        if value is not None and not is_duration(value):
            raise ValueError(f"{value!r} is not a PromQL duration like 30s or 5m")
        return value

    @field_validator("runbook_base_url")
    @classmethod
    def _trailing_slash(cls, value: str) -> str:
        return value if value.endswith("/") else value + "/"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment wins over the file; the file's content arrives as init kwargs.
        return env_settings, init_settings


class _SettingsWithoutEnvironment(Settings):
    """Settings validated from values alone: flags must win over the environment already applied."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_settings(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read ``path`` (YAML), apply the environment, then ``overrides`` (command-line flags).

    Raises :class:`ConfigError` with every problem, each naming its key.
    """
    data: dict[str, Any] = {}
    if path is not None:
        loaded = read_yaml(path, "config")
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the config must be a mapping, got {type(loaded).__name__}")
        data = loaded
    try:
        settings = Settings(**data)
        if overrides:
            merged = _deep_merge(_unwrap_secrets(settings.model_dump(mode="python")), overrides)
            settings = _SettingsWithoutEnvironment(**merged)
    except ValidationError as exc:
        where = f"{path}: " if path else ""
        problems = "; ".join(_describe(err) for err in exc.errors())
        raise ConfigError(f"{where}invalid configuration: {problems}") from exc
    except SettingsError as exc:  # a variable pydantic-settings could not decode at all
        raise ConfigError(_environment_problem(exc)) from exc
    return settings


def _environment_problem(exc: SettingsError) -> str:
    """Which ``DIAGNOSER_*`` variable holds a list or mapping that is not JSON, and how to write one."""
    for key, value in sorted(os.environ.items()):
        if not key.upper().startswith(_ENV_PREFIX):
            continue
        annotation = _annotation_at(key[len(_ENV_PREFIX) :].lower().split("__"))
        if annotation is None or not _takes_json(annotation):
            continue
        try:
            json.loads(value)
        except ValueError:
            example = '{"X-Key": "value"}' if _takes_json(annotation, dict) else '["a", "b"]'
            return f"{key}: not JSON; a list or mapping setting is written as JSON, e.g. {key}='{example}'"
    return f"the environment: {exc}"


_ENV_PREFIX = "DIAGNOSER_"


def _annotation_at(path: list[str]) -> Any:
    """The annotation of the setting at ``path`` (``["prometheus", "headers"]``), or ``None``."""
    model: Any = Settings
    annotation: Any = None
    for name in path:
        fields = getattr(model, "model_fields", None) if isinstance(model, type) else None
        if not fields or name not in fields:
            return None
        annotation = fields[name].annotation
        candidates = [annotation, *typing.get_args(annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return annotation


def _takes_json(annotation: Any, kind: type | None = None) -> bool:
    """Whether a variable gives this setting as JSON (a list, a mapping, a model); of ``kind`` if given."""
    kinds: tuple[type, ...] = (kind,) if kind is not None else (list, dict, set, tuple, BaseModel)
    for candidate in (annotation, *typing.get_args(annotation)):
        origin = typing.get_origin(candidate) or candidate
        if isinstance(origin, type) and issubclass(origin, kinds):
            return True
    return False


def _describe(error: Any) -> str:
    """One validation problem on one line; an unknown key gets the closest known one."""
    loc = [str(p) for p in error["loc"]]
    where = ".".join(loc) or "(root)"
    if error["type"] != "extra_forbidden" or not loc:
        return f"{where}: {str(error['msg']).removeprefix('Value error, ')}"
    known = _known_keys(loc[:-1])
    match = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    hint = f" (did you mean {'.'.join([*loc[:-1], match[0]])}?)" if match else ""
    return f"{where}: unknown key{hint}"


def _known_keys(parent: list[str]) -> list[str]:
    model: Any = Settings
    for name in parent:
        info = getattr(model, "model_fields", {}).get(name)
        if info is None:
            return []
        annotation = info.annotation
        # ``X | None`` sections: look inside the union for the model.
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def confirm_window_for(window: str, confirm_window: str | None) -> str:
    """``confirm_window`` when set, else the shorter of ``window`` and 2m."""
    if confirm_window is not None:
        return confirm_window
    return window if duration_seconds(window) <= 120 else "2m"


def check_paths(expected: Iterable[tuple[str, Path | None]]) -> None:
    """Raise :class:`ConfigError` naming every input path (``(key, path)``, as
    :meth:`Settings.input_paths` lists them) that does not exist.

    A slow log directory that is not there would otherwise read as "no slow queries".
    """
    missing = [
        f"{key}: {path} does not exist" for key, path in expected if path and not path.expanduser().exists()
    ]
    if missing:
        raise ConfigError("; ".join(missing))


def _unwrap_secrets(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {k: _unwrap_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap_secrets(v) for v in value]
    return value
