"""Receivers: one module per integration, each registered by decorator with its typed config.

``notify.receivers`` lists receivers as Alertmanager does: a ``name``, a ``type`` that selects the
integration, an optional ``match:`` (:class:`~diagnoser.config.Match`) and the integration's own
settings, validated by the model it registered (``extra="forbid"``: a misspelt key is an error
naming the receiver and the key). A module of this package registers itself with
:func:`receiver_type`; the package imports every module in it the first time a type is looked up,
so a new integration is one module (plus its docs and tests) and no table to edit::

    @receiver_type("pagerduty", config=PagerDutyConfig)
    class PagerDutyReceiver:
        def __init__(self, config: PagerDutyConfig) -> None: ...

    receivers = build_receivers(receiver_configs(settings.notify, slack=settings.slack,
                                                 webhook_url=settings.daemon.notify_webhook_url))

The older keys (``slack.*``, ``daemon.notify_webhook_url``) still work:
:func:`receiver_configs` maps them onto one receiver (``slack`` or ``webhook``) when
``notify.receivers`` is empty, and says so in :func:`deprecations`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from diagnoser.config import DeliverySettings, Match, NotifySettings, Route, SlackSettings
from diagnoser.config.addresses import literal_refusal, parse_networks
from diagnoser.errors import ConfigError, SendError
from diagnoser.notify.sender import Receiver

__all__ = [
    "AddressConfig",
    "OutboundConfig",
    "ReceiverConfig",
    "ReceiverType",
    "build_receivers",
    "delivery_settings",
    "deprecations",
    "receiver_configs",
    "receiver_type",
    "receiver_types",
    "routes",
]


class ReceiverConfig(BaseModel):
    """What every receiver's typed config has; an integration's model adds its own fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    type: str
    match: Match = Field(default_factory=Match)
    #: Seconds per HTTP call to the service.
    timeout_s: float = Field(default=10.0, gt=0)
    #: Messages per second to it, and how many may go at once (calls wait for their turn).
    messages_per_s: float = Field(default=1.0, gt=0, le=50)
    message_burst: int = Field(default=2, ge=1, le=50)


class AddressConfig(ReceiverConfig):
    """The address rule's setting (:mod:`diagnoser.notify.outbound`) a receiver sending to a
    configured URL has (Slack, which never follows a redirect, has only this)."""

    #: Addresses or networks (``10.0.0.0/8``, ``127.0.0.1``) besides public ones the receiver may
    #: reach; a cloud metadata or link-local address only when listed as itself.
    allowed_addresses: list[str] = Field(default_factory=list)

    @field_validator("allowed_addresses")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        parse_networks(value)
        return value

    def url_refusal(self, url: str) -> str | None:
        """Why ``url``, when its host is an address, is refused at load (a name: at each send)."""
        return literal_refusal(url, parse_networks(self.allowed_addresses))


class OutboundConfig(AddressConfig):
    """The address and redirect rules' settings (:mod:`diagnoser.notify.outbound`) a receiver
    that POSTs to a configured URL has."""

    #: Follow a redirect on the same host (the payload POSTed again); else a redirect is refused.
    follow_redirects: bool = False


@dataclass(frozen=True)
class ReceiverType:
    """A registered integration: its ``type:``, its config model, and how to build one."""

    name: str
    config: type[ReceiverConfig]
    build: Callable[[Any], Receiver[Any]]


_TYPES: dict[str, ReceiverType] = {}
_LOADED: list[bool] = []


def receiver_type(name: str, *, config: type[ReceiverConfig]) -> Callable[[Any], Any]:
    """Register ``build`` (a class or a function taking the config) as the receiver ``type: name``."""

    def register(build: Any) -> Any:
        if name in _TYPES and _TYPES[name].build is not build:
            raise ValueError(f"receiver type {name!r} registered twice")
        _TYPES[name] = ReceiverType(name, config, build)
        return build

    return register


def receiver_types() -> Mapping[str, ReceiverType]:
    """Every registered integration, by ``type:`` (the package's modules imported once)."""
    if not _LOADED:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _LOADED.append(True)
    return dict(_TYPES)


def _slack_receiver(slack: SlackSettings) -> dict[str, Any] | None:
    if slack.token is None and slack.webhook_url is None:
        return None
    fields = slack.model_dump(
        include={
            "webhook_url",
            "token",
            "channel",
            "base_url",
            "timeout_s",
            "messages_per_s",
            "message_burst",
            "allowed_addresses",
        }
    )
    return {"name": "slack", "type": "slack", **fields}


def _webhook_receiver(url: SecretStr | None, slack: SlackSettings) -> dict[str, Any] | None:
    if url is None:
        return None
    # As before receivers: the JSON webhook took Slack's timeout and rate.
    rate = slack.model_dump(include={"timeout_s", "messages_per_s", "message_burst"})
    return {"name": "webhook", "type": "webhook", "url": url, **rate}


def deprecations(notify: NotifySettings, *, slack: SlackSettings, webhook_url: SecretStr | None) -> list[str]:
    """One line per older key in use (logged at start; docs/configuration.md has the mapping)."""
    lines = []
    old = _slack_receiver(slack) is not None or webhook_url is not None
    if old and notify.receivers:
        lines.append("slack.* and daemon.notify_webhook_url are ignored: notify.receivers is set")
    elif _slack_receiver(slack) is not None:
        lines.append("slack.webhook_url/token/channel are deprecated: use notify.receivers with type: slack")
    elif webhook_url is not None:
        lines.append("daemon.notify_webhook_url is deprecated: use notify.receivers with type: webhook")
    if _slack_knobs(slack) != DeliverySettings() and notify.delivery == DeliverySettings():
        lines.append("slack.retry_*/dead_letter_*/in_doubt_settle_s are deprecated: use notify.delivery")
    return lines


_KNOBS = frozenset(DeliverySettings.model_fields)


def _slack_knobs(slack: SlackSettings) -> DeliverySettings:
    return DeliverySettings(**slack.model_dump(include=set(_KNOBS)))


def delivery_settings(notify: NotifySettings, *, slack: SlackSettings) -> DeliverySettings:
    """``notify.delivery``, or the older ``slack.*`` knobs when only those differ from the defaults.

    (By value, not by which keys were written: the settings are merged from a file, the
    environment and flags, and a merge writes every key.)
    """
    if notify.delivery != DeliverySettings():
        return notify.delivery
    return _slack_knobs(slack)


def receiver_configs(
    notify: NotifySettings, *, slack: SlackSettings, webhook_url: SecretStr | None
) -> list[ReceiverConfig]:
    """The typed config of every receiver; :class:`ConfigError` listing every problem at once.

    With ``notify.receivers`` empty, the older keys map onto one receiver: ``slack`` when Slack
    is configured, else ``webhook`` for ``daemon.notify_webhook_url`` (as before, one of them).
    """
    entries: list[dict[str, Any]] = [
        spec.model_dump() | (spec.model_extra or {}) for spec in notify.receivers
    ]
    if not entries:
        legacy = _slack_receiver(slack) or _webhook_receiver(webhook_url, slack)
        entries = [legacy] if legacy is not None else []
    types = receiver_types()
    configs: list[ReceiverConfig] = []
    problems: list[str] = []
    for index, entry in enumerate(entries):
        where = f"notify.receivers[{index}] ({entry.get('name')})"
        kind = types.get(str(entry.get("type")))
        if kind is None:
            problems.append(f"{where}: type {entry.get('type')!r} is not one of {', '.join(sorted(types))}")
            continue
        try:
            configs.append(kind.config.model_validate(entry))
        except ValidationError as exc:
            for error in exc.errors():
                field = ".".join(str(p) for p in error["loc"])
                message = str(error["msg"]).removeprefix("Value error, ")
                # A check across keys (an address refused) has no field: its message names the key.
                problems.append(f"{where}: {field}: {message}" if field else f"{where}: {message}")
    if problems:
        raise ConfigError("; ".join(problems))
    return configs


def build_receivers(configs: Sequence[ReceiverConfig]) -> list[Receiver[Any]]:
    """A receiver for each config (:class:`ConfigError` when one cannot be built)."""
    types = receiver_types()
    built = []
    for config in configs:
        try:
            built.append(types[config.type].build(config))
        except (ValueError, SendError) as exc:
            raise ConfigError(f"notify.receivers ({config.name}): {exc}") from exc
    return built


def routes(configs: Sequence[ReceiverConfig]) -> list[Route]:
    """What the state store routes by: each receiver's name and match."""
    return [Route(name=c.name, match=c.match) for c in configs]
