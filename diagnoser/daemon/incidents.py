"""Findings grouped into incidents: a cause and what it explains in its scope, or a symptom alone.

A rule's ``explains`` lists the symptoms (and secondary causes) its cause explains; a finding
explains another in the same *scope*: the same service (namespace and ``service`` or ``job``
label), or either is about no service at all (a node, a cluster-wide dependency, the probe's own
target), or the other's service is one the cause's evidence names as its client
(``client_service``: a database, pool or proxy serving it). A target that is down
(``target_unreachable``) is its own cause (:data:`~diagnoser.models.SELF_EXPLAINED`). Findings
come ranked (causes that explain an active symptom first), so the most important cause leads its
incident and the symptoms it explains are folded in; a symptom nothing
explains leads an incident of its own ("no cause found yet") until a cause appears. ::

    for group in group_findings(diagnosis.findings):
        print(group.lead.cause, [f.cause for f in group.explained])

:class:`IncidentPolicy` holds the timing the daemon applies to incidents, in Alertmanager's and
Prometheus' terms: ``pending_for`` (``group_wait`` / ``for``), ``resolve_after``
(``keep_firing_for``), ``reopen_within``, the digest threshold and the reply rate.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from diagnoser.config import Settings
from diagnoser.models import Finding
from diagnoser.promql.duration import duration_seconds
from diagnoser.ruleset import Rule, RuleSet

__all__ = [
    "Group",
    "IncidentPolicy",
    "confirms_over_window",
    "explains",
    "group_findings",
    "same_scope",
    "served_services",
    "service_of",
]

#: Evidence labels that name a service a finding's subject serves (a server's clients).
_CLIENT_LABELS = ("client_service", "client_job")


def served_services(finding: Finding) -> set[str]:
    """Services the finding's evidence names as served by its subject (a database's, a pool's or
    a proxy's clients: ``client_service``), besides its own."""
    own = finding.service
    return {
        row.labels[key]
        for row in finding.evidence
        for key in _CLIENT_LABELS
        if row.labels.get(key) and row.labels[key] != own
    }


def explains(cause: Finding, other: Finding) -> bool:
    """Whether ``cause`` explains ``other``: one of its explained causes, in its scope or in a
    service its evidence names as served by it."""
    if cause is other or not cause.leads_as_cause or other.cause not in cause.explained_causes:
        return False
    return same_scope(cause, other) or other.service in served_services(cause)


@dataclass(frozen=True)
class IncidentPolicy:
    """How incidents are told; zero everywhere: every change at once (what tests of one step use)."""

    #: Seconds an incident must hold before its first message (``group_wait``, ``for``).
    pending_for_s: float = 0.0
    #: Seconds it must stay clear before it is resolved (``keep_firing_for``).
    resolve_after_s: float = 0.0
    #: An incident back within this many seconds of its resolution reopens its thread.
    reopen_within_s: float = 0.0
    #: More incidents than this opening in one cycle are posted as one digest.
    digest_threshold: int = 5
    #: At most one thread reply per incident within this (severity changes and resolutions excepted).
    reply_min_interval_s: float = 0.0
    #: A reminder in the thread of an incident still there after this.
    cooldown_s: float = 3600.0
    #: The headline number changed by at least this share: the message is edited.
    material_change: float = 0.25
    #: Rules whose conditions confirm over the confirmation window: a finding of theirs has held
    #: for it by the time it is found, so its onset (when it tells none) is taken that long before.
    confirming_rules: frozenset[str] = frozenset()
    confirm_s: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings, rules: RuleSet | None = None) -> IncidentPolicy:
        """The daemon's policy, its defaults resolved: ``pending_for`` one confirmation window
        (counted from the onset), ``resolve_after`` two diagnosis intervals or half a confirmation
        window, the longer (counted from the cause's clearing)."""
        daemon = settings.daemon
        confirm_s = duration_seconds(settings.effective_confirm_window)
        pending = daemon.pending_for_s if daemon.pending_for_s is not None else confirm_s
        resolve = daemon.resolve_after_s
        if resolve is None:
            # A rule that confirms over the window clears only once a good part of it is healthy:
            # what is added here keeps a missed diagnosis or a short flap from resolving it; a
            # return after that reopens its thread (reopen_within), it is never a new post.
            resolve = max(2 * daemon.diagnose_interval_s, confirm_s / 2)
        return cls(
            pending_for_s=pending,
            resolve_after_s=resolve,
            reopen_within_s=daemon.reopen_within_s,
            digest_threshold=daemon.digest_threshold,
            reply_min_interval_s=daemon.reply_min_interval_s,
            cooldown_s=daemon.cooldown_s,
            confirming_rules=frozenset(r.id for r in (rules or ()) if confirms_over_window(r)),
            confirm_s=confirm_s,
        )


def confirms_over_window(rule: Rule) -> bool:
    """Whether one of the rule's conditions reads ``${confirm_window}`` (it holds over that range)."""
    return any("${confirm_window}" in json.dumps(c.raw_params, default=str) for c in rule.when)


@dataclass
class Group:
    """The findings of one incident in one diagnosis."""

    lead: Finding
    explained: list[Finding] = field(default_factory=list)

    @property
    def members(self) -> list[Finding]:
        return [self.lead, *self.explained]

    @property
    def identities(self) -> list[str]:
        return [f.identity for f in self.members]


def service_of(finding: Finding) -> tuple[str, str]:
    """``(namespace, service)`` of a finding, from its labels (``job`` when there is no ``service``)."""
    return finding.labels.get("namespace", ""), finding.service


def same_scope(a: Finding, b: Finding) -> bool:
    """True when ``a`` can explain ``b``: the same service, or one of them about no service."""
    sa, sb = service_of(a), service_of(b)
    if sa == ("", "") or sb == ("", ""):
        return True
    if not sa[1] or not sb[1]:  # one names only a namespace: the namespaces must agree
        return sa[0] == sb[0] or not sa[0] or not sb[0]
    return sa[1] == sb[1] and (sa[0] == sb[0] or not sa[0] or not sb[0])


def group_findings(findings: Iterable[Finding]) -> list[Group]:
    """The incidents of ranked ``findings``: each cause with what it explains; lone symptoms alone."""
    ranked = list(findings)
    taken: set[int] = set()
    groups: list[Group] = []
    for i, cause in enumerate(ranked):
        if i in taken or not cause.leads_as_cause or not _explains_any(cause, ranked, taken, i):
            continue
        taken.add(i)
        group = Group(cause)
        for j, other in enumerate(ranked):
            if j not in taken and explains(cause, other):
                taken.add(j)
                group.explained.append(other)
        groups.append(group)
    # Causes explaining nothing present and symptoms nothing explains: one incident each.
    groups += [Group(f) for i, f in enumerate(ranked) if i not in taken]
    return groups


def _explains_any(cause: Finding, ranked: list[Finding], taken: set[int], at: int) -> bool:
    return any(j != at and j not in taken and explains(cause, other) for j, other in enumerate(ranked))
