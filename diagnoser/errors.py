"""The one exception tree of diagnoser.

Everything diagnoser raises on purpose derives from :class:`DiagnoserError`::

    DiagnoserError
    ├── ConfigError            bad configuration file, environment or flag (CLI exit code 2)
    ├── SourceNotConfigured    a check needs a source the user did not configure: the rule is skipped
    ├── NoDataFound            a check found nothing of what it reads at the instant: the rule had no data
    ├── MissingVariable        a ``${...}`` placeholder names a value not set (also a KeyError):
    │                          an unset ``signals.X`` skips the rule
    ├── ExpressionError        a rule's ``compute`` expression is invalid or cannot be evaluated
    │   │                      (also a ValueError); ``missing``: a value it names is absent
    │   └── PromqlSyntaxError  a PromQL query the parser cannot read (``query``, ``reason``)
    ├── ProbeSafetyError       a probe asked for more than its caps or a host outside the allowlist
    ├── ProbeWorkerError       a probe worker (process or pod) died or broke the protocol mid-run
    ├── SendError              a receiver did not take a notification; its attributes say whether to retry
    │   ├── SlackSendError     Slack's answer (``error`` is Slack's code)
    │   ├── WebhookSendError   a JSON webhook's answer (``error`` is ``http_<status>``)
    │   └── PagerDutySendError PagerDuty's Events API answer
    ├── StateError             the daemon's state file cannot be opened or written (``reason`` says why)
    ├── NotationError          a rule test's series notation does not parse (also a ValueError)
    └── LocalPrometheusError   the local Prometheus of ``rules test`` could not be prepared or started

Rule files that fail validation are not raised: each becomes a :class:`RuleProblem` of the
loaded rule set, so one bad file never hides the others.

Sources never let a client library's exception (requests, urllib3, httpx, elasticsearch,
kubernetes) escape: they return a :class:`diagnoser.models.SourceError` value instead, so a
down, slow or lying source becomes an entry in the report rather than a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ConfigError",
    "DiagnoserError",
    "ExpressionError",
    "LocalPrometheusError",
    "MissingVariable",
    "NoDataFound",
    "NotationError",
    "PagerDutySendError",
    "ProbeSafetyError",
    "ProbeWorkerError",
    "PromqlSyntaxError",
    "RuleProblem",
    "SendError",
    "SlackSendError",
    "SourceNotConfigured",
    "StateError",
    "WebhookSendError",
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


class SourceNotConfigured(DiagnoserError):
    """A check needs a source (Elasticsearch, Kubernetes, probe...) that is not configured."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__(f"source {source!r} is not configured")


class NoDataFound(DiagnoserError):
    """A check found nothing it could read at the instant (no resource of its kinds, catalogued or
    recognised by shape): the rule had no data, which the coverage says (``no_data``)."""


class ProbeSafetyError(DiagnoserError):
    """A probe definition or flag exceeds a safety cap, or targets a host not allowed."""


class ProbeWorkerError(DiagnoserError):
    """A worker of a multi-process or multi-pod run died, timed out or answered garbage: the run
    (or capacity step) it was part of fails, rather than reporting a silently lower rate."""


class StateError(DiagnoserError):
    """The state file cannot be used: ``reason`` is ``disk_full``, ``read_only``, ``corrupt``,
    ``locked``, ``unopenable`` or ``io``; the message names the file and what to do."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class MissingVariable(DiagnoserError, KeyError):
    """A ``${...}`` placeholder names a value that is not configured (e.g. an unset signal)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(name)

    def __str__(self) -> str:
        return f"${{{self.name}}} is not configured"


class ExpressionError(DiagnoserError, ValueError):
    """An expression is malformed, uses something not allowed, or names a missing value."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        #: True when the expression is fine but a value it needs was not measured.
        self.missing = missing


class PromqlSyntaxError(ExpressionError):
    """A PromQL query that does not parse: ``reason`` is the parser's, ``query`` the text."""

    def __init__(self, query: str, reason: str) -> None:
        super().__init__(f"PromQL does not parse ({reason}): {' '.join(query.split())}")
        self.query = query
        self.reason = reason


class SendError(DiagnoserError):
    """A receiver did not take the notification (or did not say): what to do next is in the attributes.

    The outbox delivery reads only these, never which service answered: ``error`` is the
    service's own code (``channel_not_found``, ``http_404``) or ``""``; ``permanent``: resending
    cannot help; ``layout``: the rich layout was refused, the plain text alone may pass;
    ``retry_after``: seconds the service asked to wait; ``in_doubt``: the request may have been
    processed; ``auth``: the credentials were refused (a token revoked or being rotated: the whole
    receiver waits, retried with backoff until ``notify.delivery.dead_letter_after_s``);
    ``scope``: what a rate limit covers (``post``, ``update``, ``read_back``), when it covers only
    that kind of call and not the whole receiver.
    """

    def __init__(
        self,
        message: str,
        *,
        permanent: bool = False,
        error: str = "",
        layout: bool = False,
        retry_after: float | None = None,
        in_doubt: bool = False,
        auth: bool = False,
        scope: str | None = None,
    ) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.error = error
        self.layout = layout
        self.retry_after = retry_after
        self.in_doubt = in_doubt
        self.auth = auth
        self.scope = scope


class SlackSendError(SendError):
    """Slack did not take the message; ``error`` is Slack's error code (``channel_not_found``)."""


class WebhookSendError(SendError):
    """A JSON webhook did not take the message; ``error`` is ``http_<status>`` or ``""``."""


class PagerDutySendError(SendError):
    """PagerDuty's Events API did not take the event; ``error`` is ``http_<status>`` or ``""``."""


class NotationError(DiagnoserError, ValueError):
    """A series or values string that does not follow the rule tests' series notation."""


class LocalPrometheusError(DiagnoserError):
    """The local Prometheus could not be prepared or started (missing binary, bad data, not ready)."""
