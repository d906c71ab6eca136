"""Alertmanager alerts to diagnoses: which workload an alert is about, and one diagnosis per alert group.

A firing alert's labels, but those that describe the alert itself (:data:`NON_SCOPE_LABELS`), are
its *scope*; a finding belongs to the diagnosis requested by an alert when the labels they share
agree (:func:`finding_in_scope`). :class:`AlertReceiver` is what ``POST /alertmanager`` hands a
payload to: it answers at once and diagnoses in the background, once per ``groupKey`` within
``daemon.alert_group_cooldown_s``, at most ``daemon.alert_concurrency`` at a time, and refuses
(``busy``) beyond ``daemon.alert_backlog`` waiting. When this replica notifies, the report is
queued for Slack in the thread of the incident it concerns: the incident of a finding it holds,
else the open incident about the service the alert names. ::

    scopes = alert_scopes(payload)          # [{"namespace": "shop", "service": "checkout"}]
    outcome, detail = receiver.accept(payload)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from diagnoser.daemon.jobs import JobHost
from diagnoser.daemon.schedule import GuardedRun
from diagnoser.engine.scope import in_label_scope
from diagnoser.models import Diagnosis, Finding, service_of
from diagnoser.notify.outbox import NotificationKind
from diagnoser.notify.payloads import AlertReportPayload

__all__ = ["NON_SCOPE_LABELS", "AlertReceiver", "alert_name", "alert_scopes", "finding_in_scope"]

log = logging.getLogger(__name__)

#: Alert labels that describe the alert rather than what it is about; every other label of a
#: firing alert (namespace, job, service, pod, pool...) narrows the diagnosis.
NON_SCOPE_LABELS = frozenset({"alertname", "severity", "alertstate", "prometheus", "receiver", "priority"})


def alert_scopes(payload: Mapping[str, Any]) -> list[dict[str, str]]:
    """One scope (the alert's labels but :data:`NON_SCOPE_LABELS`) per firing alert, no duplicates."""
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise ValueError("'alerts' must be a list")
    scopes: list[dict[str, str]] = []
    for alert in alerts:
        if not isinstance(alert, dict) or alert.get("status", "firing") != "firing":
            continue
        labels = alert.get("labels") or {}
        if not isinstance(labels, dict):
            raise ValueError("an alert's 'labels' must be an object")
        scope = {str(k): str(v) for k, v in labels.items() if k not in NON_SCOPE_LABELS}
        if scope not in scopes:
            scopes.append(scope)
    return scopes


def finding_in_scope(finding: Finding, scope: Mapping[str, str]) -> bool:
    """True when the finding is about the alert's workload, or about nothing narrower.

    The same rule as ``diagnose now --namespace`` (:func:`diagnoser.engine.scope.in_label_scope`):
    labels the finding and the alert share must agree, on the finding itself or on one of its
    evidence rows; a cluster-wide cause (no scope label at all, e.g. a missing metrics-server)
    can explain any alert and stays in.
    """
    return in_label_scope(finding, {key: (value,) for key, value in scope.items()})


def alert_name(payload: Mapping[str, Any]) -> str:
    """The ``alertname`` the group shares, else its first alert's, else ``"an alert"``."""
    for key in ("commonLabels", "groupLabels"):
        labels = payload.get(key)
        if isinstance(labels, dict) and labels.get("alertname"):
            return str(labels["alertname"])
    alerts = payload.get("alerts") or []
    if alerts and isinstance(alerts[0], dict):
        return str((alerts[0].get("labels") or {}).get("alertname", "an alert"))
    return "an alert"


class AlertHost(JobHost, Protocol):
    """What the receiver needs from the daemon: what the jobs need, and runs that shutdown waits for."""

    def guarded(self, name: str, func: Callable[[], Awaitable[Any]]) -> GuardedRun: ...


class AlertReceiver:
    """Diagnoses for Alertmanager groups, in the background and bounded; see the module docstring."""

    def __init__(self, host: AlertHost) -> None:
        self.host = host
        self.config = host.config
        self._slots = asyncio.Semaphore(self.config.alert_concurrency)
        self._tasks: set[asyncio.Task[Any]] = set()
        #: groupKey -> when its diagnosis was accepted (monotonic), for the cooldown.
        self._groups: dict[str, float] = {}

    def accept(self, payload: Mapping[str, Any]) -> tuple[str, str]:
        """Start a diagnosis for an Alertmanager group in the background, once per cooldown.

        Returns ``(outcome, detail)``: ``accepted``; ``duplicate`` (this ``groupKey`` was
        diagnosed less than ``daemon.alert_group_cooldown_s`` ago: Alertmanager's retries and
        repeats do not multiply posts); ``busy`` (the backlog is full: the HTTP side answers
        503 and Alertmanager retries later).
        """
        key = str(payload.get("groupKey") or json.dumps(alert_scopes(payload), sort_keys=True))
        now = time.monotonic()
        cooldown = self.config.alert_group_cooldown_s
        for old in [k for k, at in self._groups.items() if now - at >= cooldown]:
            del self._groups[old]
        webhooks = self.host.metrics.alert_webhooks
        accepted_at = self._groups.get(key)
        if accepted_at is not None:
            webhooks.labels("duplicate").inc()
            ago = now - accepted_at
            return "duplicate", f"this alert group was diagnosed {ago:.0f}s ago (cooldown {cooldown:g}s)"
        if len(self._tasks) >= self.config.alert_concurrency + self.config.alert_backlog:
            webhooks.labels("busy").inc()
            return "busy", "too many alert diagnoses waiting"
        self._groups[key] = now

        async def alert_diagnosis() -> None:
            try:
                async with self._slots:  # bounded: an alert storm must not multiply queries
                    await self.diagnose_for_alert(payload)
            except BaseException:
                self._groups.pop(key, None)  # failed: the next webhook of the group may try again
                raise

        task = asyncio.create_task(self.host.guarded("alert", alert_diagnosis)())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        webhooks.labels("accepted").inc()
        return "accepted", "diagnosing in the background; the report goes to Slack"

    async def diagnose_for_alert(self, payload: Mapping[str, Any]) -> Diagnosis:
        """A diagnosis restricted to the alerts' workloads; queued for Slack when this replica leads.

        The report goes into the Slack thread of the most important finding it contains that
        already has one (the alert is about that incident), else to the channel.
        """
        scopes = alert_scopes(payload)
        diagnosis = await self.host.diagnose("alertmanager")
        findings: list[Finding] = [
            f for f in diagnosis.findings if not scopes or any(finding_in_scope(f, s) for s in scopes)
        ]
        scoped = diagnosis.model_copy(update={"findings": findings})
        name = alert_name(payload)
        log.info("alert diagnosed", extra={"alert": name, "scopes": scopes, "findings": len(findings)})
        state = self.host.state
        if self.host.notifies and state is not None:
            scope = scopes[0] if len(scopes) == 1 else {}
            held = (state.incident_of(f.identity) for f in findings)
            incident = next((i for i in held if i is not None), None)
            services = {service_of(s) for s in scopes} - {""}
            if incident is None and len(services) == 1:
                incident = state.incident_for_service(str(services.pop()))
            threaded = next((f.identity for f in findings if state.thread_of(f.identity)[1]), None)
            state.enqueue(
                NotificationKind.alert_report,
                AlertReportPayload(diagnosis=scoped, alert=name, scope=scope),
                fingerprint=threaded,
                incident_id=incident,
            )
            self.host.wake_outbox()
        return scoped
