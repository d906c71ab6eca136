"""The PagerDuty receiver (``type: pagerduty``): Events API v2, one alert per incident.

Each incident becomes one PagerDuty alert: its first message is a ``trigger`` event, its
resolution a ``resolve`` event with the same ``dedup_key``, and a reopening a ``trigger`` again
(PagerDuty opens a new alert for a key whose alert was resolved). The ``dedup_key`` is derived
from the incident (its id and when it opened), so a trigger sent twice (an answer that never
came, a restart) is folded by PagerDuty into the one alert. Edits, reminders, digests and
alert reports are Slack's business: PagerDuty is not told of them.

The wire format is PagerDuty's documented one: ``POST {events_url}`` (default
``https://events.pagerduty.com/v2/enqueue``) with ``{"routing_key", "event_action",
"dedup_key", "payload": {"summary", "source", "severity", "component", "group", "class",
"custom_details"}, "links", "client"}``; ``202 {"status": "success", "dedup_key": ...}`` is
delivered, ``400`` (an invalid event) refuses that event, ``429`` and ``5xx`` are retried with
backoff (PagerDuty documents no ``Retry-After``; one sent is kept), ``401``/``403`` from a proxy
in front too, until ``notify.delivery.dead_letter_after_s``. Where it sends obeys the address and
redirect rules every receiver does (:mod:`diagnoser.notify.outbound`): a redirect is refused
unless ``follow_redirects`` (then the same host only), and an ``events_url`` that is or resolves
to a private address needs it in ``allowed_addresses`` (a proxy or a relay inside the network). ::

    notify:
      receivers:
        - name: pager
          type: pagerduty
          routing_key: R0123456789ABCDEF0123456789ABCDE
          match: {severity: critical}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from diagnoser.config.sections import http_url
from diagnoser.errors import PagerDutySendError
from diagnoser.models import Severity
from diagnoser.notify.incident_render import capacity_line
from diagnoser.notify.outbound import GuardedPoster
from diagnoser.notify.outbox import NotificationKind, OutboxEntry
from diagnoser.notify.payloads import IncidentPayload
from diagnoser.notify.receivers import OutboundConfig, receiver_type
from diagnoser.notify.sender import Capabilities, Delivery, TokenBucket
from diagnoser.redact import redact_url, scrub

__all__ = ["PagerDutyConfig", "PagerDutyEvent", "PagerDutyReceiver", "dedup_key", "render_event"]

#: Our severities in PagerDuty's (``critical``, ``error``, ``warning``, ``info``).
_SEVERITY = {Severity.critical: "critical", Severity.warning: "warning", Severity.info: "info"}
#: What PagerDuty is told of; every other kind is Slack's (edits, reminders, digests).
_TRIGGERS = frozenset({NotificationKind.new, NotificationKind.reopened})


class PagerDutyConfig(OutboundConfig):
    """The Events API v2 integration key of a PagerDuty service, and where to send."""

    routing_key: SecretStr
    events_url: str = "https://events.pagerduty.com/v2/enqueue"
    #: ``payload.source`` of every event: where the problem is seen.
    source: str = "diagnoser"
    #: A link to what the responder should open first (a dashboard); the runbook is always linked.
    client_url: str | None = None
    messages_per_s: float = Field(default=2.0, gt=0, le=50)

    @field_validator("events_url")
    @classmethod
    def _http(cls, value: str) -> str:
        return http_url(value, "PagerDuty events URL")

    @model_validator(mode="after")
    def _literal_address_allowed(self) -> PagerDutyConfig:
        refusal = self.url_refusal(self.events_url)
        if refusal is not None:
            raise ValueError(f"PagerDuty events URL refused: {refusal}")
        return self


@dataclass(frozen=True)
class PagerDutyEvent:
    """One Events API v2 event (without its routing key, which the sender adds)."""

    action: Literal["trigger", "resolve"]
    dedup_key: str
    summary: str = ""
    severity: str = "warning"
    component: str = ""
    group: str = ""
    event_class: str = ""
    custom_details: dict[str, Any] = field(default_factory=dict)
    links: list[dict[str, str]] = field(default_factory=list)

    def body(self, *, routing_key: str, source: str, client_url: str | None = None) -> dict[str, Any]:
        """The JSON PagerDuty expects for this event."""
        body: dict[str, Any] = {
            "routing_key": routing_key,
            "event_action": self.action,
            "dedup_key": self.dedup_key,
        }
        if self.action == "resolve":
            return body
        details = {
            "summary": self.summary[:1024],
            "source": source,
            "severity": self.severity,
            "component": self.component,
            "group": self.group,
            "class": self.event_class,
            "custom_details": self.custom_details,
        }
        body["payload"] = {k: v for k, v in details.items() if v not in ("", {})}
        body["client"] = "diagnoser"
        if client_url:
            body["client_url"] = client_url
        if self.links:
            body["links"] = self.links
        return body


def dedup_key(entry: OutboxEntry) -> str | None:
    """The incident's key in PagerDuty: the same for every event about it, never reused by another."""
    payload = entry.payload
    if entry.incident_id is None or not isinstance(payload, IncidentPayload):
        return None
    return f"diagnoser-{entry.incident_id}-{int(payload.view.opened_at)}"


def render_event(entry: OutboxEntry) -> PagerDutyEvent | None:
    """The event an entry is for PagerDuty (``None``: PagerDuty is not told of it); pure."""
    key = dedup_key(entry)
    payload = entry.payload
    if key is None or not isinstance(payload, IncidentPayload):
        return None
    if entry.kind is NotificationKind.resolved:
        return PagerDutyEvent("resolve", key)
    if entry.kind not in _TRIGGERS:
        return None
    view = payload.view
    lead = view.lead
    where = lead.service or lead.labels.get("namespace", "")
    summary = f"{lead.title}" + (f" ({where})" if where else "")
    details: dict[str, Any] = {
        "summary": lead.summary,
        "cause" if view.has_cause else "symptom": lead.cause,
        "evidence": [e.text for e in lead.evidence[:5]],
        "explains": [f"{f.title}: {f.summary}" for f in view.explained[:10]],
        "recommendation": lead.recommendation,
        "labels": dict(lead.labels),
    }
    if entry.kind is NotificationKind.reopened:
        details["reopened"] = view.reopened
    load = capacity_line(view)
    if load is not None:
        details["capacity"] = load
        if view.capacity is not None and view.capacity.over:  # said first, as in the other receivers
            summary = f"{load}; {summary}"
    links = [{"href": lead.runbook_url, "text": "Runbook"}] if lead.runbook_url else []
    return PagerDutyEvent(
        "trigger",
        key,
        summary=summary,
        severity=_SEVERITY[view.severity],
        component=lead.service,
        group=lead.labels.get("namespace", ""),
        event_class=lead.cause,
        custom_details={k: v for k, v in details.items() if v not in ("", [], {})},
        links=links,
    )


@receiver_type("pagerduty", config=PagerDutyConfig)
class PagerDutyReceiver:
    """Sends :class:`PagerDutyEvent` values to the Events API v2 (see the module docstring)."""

    def __init__(self, config: PagerDutyConfig) -> None:
        self.name = config.name
        self.config = config
        self.channel_id: str | None = None
        self._bucket = TokenBucket(config.messages_per_s, config.message_burst)
        self._poster = GuardedPoster(
            config.events_url, error=PagerDutySendError, what="PagerDuty", timeout_s=config.timeout_s,
            follow_redirects=config.follow_redirects, allowed_addresses=config.allowed_addresses,
        )  # fmt: skip

    @property
    def capabilities(self) -> Capabilities:
        # A resolution and a reopening are new events; PagerDuty folds repeats by dedup_key.
        return Capabilities(without_threads=frozenset({"resolved", "reopened"}))

    @property
    def target(self) -> str:
        return f"PagerDuty events at {redact_url(self.config.events_url)}"

    def render(self, entry: OutboxEntry) -> PagerDutyEvent | None:
        return render_event(entry)

    def render_reply(self, entry: OutboxEntry) -> PagerDutyEvent | None:
        return render_event(entry) if entry.kind is not NotificationKind.new else None

    def plain(self, message: PagerDutyEvent) -> PagerDutyEvent:
        return message

    async def post(
        self, message: PagerDutyEvent, *, thread_ts: str | None = None, marker: str | None = None
    ) -> Delivery:
        body = message.body(
            routing_key=self.config.routing_key.get_secret_value(),
            source=self.config.source,
            client_url=self.config.client_url,
        )
        return await self._send(scrub(body) | {"routing_key": body["routing_key"]})

    async def update(self, message: PagerDutyEvent, *, ts: str, channel: str | None = None) -> Delivery:
        raise PagerDutySendError("a PagerDuty event cannot be edited", permanent=True, error="not_supported")

    async def find_posted(self, marker: str, *, thread_ts: str | None, since: float) -> Delivery | None:
        raise PagerDutySendError(
            "PagerDuty events cannot be read back", permanent=True, error="not_supported"
        )

    async def _send(self, body: dict[str, Any]) -> Delivery:
        await self._bucket.take()
        reply = await self._poster.post(body)
        status, text = reply.status, reply.text
        answer = _json(text)
        if 200 <= status < 300:
            return Delivery(None, str(answer.get("dedup_key") or body["dedup_key"]))
        said = "; ".join(str(e) for e in answer.get("errors", [])) or str(
            answer.get("message") or text.strip()
        )
        raise reply.refusal(PagerDutySendError, f"PagerDuty answered HTTP {status}: {said}".rstrip(": "))


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
