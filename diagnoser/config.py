"""Configuration: a YAML file, overridden by ``DIAGNOSER_*`` environment variables, then flags.

Nested keys use a double underscore in the environment::

    DIAGNOSER_PROMETHEUS__URL=http://prometheus:9090
    DIAGNOSER_SLO__P99_MS=250
    DIAGNOSER_SIGNALS__QUEUE_LENGTH=volga_compute_queue_length

Example file::

    prometheus:
      url: https://prometheus.example:9090
      bearer_token: ...            # or basic_auth: {username: u, password: p}
      verify_tls: true
      query_timeout_s: 5
    slo: {p99_ms: 250, error_ratio: 0.01}
    metrics:                       # rename metrics for exporters that differ
      hikaricp_connections_max: myapp_hikari_max
    signals:
      queue_length: volga_compute_queue_length
    rule_params:
      kubernetes/slow-pod-startup: {budget_seconds: 3}
    runbook_base_url: https://github.com/acme/diagnoser/blob/main/rules/
    rule_dirs: [/etc/diagnoser/rules]
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from diagnoser.errors import ConfigError

__all__ = [
    "PROBE_MAX_CONNECTIONS_CEILING",
    "PROBE_MAX_DURATION_CEILING_S",
    "PROBE_MAX_RATE_CEILING",
    "PROBE_REQUEST_TIMEOUT_CEILING_S",
    "BasicAuth",
    "DaemonSettings",
    "ElasticsearchSettings",
    "KubernetesSettings",
    "LeaderElectionSettings",
    "ProbeSettings",
    "PrometheusSettings",
    "Settings",
    "Silence",
    "SlackSettings",
    "SloSettings",
    "check_inputs",
    "check_paths",
    "configured_sources",
    "load_settings",
    "parse_listen_address",
]

DEFAULT_RUNBOOK_BASE_URL = "https://github.com/diagnoser/diagnoser/blob/main/rules/"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BasicAuth(_Section):
    username: str
    password: SecretStr


class PrometheusSettings(_Section):
    """Where the PromQL HTTP API is (Prometheus, Thanos, Mimir, VictoriaMetrics) and how to reach it."""

    url: str | None = None
    bearer_token: SecretStr | None = None
    basic_auth: BasicAuth | None = None
    verify_tls: bool = True
    ca_file: Path | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    query_timeout_s: float = Field(default=10.0, gt=0)
    max_concurrency: int = Field(default=16, ge=1, le=256)


class SloSettings(_Section):
    p99_ms: float = Field(default=500.0, gt=0)
    error_ratio: float = Field(default=0.01, gt=0, le=1)


class ElasticsearchSettings(_Section):
    urls: list[str] = Field(default_factory=list)
    api_key: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None
    ca_certs: Path | None = None
    verify_certs: bool = True
    timeout_s: float = Field(default=10.0, gt=0)
    slowlog_paths: list[Path] = Field(default_factory=list)
    slowlog_index: str | None = None


class KubernetesSettings(_Section):
    enabled: bool = False
    in_cluster: bool = False
    kubeconfig: Path | None = None
    context: str | None = None
    #: Namespaces to read; empty means all namespaces.
    namespaces: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=10.0, gt=0)


#: Ceilings of the probe's caps that neither the config file nor the environment can pass: the
#: probe must stay safe to point at production whatever a ConfigMap or a variable says.
PROBE_MAX_RATE_CEILING = 1000.0
PROBE_MAX_DURATION_CEILING_S = 3600.0
PROBE_REQUEST_TIMEOUT_CEILING_S = 60.0
PROBE_MAX_CONNECTIONS_CEILING = 1000


class ProbeSettings(_Section):
    """Caps: no probe file or flag can exceed them; this config can lower them, and raise them
    only up to the ``PROBE_*_CEILING`` constants."""

    max_rate: float = Field(default=1000.0, gt=0, le=PROBE_MAX_RATE_CEILING)
    max_duration_s: float = Field(default=600.0, gt=0, le=PROBE_MAX_DURATION_CEILING_S)
    allowed_hosts: list[str] = Field(default_factory=list)
    request_timeout_s: float = Field(default=5.0, gt=0, le=PROBE_REQUEST_TIMEOUT_CEILING_S)
    #: Connections one probe run may hold open (its pool), whatever the probe file asks.
    max_connections: int = Field(
        default=PROBE_MAX_CONNECTIONS_CEILING, ge=1, le=PROBE_MAX_CONNECTIONS_CEILING
    )
    abort_error_ratio: float = Field(default=0.5, gt=0, le=1)
    abort_window_s: float = Field(default=5.0, gt=0)
    #: Wake this many microseconds before each send (at most half the wait) and keep the event
    #: loop turning until it is due: idle vCPUs of virtual machines are slow to wake, and this
    #: cut the schedule lag p99 at 1,000 req/s from about 0.9 ms to under 0.2 ms on the
    #: reference VM, for about ``rate x spin`` of a core (4 % at 200 req/s). 0 sleeps to the send time.
    timer_spin_us: float = Field(default=200.0, ge=0, le=1000)


class SlackSettings(_Section):
    webhook_url: SecretStr | None = None
    token: SecretStr | None = None
    channel: str | None = None
    base_url: str = "https://slack.com/api/"
    #: Seconds per HTTP call to Slack (or a Slack-compatible endpoint such as Mattermost).
    timeout_s: float = Field(default=10.0, gt=0)
    #: Not used any more (a 429 now reschedules the message after its Retry-After instead of
    #: waiting inside the call); still accepted so that existing config files load.
    rate_limit_retries: int = Field(default=2, ge=0, le=10)
    #: First wait after a failed delivery; it doubles with each failure (with jitter) up to
    #: ``retry_max_s``. A 429's Retry-After replaces it.
    retry_base_s: float = Field(default=2.0, gt=0)
    retry_max_s: float = Field(default=300.0, gt=0)
    #: A post whose answer never came is looked for in the channel (by its marker) and posted
    #: again only when it is still absent this long after it was sent: a request Slack is
    #: still processing must not become a second message.
    in_doubt_settle_s: float = Field(default=60.0, ge=0)


class LeaderElectionSettings(_Section):
    """A coordination.k8s.io/v1 Lease decides which replica notifies (client-go's algorithm)."""

    #: ``None``: on whenever Kubernetes is configured; a lone instance without Kubernetes is leader.
    enabled: bool | None = None
    lease_name: str = "diagnoser"
    namespace: str = "diagnoser"
    #: This replica's name in the Lease; default: the host name (the pod name in a cluster).
    identity: str | None = None
    lease_duration_s: float = Field(default=15.0, gt=0)
    renew_interval_s: float = Field(default=5.0, gt=0)


class DaemonSettings(_Section):
    """``diagnose serve``: schedules, notification state, HTTP endpoints and shutdown."""

    diagnose_interval_s: float = Field(default=60.0, gt=0)
    probe_interval_s: float = Field(default=300.0, gt=0)
    #: Random delay added to each run so replicas and jobs do not fire in lockstep.
    jitter_s: float = Field(default=5.0, ge=0)
    #: A run that could not start on time still starts if it is at most this late.
    misfire_grace_s: float = Field(default=30.0, gt=0)
    #: A finding that is still there is notified again only after this many seconds.
    cooldown_s: float = Field(default=3600.0, ge=0)
    #: Findings below this severity are kept in the state but never notified.
    notify_min_severity: str = "warning"
    state_path: Path = Path("diagnoser-state.sqlite3")
    #: ``host:port`` of /healthz, /readyz, /metrics and POST /alertmanager. Loopback by
    #: default: /metrics has no authentication; a pod listens on ``0.0.0.0:8080`` explicitly.
    listen: str = "127.0.0.1:8080"
    #: Open HTTP connections beyond this are answered 503 and closed.
    http_max_connections: int = Field(default=100, ge=1, le=10000)
    #: A connection must send its request headers within this (else 408); also the idle
    #: keep-alive time.
    http_header_timeout_s: float = Field(default=10.0, gt=0)
    #: An Alertmanager group (``groupKey``) is diagnosed once within this; its repeats get 202
    #: ``duplicate`` and no new message.
    alert_group_cooldown_s: float = Field(default=300.0, ge=0)
    #: Alert diagnoses running at once, and accepted ones waiting (beyond: 503, Alertmanager retries).
    alert_concurrency: int = Field(default=2, ge=1, le=64)
    alert_backlog: int = Field(default=16, ge=1, le=1000)
    #: /readyz fails when the last diagnosis is older; default 3 intervals plus the deadline.
    ready_max_age_s: float | None = Field(default=None, gt=0)
    #: On SIGTERM, in-flight work gets this long to finish before it is cancelled.
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    #: How often queued notifications are retried while Slack is unreachable.
    outbox_retry_s: float = Field(default=5.0, gt=0)
    #: Bearer token Alertmanager must send to POST /alertmanager; unset: the receiver is off.
    alertmanager_token: SecretStr | None = None
    #: Probe definitions (``probes/*.yaml``) run by the probe job.
    probe_files: list[Path] = Field(default_factory=list)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)

    @field_validator("listen")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        parse_listen_address(value)
        return value

    @field_validator("notify_min_severity")
    @classmethod
    def _known_severity(cls, value: str) -> str:
        if value not in ("critical", "warning", "info"):
            raise ValueError("must be one of critical, warning, info")
        return value


class Silence(_Section):
    """Findings to keep out of the report and notifications until ``until``, for a stated reason.

    ``matchers`` compare with a finding's ``cause``, ``rule_id``, ``severity`` and labels
    (``namespace``, ``job``, ``pool``...): every matcher must equal. A silenced finding is
    listed in the report's coverage, never dropped without a trace.
    """

    matchers: dict[str, str] = Field(min_length=1)
    until: datetime
    comment: str = Field(min_length=1)

    @field_validator("until")
    @classmethod
    def _zoned(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("needs a time zone, e.g. 2026-12-01T08:00:00Z")
        return value


def parse_listen_address(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8080``, ``0.0.0.0:8080``, ``:8080``) as a pair; ValueError otherwise."""
    host, colon, port_text = listen.strip().rpartition(":")
    if not colon or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{listen!r} is not host:port (e.g. 0.0.0.0:8080 or 127.0.0.1:9000)")
    host = host.strip("[]") or "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", host):
            raise ValueError(f"{listen!r}: {host!r} is neither an IP address nor a host name") from None
    return host, int(port_text)


_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(duration: str) -> float:
    """A PromQL duration (``1h30m``) in seconds."""
    return float(sum(int(n) * _DURATION_UNITS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration)))


class Settings(BaseSettings):
    """All of diagnoser's configuration. Build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix="DIAGNOSER_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    slo: SloSettings = Field(default_factory=SloSettings)
    elasticsearch: ElasticsearchSettings = Field(default_factory=ElasticsearchSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
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

    @property
    def effective_confirm_window(self) -> str:
        """``confirm_window``, or the shorter of ``window`` and 2m."""
        if self.confirm_window is not None:
            return self.confirm_window
        return self.window if duration_seconds(self.window) <= 120 else "2m"

    @field_validator("window", "confirm_window")
    @classmethod
    def _promql_duration(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", value):
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
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
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
    return settings


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


def configured_sources(settings: Settings) -> list[str]:
    """The sources ``settings`` configures (the probe counts when the daemon has probe files)."""
    sources = []
    if settings.prometheus.url:
        sources.append("prometheus")
    if settings.kubernetes.enabled:
        sources.append("kubernetes")
    if settings.elasticsearch.urls or settings.elasticsearch.slowlog_paths:
        sources.append("elasticsearch")
    if settings.daemon.probe_files:
        sources.append("probe")
    return sources


def check_paths(settings: Settings, *, daemon: bool = False) -> None:
    """Raise :class:`ConfigError` naming every configured input path that does not exist.

    A slow log directory that is not there would otherwise read as "no slow queries".
    """
    slowlogs = settings.elasticsearch.slowlog_paths
    expected: list[tuple[str, Path | None]] = [
        ("prometheus.ca_file", settings.prometheus.ca_file),
        ("elasticsearch.ca_certs", settings.elasticsearch.ca_certs),
        ("kubernetes.kubeconfig", settings.kubernetes.kubeconfig if settings.kubernetes.enabled else None),
        *((f"elasticsearch.slowlog_paths[{i}]", p) for i, p in enumerate(slowlogs)),
        *((f"rule_dirs[{i}]", p) for i, p in enumerate(settings.rule_dirs)),
    ]
    if daemon:
        expected += [(f"daemon.probe_files[{i}]", p) for i, p in enumerate(settings.daemon.probe_files)]
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


def check_inputs(settings: Settings, *, daemon: bool = False) -> None:
    """:func:`check_paths`, then load the Kubernetes credentials once: a kubeconfig that does not
    load is the user's configuration to fix (exit 2), not a source outage to report."""
    check_paths(settings, daemon=daemon)
    if settings.kubernetes.enabled:
        from diagnoser.sources.kubernetes import KubernetesSource

        KubernetesSource.from_settings(settings.kubernetes).close()
