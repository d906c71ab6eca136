"""The sections of the configuration: one model per source, the probe's caps, Slack, the daemon.

Every section forbids unknown keys, so a typo is an error naming the known ones.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from diagnoser.config.addresses import literal_refusal, parse_networks

DEFAULT_RUNBOOK_BASE_URL = "https://github.com/diagnoser/diagnoser/blob/main/rules/"


class _Section(BaseModel):
    # NaN and infinity are never a cap, a timeout or a threshold: refused as for any bad number.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def http_url(value: str, what: str = "URL") -> str:
    """``value`` when it is an ``http(s)://`` URL with a host and a valid port; ValueError saying why not."""
    try:
        parts = urlsplit(value)
        port = parts.port  # ValueError for a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{value!r}: a {what} starts with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"{value!r}: a {what} needs a host (no host given)")
    if any(c.isspace() for c in value) or (port is not None and port == 0):
        raise ValueError(f"{value!r} is not a URL (spaces, or port 0)")
    return value


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
    #: Read a rule condition's ``diag:*`` recording (``diagnose rules export --recording``, loaded
    #: into the server's ruler) instead of its raw query wherever the ruler writes it.
    use_recorded: bool = False

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return http_url(value, "PromQL API URL") if value else value


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

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, value: list[str]) -> list[str]:
        return [http_url(url, "Elasticsearch URL") for url in value]


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


#: Ceilings of ``diagnose capacity`` (an explicit load test, never the daemon's probe): the
#: aggregate rate of every worker together and a step's length. No config or flag passes them.
CAPACITY_MAX_RATE_CEILING = 100_000.0
CAPACITY_MAX_DURATION_CEILING_S = 3600.0


class CapacitySettings(_Section):
    """Caps of ``diagnose capacity`` and ``diagnose probe --load-test``: the aggregate rate of all
    workers and a step's length, up to the ``CAPACITY_*_CEILING`` constants. The allowlist, the
    address rule, the request timeout and the connections per worker stay ``probe.*``'s."""

    max_rate: float = Field(default=20_000.0, gt=0, le=CAPACITY_MAX_RATE_CEILING)
    max_duration_s: float = Field(default=600.0, gt=0, le=CAPACITY_MAX_DURATION_CEILING_S)
    #: Worker processes on this machine; ``None``: one per usable core, no more than the rate needs.
    workers: int | None = Field(default=None, ge=1, le=256)
    #: A capacity on record older than this is left out of incident messages (the service has
    #: changed since: a release, a resize); ``/metrics`` still exports it, with its timestamp.
    record_max_age_days: float = Field(default=30.0, gt=0, le=3650)
    #: Capacity runs the daemon makes itself (the leader only), recorded in its state; off: none.
    schedule: list[ScheduledCapacityRun] = Field(default_factory=list)


class VerifySettings(_Section):
    """The daemon's confirm probe: when an incident resolves, is its service healthy again at the
    load it failed under? Off by default: it adds the incident's request rate (within
    ``probe.max_rate``) on top of the service's own traffic just after it recovered."""

    enabled: bool = False
    #: Seconds the confirm probe runs (at most ``probe.max_duration_s``).
    duration_s: float = Field(default=10.0, gt=0, le=PROBE_MAX_DURATION_CEILING_S)
    #: Seconds to wait after the resolution before probing (the resolution already waited
    #: ``daemon.resolve_after_s`` with the cause clear).
    delay_s: float = Field(default=0.0, ge=0, le=3600)


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
    #: The longest wait between two tries: after an outage the queue drains within about this.
    retry_max_s: float = Field(default=30.0, gt=0)
    #: Messages (posts and edits) per second to the channel, and how many may go at once:
    #: Slack allows about one per second per channel. Calls wait for their turn.
    messages_per_s: float = Field(default=1.0, gt=0, le=50)
    message_burst: int = Field(default=2, ge=1, le=50)
    #: A message Slack refused for good (a token being rotated, a channel renamed) is kept as a
    #: dead letter and tried again this often, up to ``dead_letter_retries`` times.
    dead_letter_retry_s: float = Field(default=900.0, gt=0)
    dead_letter_retries: int = Field(default=8, ge=0, le=1000)
    #: A post whose answer never came is looked for in the channel (by its marker) and posted
    #: again only when it is still absent this long after it was sent: a request Slack is
    #: still processing must not become a second message.
    in_doubt_settle_s: float = Field(default=60.0, ge=0)
    #: Addresses or networks (``127.0.0.1``, ``10.0.0.0/8``) besides public ones that ``base_url``
    #: and ``webhook_url`` may be or resolve to (a Slack stand-in, an egress proxy); a cloud
    #: metadata or link-local address only when listed as itself.
    allowed_addresses: list[str] = Field(default_factory=list)

    @field_validator("base_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        return slack_api_url(value)

    @field_validator("allowed_addresses")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        parse_networks(value)
        return value

    @model_validator(mode="after")
    def _addresses_allowed(self) -> SlackSettings:
        refusal = slack_url_refusal(self.base_url, self.webhook_url, self.allowed_addresses)
        if refusal is not None:
            raise ValueError(refusal)
        return self


def slack_api_url(value: str) -> str:
    """``value`` when it is a Slack Web API base URL (https://slack.com/api/); ValueError saying why not."""
    # Refused at start: such a URL used to start the daemon and fail every delivery as
    # "Slack answered garbage", retried forever with the queue behind it. The message
    # never quotes the value, which holds the password.
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL such as https://slack.com/api/")
    if "@" in parts.netloc:
        raise ValueError(
            "must not carry a user or password (user:pass@): Slack authenticates with slack.token"
        )
    return value


def slack_url_refusal(
    base_url: str, webhook_url: SecretStr | None, allowed_addresses: list[str]
) -> str | None:
    """Why Slack's ``base_url`` or ``webhook_url``, when its host is an address, is refused at load
    (the receivers' address rule, :func:`~diagnoser.config.addresses.outbound_refusal`); a name is
    judged where it resolves, at each connection. Never quotes the URL (a webhook's path is its
    secret)."""
    allowed = parse_networks(allowed_addresses)
    urls = {"base_url": base_url, "webhook_url": webhook_url.get_secret_value() if webhook_url else ""}
    for key, url in urls.items():
        refusal = literal_refusal(url, allowed) if url else None
        if refusal is not None:
            return f"Slack {key} refused: {refusal}"
    return None


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
    #: Open HTTP connections beyond this are answered 503 and closed (a few more are kept for
    #: /healthz and /readyz, so the probes still answer at the cap).
    http_max_connections: int = Field(default=100, ge=1, le=10000)
    #: Open HTTP connections from one client address beyond this are answered 503 and closed,
    #: so one client cannot hold the whole cap.
    http_max_connections_per_peer: int = Field(default=20, ge=1, le=10000)
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
    #: An incident's first message waits until it has held this long (Alertmanager's
    #: ``group_wait``, Prometheus' ``for``), from its onset; default: one ``confirm_window``.
    pending_for_s: float | None = Field(default=None, ge=0)
    #: An incident is resolved once its cause has been clear this long (``keep_firing_for``);
    #: default: two ``diagnose_interval_s`` or half a ``confirm_window``, the longer.
    resolve_after_s: float | None = Field(default=None, ge=0)
    #: An incident back within this of its resolution reopens its thread instead of a new post.
    reopen_within_s: float = Field(default=1800.0, ge=0)
    #: More incidents than this opening in one cycle: one digest, their details in its thread.
    digest_threshold: int = Field(default=5, ge=1)
    #: At most one thread reply per incident this often (severity changes and resolutions excepted).
    reply_min_interval_s: float = Field(default=300.0, ge=0)
    #: Without Slack: a URL every notification is POSTed to as JSON (any receiver; see
    #: docs/daemon.md). No threads, no read-back.
    notify_webhook_url: SecretStr | None = None
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


class ScheduledCapacityRun(_Section):
    """One ``capacity.schedule`` entry: a ``diagnose capacity`` run the daemon makes on its own,
    within the ``capacity.*`` caps, of a target whose host is in ``probe.allowed_hosts``."""

    #: A URL or a probe file; its host must be in ``probe.allowed_hosts`` either way (no one typed it).
    target: str
    #: Seconds between runs (the first one this long after the daemon starts).
    every_s: float = Field(default=86_400.0, gt=0)
    #: The SLO a step must hold: ``slo.p99_ms`` by default, and the load test's 0.001 error ratio.
    slo_p99_ms: float | None = Field(default=None, gt=0)
    slo_error_ratio: float | None = Field(default=None, ge=0, le=1)
    #: The highest rate tried (default and cap: ``capacity.max_rate``); fixed ``steps`` instead of a search.
    max_rate: float | None = Field(default=None, gt=0)
    start_rate: float | None = Field(default=None, gt=0)
    steps: list[float] | None = None
    step_s: float = Field(default=30.0, gt=0)
    pause_s: float = Field(default=1.0, ge=0)
    warmup_s: float = Field(default=2.0, ge=0)
    max_steps: int = Field(default=16, ge=1, le=50)
    #: The service the target measures (and its namespace), as for ``diagnose capacity --service``.
    service: str | None = None
    namespace: str | None = None


# ``capacity.schedule``'s entries are defined after the section that lists them.
CapacitySettings.model_rebuild()
