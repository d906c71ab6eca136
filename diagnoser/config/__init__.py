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

from diagnoser.config.receivers import DeliverySettings, Match, NotifySettings, ReceiverSpec, Route
from diagnoser.config.sections import (
    CAPACITY_MAX_DURATION_CEILING_S,
    CAPACITY_MAX_RATE_CEILING,
    DEFAULT_RUNBOOK_BASE_URL,
    PROBE_MAX_CONNECTIONS_CEILING,
    PROBE_MAX_DURATION_CEILING_S,
    PROBE_MAX_RATE_CEILING,
    PROBE_REQUEST_TIMEOUT_CEILING_S,
    BasicAuth,
    CapacitySettings,
    DaemonSettings,
    ElasticsearchSettings,
    KubernetesSettings,
    LeaderElectionSettings,
    ProbeSettings,
    PrometheusSettings,
    Silence,
    SlackSettings,
    SloSettings,
    VerifySettings,
    parse_listen_address,
)
from diagnoser.config.settings import Settings, check_paths, load_settings
from diagnoser.promql import duration_seconds

__all__ = [
    "CAPACITY_MAX_DURATION_CEILING_S",
    "CAPACITY_MAX_RATE_CEILING",
    "DEFAULT_RUNBOOK_BASE_URL",
    "PROBE_MAX_CONNECTIONS_CEILING",
    "PROBE_MAX_DURATION_CEILING_S",
    "PROBE_MAX_RATE_CEILING",
    "PROBE_REQUEST_TIMEOUT_CEILING_S",
    "BasicAuth",
    "CapacitySettings",
    "DaemonSettings",
    "DeliverySettings",
    "ElasticsearchSettings",
    "KubernetesSettings",
    "LeaderElectionSettings",
    "Match",
    "NotifySettings",
    "ProbeSettings",
    "PrometheusSettings",
    "ReceiverSpec",
    "Route",
    "Settings",
    "Silence",
    "SlackSettings",
    "SloSettings",
    "VerifySettings",
    "check_paths",
    "duration_seconds",
    "load_settings",
    "parse_listen_address",
]

