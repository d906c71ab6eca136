"""``notify:``: the receivers, which of them hears of which incident, and the delivery's knobs.

Every entry of ``notify.receivers`` is first read as a :class:`ReceiverSpec` (its ``name``, its
``type`` and its ``match``); the integration registered for the type
(:mod:`diagnoser.notify.receivers`) then reads its own settings from the same entry. The state
store routes with :class:`Match` alone (it queues one outbox row per receiver that matches), so
it never loads an integration or its HTTP client, as Alertmanager's route tree knows receivers
only by name. ::

    match = Match(severity="critical", service=["checkout"])
    match.accepts(finding)   # True for a critical finding about checkout
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from diagnoser.models import Finding, Severity

__all__ = ["DeliverySettings", "Match", "NotifySettings", "ReceiverSpec", "Route"]

#: Keys of an integration's settings kept as secrets from the moment they are read.
SECRET_KEYS = frozenset({"token", "routing_key", "url", "webhook_url", "password", "api_key", "secret"})
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class Match(BaseModel):
    """What a receiver is told of: every condition given must hold (an empty match takes all).

    ``severity``: the lowest severity it hears of; ``service``: the services (a finding's
    :attr:`~diagnoser.models.Finding.service`); ``cause``: the causes (or symptoms) named.
    A notification that is about no finding (a digest of many incidents) reaches every receiver
    whose match names neither a service nor a cause.
    """

    model_config = ConfigDict(extra="forbid")

    severity: Severity | None = None
    service: list[str] = Field(default_factory=list)
    cause: list[str] = Field(default_factory=list)

    @field_validator("service", "cause", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    def accepts(self, finding: Finding | None) -> bool:
        """True when a notification about ``finding`` (``None``: about no one finding) is for it."""
        if finding is None:
            return not self.service and not self.cause
        return self.accepts_row(finding.severity, finding.service, finding.cause)

    def accepts_row(self, severity: Severity, service: str, cause: str) -> bool:
        """True for a notification at ``severity`` about ``cause`` in ``service``."""
        if self.severity is not None and severity.rank < self.severity.rank:
            return False
        if self.service and service not in self.service:
            return False
        return not self.cause or cause in self.cause

    def accepts_any(self, findings: Iterable[Finding]) -> bool:
        """True when it accepts one of ``findings`` (an incident: its lead and what it explains)."""
        return any(self.accepts(f) for f in findings)


class ReceiverSpec(BaseModel):
    """The part of a ``notify.receivers`` entry every type shares; the rest is the type's own."""

    model_config = ConfigDict(extra="allow", frozen=True)

    #: Unique among the receivers; names its outbox rows, so renaming one starts it afresh.
    name: str
    #: The integration (``slack``, ``webhook``, ``pagerduty``, or one registered by a plugin).
    type: str
    match: Match = Field(default_factory=Match)

    @model_validator(mode="before")
    @classmethod
    def _secrets_hidden(cls, data: Any) -> Any:
        # The integration's own model reads these later; until then they never print.
        if isinstance(data, dict):
            return {
                k: SecretStr(v) if k in SECRET_KEYS and isinstance(v, str) else v for k, v in data.items()
            }
        return data

    @field_validator("name")
    @classmethod
    def _simple_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"{value!r}: a receiver's name is lower-case letters, digits, '.', '_' or '-' (at most 63)"
            )
        return value


class Route(BaseModel):
    """A receiver as the state store sees it: its name and what it matches."""

    model_config = ConfigDict(frozen=True)

    name: str
    match: Match = Field(default_factory=Match)


class DeliverySettings(BaseModel):
    """How the outbox retries, for every receiver (``notify.delivery``; formerly ``slack.*``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: First wait after a failed delivery; it doubles with each failure (with jitter) up to
    #: ``retry_max_s``. A 429's Retry-After replaces it.
    retry_base_s: float = Field(default=2.0, gt=0)
    #: The longest wait between two tries: after an outage the queue drains within about this.
    retry_max_s: float = Field(default=30.0, gt=0)
    #: A message refused for good (a token being rotated, a channel renamed) is kept as a dead
    #: letter and tried again this often, up to ``dead_letter_retries`` times.
    dead_letter_retry_s: float = Field(default=900.0, gt=0)
    dead_letter_retries: int = Field(default=8, ge=0, le=1000)
    #: A post whose answer never came is looked for (by its marker, where the receiver can read
    #: back) and posted again only when still absent this long after it was sent.
    in_doubt_settle_s: float = Field(default=60.0, ge=0)
    #: Refused credentials (``invalid_auth``, ``token_revoked``, HTTP 401/403) are retried with
    #: the backoff above for this long before the message becomes a dead letter: a token being
    #: rotated delays messages by about the glitch, never by ``dead_letter_retry_s``.
    dead_letter_after_s: float = Field(default=3600.0, ge=0)
    #: A receiver whose oldest queued message is undelivered this long is *stuck*: an ERROR log
    #: line, ``/readyz`` answers 503 naming it, ``diagnoser_receiver_stuck{receiver}`` is 1.
    stuck_after_s: float = Field(default=120.0, gt=0)


class NotifySettings(BaseModel):
    """``notify.receivers`` (each a typed config selected by ``type:``) and ``notify.delivery``."""

    model_config = ConfigDict(extra="forbid")

    receivers: list[ReceiverSpec] = Field(default_factory=list)
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)

    @field_validator("receivers")
    @classmethod
    def _unique_names(cls, value: list[ReceiverSpec]) -> list[ReceiverSpec]:
        names = [r.name for r in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"receiver names must be unique: {', '.join(twice)} given more than once")
        return value
