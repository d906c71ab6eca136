"""Labels the daemon saw change between consecutive evaluations, left out of findings' identities.

The engine already drops labels that read as error texts, ephemeral ports, timestamps or
durations (:mod:`diagnoser.stable_labels`). What it cannot recognise, the daemon sees happen: a
finding that vanishes while, in the same evaluation, one of the same rule and cause appears
whose labels agree with it on every label but some that name no subject. That label changes
between scrapes: it is remembered for the rule (in the state file, across restarts), left out of
the rule's findings from then on, and the finding that was there keeps its row and its incident
under the identity without it. No incident is opened for what was a label changing. ::

    drift = LabelDrift(db)
    findings = drift.apply(findings, active)   # active: {fingerprint: finding} before this run

Labels that name a subject (:data:`~diagnoser.stable_labels.SUBJECT_LABELS`) are never learned:
a pool that clears while another fills up in the same cycle are two findings, not one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from sqlite3 import Connection

from diagnoser.models import Finding
from diagnoser.notify.payloads import IncidentView
from diagnoser.stable_labels import SUBJECT_LABELS

__all__ = ["LabelDrift"]

log = logging.getLogger(__name__)

_META_KEY = "volatile_labels"


class LabelDrift:
    """The labels learned as volatile, per rule id, inside the state store's transaction."""

    def __init__(self, db: Connection) -> None:
        self.db = db
        row = db.execute("SELECT value FROM meta WHERE key=?", (_META_KEY,)).fetchone()
        loaded = json.loads(row[0]) if row else {}
        self.learned: dict[str, set[str]] = {rule: set(names) for rule, names in loaded.items()}

    def strip(self, finding: Finding) -> Finding:
        """``finding`` without the labels learned as volatile for its rule."""
        drop = self.learned.get(finding.rule_id)
        if not drop or not drop.intersection(finding.labels):
            return finding
        labels = {k: v for k, v in finding.labels.items() if k not in drop}
        return finding.model_copy(update={"labels": labels})

    def apply(self, findings: Iterable[Finding], active: Mapping[str, Finding]) -> list[Finding]:
        """This run's findings under stable identities; learns from ``active`` (the findings
        before this run, by fingerprint) and moves their rows and incidents to the new identities."""
        current = [self.strip(f) for f in findings]
        present = {f.identity for f in current}
        gone = [f for fp, f in active.items() if fp not in present]
        learned: dict[str, set[str]] = {}
        for finding in (f for f in current if f.identity not in active):
            changed = _changed_labels(finding, gone)
            if changed:
                learned.setdefault(finding.rule_id, set()).update(changed)
        if not learned:
            return current
        for rule, names in learned.items():
            log.info("labels change between evaluations, left out of the identity: %s: %s",
                     rule, ", ".join(sorted(names)))  # fmt: skip
            self.learned.setdefault(rule, set()).update(names)
        self.db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (_META_KEY, json.dumps({rule: sorted(names) for rule, names in self.learned.items()})),
        )
        for fp, finding in active.items():
            if finding.rule_id in learned:
                self._move(fp, self.strip(finding))
        return [self.strip(f) for f in current]

    def _move(self, old: str, finding: Finding) -> None:
        """The row and incidents of ``old`` under ``finding``'s identity (one row when both exist)."""
        new = finding.identity
        if new == old:
            return
        if self.db.execute("SELECT 1 FROM findings WHERE fingerprint=?", (new,)).fetchone():
            self.db.execute("DELETE FROM findings WHERE fingerprint=?", (old,))
        else:
            self.db.execute("UPDATE findings SET fingerprint=? WHERE fingerprint=?", (new, old))
        rows = self.db.execute(
            "SELECT id, members, view FROM incidents WHERE status IN ('pending', 'open', 'resolved')"
            " AND members LIKE ?",
            (f'%"{old}"%',),
        ).fetchall()
        for incident_id, members_json, view_json in rows:
            members = [new if m == old else m for m in json.loads(members_json)]
            view = _restripped(view_json, self)
            self.db.execute(
                "UPDATE incidents SET members=?, view=? WHERE id=?",
                (json.dumps(list(dict.fromkeys(members))), view, incident_id),
            )


def _changed_labels(finding: Finding, gone: Iterable[Finding]) -> set[str]:
    """The labels in which ``finding`` differs from the one finding just gone that agrees with it
    on everything else (rule, cause, label names, every subject label); empty when none does."""
    matches = []
    for other in gone:
        if (other.rule_id, other.cause) != (finding.rule_id, finding.cause):
            continue
        if set(other.labels) != set(finding.labels):
            continue
        differ = {k for k, v in finding.labels.items() if other.labels[k] != v}
        if differ and not differ & SUBJECT_LABELS and len(differ) < len(finding.labels):
            matches.append(differ)
    return matches[0] if len(matches) == 1 else set()


def _restripped(view_json: str, drift: LabelDrift) -> str:
    """An incident's stored view with its findings under their stable identities."""
    try:
        view = IncidentView.model_validate_json(view_json)
    except ValueError:
        return view_json  # a pending incident's placeholder: rebuilt at its next evaluation
    view = view.model_copy(
        update={"lead": drift.strip(view.lead), "explained": [drift.strip(f) for f in view.explained]}
    )
    return view.model_dump_json()
