"""Deciding what to say about incidents, cycle by cycle, inside the state store's transaction.

Each diagnosis is grouped (:func:`~diagnoser.daemon.incidents.group_findings`) and each group
matched to the incident that already holds one of its findings, or to one resolved less than
``reopen_within`` ago (reopened in its thread), or opened anew. Then, per incident:

- **pending** until it has held for ``pending_for`` (a flap shorter than that is never posted);
  when it is due, its first message is queued, or, when more than ``digest_threshold`` are due
  in one cycle, one digest and their messages in its thread;
- **open**: the message is edited (``update``) when its lead (the cause), severity or headline
  number changes materially; a severity change or a new cause also gets a thread reply (a new
  cause at most once per ``reply_min_interval_s``); a reminder after the cooldown;
- **clear**: gone from a diagnosis (and not because a silence keeps it quiet) it is resolved only
  after ``resolve_after`` without it; back before that, nothing is said. An incident led by a cause
  follows the cause: its symptoms lagging do not hold it open (the message says the cause is not
  seen now, the resolution what still recovers, a reply when it has);
- **held**: gone because its rule could not run (its source failed, it threw, the deadline cut it
  short): neither cleared nor resolved, and its thread is told once per outage;
- **pending** counts from the onset (:meth:`IncidentBook._onset`), not the first evaluation;
- a symptom back without its cause reopens the thread saying so, with its own current numbers;
- an incident whose first message was dead-lettered is resolved silently.

Two incidents that one cause now explains are merged into the older one; the other's message
says where it went. ::

    book = IncidentBook(db, policy, now=time.time())
    decisions = book.reconcile(groups, carried=set(), unread={})
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from sqlite3 import Connection

from diagnoser.daemon.capacity_record import CapacityBook
from diagnoser.daemon.incidents import Group, IncidentPolicy, explains, group_findings, service_of
from diagnoser.models import Evidence, Finding
from diagnoser.notify.incident_render import duration_text
from diagnoser.notify.payloads import (
    DigestPayload,
    DigestRow,
    IncidentPayload,
    IncidentView,
    NotificationKind,
    Payload,
)
from diagnoser.notify.slack import number

__all__ = ["Decision", "IncidentBook"]


@dataclass(frozen=True)
class Decision:
    """One notification to queue: about which incident, what kind, what it says."""

    incident_id: int | None
    kind: NotificationKind
    payload: Payload

    @property
    def payload_fingerprint(self) -> str | None:
        """The identity of the incident's lead (what older readers of the outbox thread by)."""
        return self.payload.view.lead.identity if isinstance(self.payload, IncidentPayload) else None


@dataclass
class _Row:
    id: int
    status: str
    members: list[str]
    view: IncidentView
    opened_at: float
    cleared_at: float | None
    resolved_at: float | None
    last_reply_at: float | None
    last_notified: float | None
    landed: int
    last_edit_at: float | None = None
    unread_since: float | None = None

    @classmethod
    def load(cls, row: tuple[object, ...]) -> _Row:
        return cls(
            int(str(row[0])),
            str(row[1]),
            list(json.loads(str(row[2]))),
            IncidentView.model_validate_json(str(row[3])),
            float(str(row[4])),
            _float(row[5]),
            _float(row[6]),
            _float(row[7]),
            _float(row[8]),
            int(str(row[9])),
            _float(row[10]),
            _float(row[11]),
        )


def _float(value: object) -> float | None:
    return None if value is None else float(str(value))


_COLUMNS = (
    "id, status, members, view, opened_at, cleared_at, resolved_at, last_reply_at, last_notified, landed,"
    " last_edit_at, unread_since"
)


class IncidentBook:
    """The incidents table within one transaction; see the module docstring."""

    def __init__(
        self,
        db: Connection,
        policy: IncidentPolicy,
        *,
        now: float,
        notify: bool = True,
        readings: Mapping[str, list[Evidence]] | None = None,
        capacity: CapacityBook | None = None,
    ) -> None:
        self.db = db
        self.policy = policy
        self.now = now
        self.notify = notify
        #: What the evidence of causes no longer found reads now, by the cause's identity.
        self.readings = readings or {}
        #: The capacities on record and the services' load now (each message's headroom line).
        self.capacity = capacity

    def reconcile(
        self, findings: Sequence[Finding], *, carried: set[str], unread: Mapping[str, str] | None = None
    ) -> list[Decision]:
        """What to say about this cycle's ranked ``findings``; ``carried``: identities still there,
        unseen (silenced); ``unread``: identities whose rule could not run, with the error why."""
        unread = unread or {}
        live = self._load("status IN ('pending', 'open') ORDER BY id", ())
        recent = (
            self._load(
                "status='resolved' AND resolved_at >= ? ORDER BY id DESC",
                (self.now - self.policy.reopen_within_s,),
            )
            if self.policy.reopen_within_s > 0
            else []
        )
        seen = {f.identity: f for f in findings}
        # Symptoms still there after their cause's incident resolved stay with it until they recover.
        recovering = self._load("status='resolved' AND json_array_length(view, '$.lagging') > 0", ())
        lagging = {m for row in recovering for m in row.view.lagging}
        decisions = self._recovered(recovering, seen)
        unowned = [f for f in findings if not (f.identity in lagging and not f.leads_as_cause)]
        decisions += self._assign(unowned, live, recent)
        due: list[tuple[_Row, IncidentView]] = []
        gone: list[Decision] = []
        for row in [*live, *(r for r in recent if r.status == "reopening")]:
            present = [seen[m] for m in row.members if m in seen]
            if row.status == "merged":
                continue
            if not present:
                held = [unread[m] for m in row.members if m in unread]
                if held and row.status != "reopening":
                    decisions += self._held(row, held[0])
                elif not carried.intersection(row.members) and row.status != "reopening":
                    gone += self._absent(row)
                continue  # a rule that could not run or a silence: still there, only unseen
            view = self._view(present, row, findings)
            if row.status == "pending":
                if self.now - self._onset(row, present) >= self.policy.pending_for_s:
                    due.append((row, view))
                else:
                    self._save(row, members=row.members, view=view)
            elif row.status == "open" and view.earlier_cause is not None and _cause_went(row):
                gone += self._cause_gone(row, view, present)
            else:
                decisions += self._present(row, view)
        decisions += self._open(due) + gone
        return decisions if self.notify else []

    def _onset(self, row: _Row, present: list[Finding]) -> float:
        """When the incident began: the earliest onset its rules detected (``Finding.since``),
        else the first evaluation that saw it."""
        detected = [f.since.timestamp() for f in present if f.since is not None]
        if any(f.since is None and f.rule_id in self.policy.confirming_rules for f in present):
            detected.append(row.opened_at - self.policy.confirm_s)  # it held over the window to be found
        return min([row.opened_at, *detected])

    def _load(self, where: str, args: tuple[object, ...]) -> list[_Row]:
        return [
            _Row.load(r) for r in self.db.execute(f"SELECT {_COLUMNS} FROM incidents WHERE {where}", args)
        ]

    # --- matching ------------------------------------------------------------------------

    def _assign(self, findings: Sequence[Finding], live: list[_Row], recent: list[_Row]) -> list[Decision]:
        """Give each finding not in a live incident one: a finding stays in its incident while it lives.

        A new cause takes over the lone-symptom incidents it explains (the first leads, the others
        are merged into it); a new finding a live cause explains joins that cause's incident; one
        in an incident resolved within ``reopen_within`` reopens it; the rest open new incidents.
        """
        owner = {m: row for row in live for m in row.members}
        fresh = [f for f in findings if f.identity not in owner]
        present = {f.identity: f for f in findings}
        decisions: list[Decision] = []
        for finding in [f for f in fresh if f.leads_as_cause]:
            lone = [r for r in _alive(live) if _lone(r, present)]
            taken = [r for r in lone if _explaining([finding], r, present)]
            if taken:
                self._join(taken[0], finding.identity, owner)
                for other in taken[1:]:
                    decisions += self._merge(other, into=taken[0], cause=finding, owner=owner)
        # Lone-symptom incidents a live cause explains (the cause came first, the symptom flapped).
        for row in [r for r in _alive(live) if _lone(r, present)]:
            for host in [r for r in _alive(live) if r is not row and _causes(r, present)]:
                cause = _explaining(_causes(host, present), row, present)
                if cause is not None:
                    decisions += self._merge(row, into=host, cause=cause, owner=owner)
                    break
        for finding in [f for f in fresh if f.identity not in owner]:
            for host in [r for r in _alive(live) if _causes(r, present)]:
                if any(explains(c, finding) for c in _causes(host, present)):
                    self._join(host, finding.identity, owner)
                    break
        self._place([f for f in fresh if f.identity not in owner], live, recent, owner)
        return decisions

    def _place(
        self, rest: list[Finding], live: list[_Row], recent: list[_Row], owner: dict[str, _Row]
    ) -> None:
        """Findings no live incident holds: back in one resolved lately (reopened), or a new incident."""
        for group in group_findings(rest):
            back = next(
                (r for r in recent if r.status != "reopening" and group.lead.identity in r.members), None
            )
            row = back or self._insert(group, live)
            if back is not None:
                back.status = "reopening"
            for member in group.identities:
                self._join(row, member, owner)

    @staticmethod
    def _join(row: _Row, identity: str, owner: dict[str, _Row]) -> None:
        if identity not in row.members:
            row.members.append(identity)
        owner[identity] = row

    def _insert(self, group: Group, live: list[_Row]) -> _Row:
        cursor = self.db.execute(
            "INSERT INTO incidents (status, members, view, opened_at, last_seen)"
            " VALUES ('pending', ?, ?, ?, ?)",
            (json.dumps(group.identities), "{}", self.now, self.now),
        )
        view = IncidentView(lead=group.lead, opened_at=self.now)
        row = _Row(int(cursor.lastrowid or 0), "pending", [], view, self.now, None, None, None, None, 0)
        live.append(row)
        return row

    def _merge(self, other: _Row, *, into: _Row, cause: Finding, owner: dict[str, _Row]) -> list[Decision]:
        """``other``'s findings go to ``into``; a posted ``other`` is edited to say where they went."""
        was = other.status
        for member in other.members:
            self._join(into, member, owner)
        self.db.execute("UPDATE incidents SET status='merged' WHERE id=?", (other.id,))
        other.status = "merged"
        if was == "pending" or other.landed < 0:
            return []
        view = other.view.model_copy(update={"state": "merged"})
        note = f"Merged into the incident of {cause.cause}: {cause.title}"
        payload = IncidentPayload(view=view, note=note, merged_into=into.id)
        return [Decision(other.id, NotificationKind.update, payload)]

    def _view(self, present: list[Finding], row: _Row, ranked: Sequence[Finding]) -> IncidentView:
        """The incident as it stands: its most important cause that explains the rest leads."""
        order = {f.identity: i for i, f in enumerate(ranked)}
        members = sorted(present, key=lambda f: order.get(f.identity, 0))
        causes = [f for f in members if f.leads_as_cause]
        lead = next((c for c in causes if any(explains(c, f) for f in members if f is not c)), None)
        earlier = row.view.earlier_cause or (row.view.lead if row.view.has_cause else None)
        # Without a cause, the symptom that led it last keeps leading while it lasts: two symptoms
        # ranked in turn from one run to the next must not rewrite the header every cycle.
        kept = next((f for f in members if f.identity == row.view.lead.identity), members[0])
        if lead is None and not causes and earlier is not None and row.status != "pending":
            # Its cause is gone while symptoms last (or came back without it): the message says
            # what is there now and names the cause only as not seen, until it is confirmed again.
            return self._shown(row, kept, [f for f in members if f is not kept], earlier=earlier)
        lead = lead or (causes[0] if causes else kept)
        return self._shown(row, lead, [f for f in members if f is not lead])

    def _shown(
        self, row: _Row, lead: Finding, explained: list[Finding], *, earlier: Finding | None = None
    ) -> IncidentView:
        return IncidentView(
            lead=lead,
            explained=explained,
            opened_at=row.opened_at,
            resolve_after_s=self.policy.resolve_after_s,
            reopened=row.view.reopened + (1 if row.status == "reopening" else 0),
            earlier_cause=earlier,
            earlier_now=self.readings.get(earlier.identity, []) if earlier is not None else [],
            # A reopening without its cause is about what came back: no clock of a cause runs.
            cause_cleared_at=row.view.cause_cleared_at if earlier and row.status == "open" else None,
            capacity=self.capacity.reading_for([lead, *explained]) if self.capacity is not None else None,
        )

    # --- transitions ---------------------------------------------------------------------

    def _open(self, due: list[tuple[_Row, IncidentView]]) -> list[Decision]:
        digest = len(due) > self.policy.digest_threshold
        decisions: list[Decision] = []
        if digest:
            rows = [_digest_row(view) for _, view in due]
            payload = DigestPayload(rows=rows, incident_ids=[r.id for r, _ in due], opened_at=self.now)
            decisions.append(Decision(None, NotificationKind.digest, payload))
        for row, view in due:
            self._save(row, status="open", members=row.members, view=view, notified=True)
            decisions.append(
                Decision(row.id, NotificationKind.new, IncidentPayload(view=view, in_digest=digest))
            )
        return decisions

    def _present(self, row: _Row, view: IncidentView) -> list[Decision]:
        shown = row.view
        members = row.members
        if row.status == "reopening":
            self._save(
                row, status="open", members=members, view=view, notified=True, replied=True, clear=True
            )
            back = f"Back again within {duration_text(self.policy.reopen_within_s)} of its resolution"
            if view.earlier_cause is not None:
                back += f": {view.lead.cause} is back; {view.earlier_cause.cause} is not seen now"
            return [Decision(row.id, NotificationKind.reopened, IncidentPayload(view=view, note=back))]
        kind, note, previous = self._change(shown, view, row)
        if kind is None:
            cooled = row.last_notified is None or self.now - row.last_notified >= self.policy.cooldown_s
            if cooled:
                self._save(row, members=members, notified=True, clear=True)
                return [
                    Decision(row.id, NotificationKind.repeat, IncidentPayload(view=view, note="Still there"))
                ]
            self._save(row, members=members, clear=True)
            return []
        replied = note is not None
        self._save(row, members=members, view=view, replied=replied, clear=True)
        payload = IncidentPayload(view=view, note=note, previous_severity=previous)
        return [Decision(row.id, kind, payload)]

    def _change(
        self, shown: IncidentView, view: IncidentView, row: _Row
    ) -> tuple[NotificationKind | None, str | None, str | None]:
        """What changed materially since the message was last written: kind, reply, old severity."""
        if shown.severity is not view.severity:
            change = f"Severity {shown.severity.value} → {view.severity.value}"
            return NotificationKind.severity_changed, change, shown.severity.value
        can_reply = (
            row.last_reply_at is None or self.now - row.last_reply_at >= self.policy.reply_min_interval_s
        )
        if shown.lead.identity != view.lead.identity:
            # A cause found (or another one leading) is said in the thread; a cause gone while its
            # symptoms last is an edit only: the resolution will say when it is over.
            found = view.has_cause and not shown.has_cause
            line = f"{'Cause found' if found else 'Now led by'}: {view.lead.cause}: {view.lead.title}"
            said = line if can_reply and view.has_cause else None
            return NotificationKind.cause_changed, said, None
        if {f.identity for f in shown.explained} != {f.identity for f in view.explained}:
            return NotificationKind.update, None, None
        before, after = shown.headline, view.headline
        # A number that moves is edited in, at most as often as a reply may be posted.
        edited_lately = (
            row.last_edit_at is not None and self.now - row.last_edit_at < self.policy.reply_min_interval_s
        )
        if (
            before is not None
            and after is not None
            and not edited_lately
            and abs(after - before) > self.policy.material_change * max(abs(before), 1e-9)
        ):
            return NotificationKind.update, None, None
        return None, None, None

    def _held(self, row: _Row, why: str) -> list[Decision]:
        """Its rules could not run: neither cleared nor resolved; its thread is told once."""
        if row.status != "open" or row.unread_since is not None or row.landed < 0:
            return []
        self.db.execute("UPDATE incidents SET unread_since=? WHERE id=?", (self.now, row.id))
        row.unread_since = self.now
        note = f"The evidence could not be read ({why}): held open, not resolved, until it can be"
        return [Decision(row.id, NotificationKind.repeat, IncidentPayload(view=row.view, note=note))]

    def _absent(self, row: _Row, lagging: Sequence[Finding] = ()) -> list[Decision]:
        """Its findings gone (or, ``lagging``, only its cause's symptoms left): resolved once clear
        for ``resolve_after``."""
        if row.status == "pending":  # never held long enough to be told: forgotten
            self.db.execute("DELETE FROM incidents WHERE id=?", (row.id,))
            return []
        cleared_at = row.cleared_at if row.cleared_at is not None else self.now
        if self.now - cleared_at < self.policy.resolve_after_s:
            self.db.execute("UPDATE incidents SET cleared_at=? WHERE id=?", (cleared_at, row.id))
            return []
        view = row.view
        if view.earlier_cause is not None:  # told under its cause, with the symptoms left
            view = view.model_copy(update={"lead": view.earlier_cause, "earlier_cause": None,
                                           "explained": [view.lead, *view.explained]})  # fmt: skip
        view = view.model_copy(
            update={
                "state": "resolved",
                "resolved_at": self.now,
                "resolve_after_s": self.policy.resolve_after_s,
                "lagging": [f.identity for f in lagging],
                "cause_cleared_at": cleared_at if lagging else None,
                "explained": [f for f in view.explained if f.identity in {g.identity for g in lagging}]
                if lagging else view.explained,
            }
        )
        self.db.execute(
            "UPDATE incidents SET status='resolved', resolved_at=?, cleared_at=?, last_notified=?, view=?"
            " WHERE id=?",
            (self.now, cleared_at, self.now, view.model_dump_json(), row.id),
        )
        if row.landed < 0:  # its first message never reached the channel: no resolution either
            return []
        note = "Resolved"
        if lagging:
            note += ": its cause cleared " + duration_text(self.now - cleared_at) + " ago; still recovering: "
            note += ", ".join(dict.fromkeys(f.cause for f in lagging))
        return [Decision(row.id, NotificationKind.resolved, IncidentPayload(view=view, note=note))]

    def _cause_gone(self, row: _Row, view: IncidentView, present: list[Finding]) -> list[Decision]:
        """Its cause no longer holds while symptoms last: the resolution follows the cause; the
        message is edited once to say the cause is not seen now."""
        decisions = self._absent(row, lagging=present)
        if decisions or row.landed < 0:
            return decisions
        if row.view.earlier_cause is None:  # the first cycle without it: edit the message
            cleared = view.model_copy(update={"cause_cleared_at": self.now})
            self.db.execute("UPDATE incidents SET view=?, last_edit_at=? WHERE id=?",
                            (cleared.model_dump_json(), self.now, row.id))  # fmt: skip
            return [Decision(row.id, NotificationKind.update, IncidentPayload(view=cleared))]
        return []

    def _recovered(self, rows: list[_Row], seen: dict[str, Finding]) -> list[Decision]:
        """Resolved incidents whose lagging symptoms have all cleared now: how long they took."""
        decisions: list[Decision] = []
        for row in rows:
            still = [m for m in row.view.lagging if m in seen]
            if still == row.view.lagging:
                continue
            view = row.view.model_copy(update={"lagging": still})
            self.db.execute("UPDATE incidents SET view=? WHERE id=?", (view.model_dump_json(), row.id))
            if still or row.landed < 0:
                continue
            took = self.now - (row.view.cause_cleared_at or row.resolved_at or self.now)
            note = f"Symptoms recovered {duration_text(took)} after the cause cleared"
            decisions.append(Decision(row.id, NotificationKind.repeat, IncidentPayload(view=view, note=note)))
        return decisions

    def _save(
        self,
        row: _Row,
        *,
        status: str | None = None,
        members: list[str],
        view: IncidentView | None = None,
        notified: bool = False,
        replied: bool = False,
        clear: bool = False,
    ) -> None:
        row.status = status or row.status
        self.db.execute(
            "UPDATE incidents SET status=?, members=?, view=COALESCE(?, view), last_seen=?,"
            " last_edit_at=CASE WHEN ? THEN ? ELSE last_edit_at END,"
            " last_notified=CASE WHEN ? THEN ? ELSE last_notified END,"
            " last_reply_at=CASE WHEN ? THEN ? ELSE last_reply_at END,"
            " cleared_at=CASE WHEN ? THEN NULL ELSE cleared_at END,"
            " unread_since=CASE WHEN ? THEN NULL ELSE unread_since END,"
            " resolved_at=CASE WHEN ?='open' THEN NULL ELSE resolved_at END WHERE id=?",
            (
                row.status,
                json.dumps(members),
                view.model_dump_json() if view else None,
                self.now,
                view is not None,
                self.now,
                notified,
                self.now,
                replied,
                self.now,
                clear,
                clear,
                row.status,
                row.id,
            ),
        )


def _cause_went(row: _Row) -> bool:
    """The cause led the incident as last told and is gone now, or went earlier in this episode
    (its symptoms lag): the resolution follows it."""
    return row.view.has_cause or row.view.cause_cleared_at is not None


def _alive(rows: list[_Row]) -> list[_Row]:
    return [r for r in rows if r.status != "merged"]


def _lone(row: _Row, present: dict[str, Finding]) -> bool:
    """A symptom's incident that no cause has explained yet (one whose cause is gone is not)."""
    return not row.view.has_cause and row.view.earlier_cause is None and not _causes(row, present)


def _causes(row: _Row, present: dict[str, Finding]) -> list[Finding]:
    """The causes among ``row``'s findings present in this cycle."""
    return [present[m] for m in row.members if m in present and present[m].leads_as_cause]


def _explaining(causes: list[Finding], row: _Row, present: dict[str, Finding]) -> Finding | None:
    """The first of ``causes`` that explains a finding of ``row`` present in this cycle."""
    shown = [present[m] for m in row.members if m in present]
    return next((c for c in causes if any(explains(c, f) for f in shown)), None)


def _digest_row(view: IncidentView) -> DigestRow:
    namespace, service = service_of(view.lead)
    headline = view.lead.evidence[0] if view.lead.evidence else None
    return DigestRow(
        service="/".join(p for p in (namespace, service) if p) or "-",
        cause=view.lead.cause,
        severity=view.severity,
        title=view.lead.title,
        headline=headline.line() if headline is not None else number(None),
        runbook_url=view.lead.runbook_url,
    )
