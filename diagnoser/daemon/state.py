"""The daemon's memory: which findings are active, what was notified, and what still must be sent.

One SQLite file (a PersistentVolume in the cluster) holds:

- ``findings``: one row per fingerprint (:attr:`~diagnoser.models.Finding.identity`: rule id,
  cause and the finding's identifying labels), with its severity and when it was first and last
  seen: what ``GET /findings`` lists;
- ``capacity_runs``: every ``diagnose capacity`` run recorded here, the newest per target that
  found one being its capacity on record (:mod:`~diagnoser.daemon.capacity_record`);
- ``incidents``: a cause and the findings it explains, or a symptom alone
  (:mod:`~diagnoser.daemon.reconcile` decides about them), with the Slack message that
  shows each (to edit) and the thread its replies go in;
- ``outbox``: notifications not yet delivered, in the order they were decided; ``dead_letters``:
  the ones the channel refused, tried again on a slow schedule. With several receivers
  (``notify.receivers``) each notification is one row per receiver whose ``match`` takes it,
  delivered and retried on its own; where the first receiver's messages are is kept on the
  incident (as before receivers), the others' in ``receiver_posts``.

:meth:`StateStore.reconcile` compares a diagnosis with the active findings and incidents and, in
one transaction, updates them and appends to the outbox: an incident is posted once it has held
for ``pending_for``, edited when it changes materially, reminded after the cooldown, resolved
once clear for ``resolve_after``, reopened in its thread when it returns soon after. Deciding
and queueing in one transaction is what makes a restart neither
re-send nor forget: the sender takes entries from the head of the outbox and deletes each only
once Slack accepted it. ::

    store = StateStore(Path("state.sqlite3"))
    queued = store.reconcile(diagnosis, cooldown_s=3600)
    for entry in store.pending():
        store.begin_attempt(entry.id, marker="dgn-...")   # written before the post: a crash
        ts = send(entry)                                  # mid-post leaves it "in doubt"
        store.mark_sent(entry.id, ts=ts)

Failures of the file itself are :class:`~diagnoser.errors.StateError` with a ``reason``
(:mod:`~diagnoser.daemon.state_file`: refused at start when it cannot be opened or written, set
aside when corrupted); a full disk fails the one transaction, which SQLite has already rolled
back, and the next one succeeds once there is space again (nothing half-written, nothing decided
twice).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from sqlite3 import Connection
from typing import Any, Protocol

from diagnoser.config.receivers import Match, Route
from diagnoser.daemon.capacity_record import CapacityBook, CapacityRun
from diagnoser.daemon.incidents import IncidentPolicy
from diagnoser.daemon.reconcile import IncidentBook
from diagnoser.daemon.state_file import StateFile
from diagnoser.daemon.state_upgrade import adopt_older_rows
from diagnoser.daemon.volatile import LabelDrift
from diagnoser.models import Diagnosis, Evidence, Finding, Severity, service_of
from diagnoser.notify.outbox import IncidentThread, NotificationKind, OutboxEntry
from diagnoser.notify.payloads import (
    AlertReportPayload,
    DigestPayload,
    FindingPayload,
    IncidentPayload,
    IncidentView,
    Payload,
    dump_payload,
)

__all__ = ["ReceiverOutbox", "StateStore", "fingerprint"]


class _Identified(Protocol):
    @property
    def identity(self) -> str: ...


def fingerprint(finding: _Identified) -> str:
    """A finding's stable identity (defined once, on the model: :attr:`Finding.identity`)."""
    return finding.identity


def _finding_json(finding: Finding) -> dict[str, Any]:
    data = finding.model_dump(mode="json")
    data["explains"] = list(finding.explains)
    return data


#: Dead letters refused for reasons a retry cannot fix: a payload that does not render, a layout.
_NOT_RETRIED = ("render", "invalid_blocks", "invalid_blocks_format", "msg_too_long", "invalid_payload")


class StateStore:
    """Finding state and the notification outbox in one SQLite file; safe across restarts.

    Every method is a short transaction on a local file (well under a millisecond), so the daemon
    calls them from the event loop directly.
    """

    def __init__(self, path: Path, *, routes: Sequence[Route] = ()) -> None:
        self.path = path
        self._file = StateFile(path)
        self._db: Connection = self._file.db
        #: The receivers notifications are queued for; none: one row per notification, for
        #: whichever sender the daemon has.
        self.routes = tuple(routes)
        self._primary = self.routes[0].name if self.routes else None
        if self._file.upgraded:
            with self._write("take over an older release's rows") as db:
                adopt_older_rows(db)

    def _is_primary(self, receiver: str | None) -> bool:
        """The first receiver keeps its positions on the incident (where an older file has them)."""
        return receiver is None or receiver == self._primary

    def outbox_for(self, receiver: str) -> ReceiverOutbox:
        """The outbox of one receiver: what its delivery reads and writes."""
        return ReceiverOutbox(self, receiver)

    @property
    def set_aside(self) -> Path | None:
        """Where a corrupted file was moved when this store started afresh, else ``None``."""
        return self._file.set_aside

    def _write(self, what: str) -> AbstractContextManager[Connection]:
        return self._file.write(what)

    def _reading(self, what: str) -> AbstractContextManager[Connection]:
        return self._file.reading(what)

    def close(self) -> None:
        """Checkpoint the write-ahead log into the main file and close."""
        self._file.close()

    # --- deciding ----------------------------------------------------------------------------

    def reconcile(
        self,
        diagnosis: Diagnosis,
        *,
        cooldown_s: float,
        min_severity: Severity = Severity.warning,
        notify: bool = True,
        now: float | None = None,
        silenced: Iterable[str] = (),
        policy: IncidentPolicy | None = None,
        readings: Mapping[str, list[Evidence]] | None = None,
        capacity: CapacityBook | None = None,
    ) -> list[OutboxEntry]:
        """Update the active findings and incidents from ``diagnosis``; queue what must be said.

        ``notify=False`` (a replica that is not the leader) keeps the state in step without
        queueing anything, as if it had notified, so that it does not repeat the leader's
        messages once it takes over.
        A finding whose rule could not run in this run (its source failed, it threw, the
        deadline cut it short), or whose evidence came from a source that failed, is not
        resolved: its absence says nothing about it; its incident is held, and its thread told
        once that the evidence could not be read. Nor is one a silence keeps out of this run
        (``silenced``: fingerprints): it is still there, only quiet. ``policy``: the incidents'
        timing (default: none, every change said at once, with this ``cooldown_s``).
        ``readings``: what the evidence of causes no longer found reads now, by their identity
        (:func:`~diagnoser.daemon.readings.current_readings`), told where they are not seen now.
        ``capacity``: the capacities on record and the load now, for each message's headroom line.
        """
        now = time.time() if now is None else now
        policy = policy or IncidentPolicy(cooldown_s=cooldown_s)
        failed_sources = {error.source for error in diagnosis.errors}
        not_run = diagnosis.rules_not_run
        seen: dict[str, Finding] = {}
        for finding in diagnosis.findings:
            if finding.severity.rank >= min_severity.rank:
                seen.setdefault(finding.identity, finding)  # the first of duplicates counts
        with self._write("record the diagnosis"):
            active = self._active()
            # A label seen changing between evaluations is no part of an identity (an error text).
            drift = LabelDrift(self._db)
            before = {fp: Finding.model_validate_json(stored) for fp, stored in active.items()}
            stable = drift.apply(seen.values(), before)
            if len(stable) != len(seen) or any(f.identity not in seen for f in stable):
                seen = {}
                for finding in stable:
                    seen.setdefault(finding.identity, finding)
                active = self._active()
            for fp, finding in seen.items():
                self._record_present(fp, finding, fp in active, now=now)
            carried = set(silenced)
            unread: dict[str, str] = {}
            for fp, stored in active.items():
                if fp not in seen and fp not in carried:
                    gone = Finding.model_validate_json(stored)
                    failed = failed_sources.intersection(e.source for e in gone.evidence)
                    if gone.rule_id in not_run or failed:
                        # Its rule could not run, or its evidence could not be read: no news.
                        unread[fp] = not_run.get(gone.rule_id) or _first_error(diagnosis, failed)
                    else:
                        self._db.execute("UPDATE findings SET status='resolved' WHERE fingerprint=?", (fp,))
            book = IncidentBook(
                self._db, policy, now=now, notify=notify, readings=readings, capacity=capacity
            )
            decisions = book.reconcile(list(seen.values()), carried=carried, unread=unread)
            entries = [
                entry
                for d in decisions
                for entry in self._enqueue(d.payload_fingerprint, d.kind, d.payload, now, d.incident_id)
            ]
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('last_diagnosis_at', ?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(now),),
            )
        return entries

    def _active(self) -> dict[str, str]:
        """The active findings' stored JSON by fingerprint."""
        return {
            row[0]: row[1]
            for row in self._db.execute("SELECT fingerprint, finding FROM findings WHERE status='active'")
        }

    def _record_present(self, fp: str, finding: Finding, known: bool, *, now: float) -> None:
        """Insert or update a finding present in this run."""
        body = json.dumps(_finding_json(finding))
        if not known:
            self._db.execute(
                "INSERT INTO findings (fingerprint, rule_id, cause, severity, status, finding,"
                " first_seen, last_seen, last_notified) VALUES (?,?,?,?,'active',?,?,?,?)"
                " ON CONFLICT(fingerprint) DO UPDATE SET severity=excluded.severity,"
                " status='active', finding=excluded.finding, first_seen=excluded.first_seen,"
                " last_seen=excluded.last_seen",
                (fp, finding.rule_id, finding.cause, finding.severity.value, body, now, now, now),
            )
            return
        self._db.execute(
            "UPDATE findings SET severity=?, finding=?, last_seen=? WHERE fingerprint=?",
            (finding.severity.value, body, now, fp),
        )

    def enqueue(
        self, kind: NotificationKind, payload: Payload, fingerprint: str | None = None,
        *, incident_id: int | None = None,
    ) -> list[OutboxEntry]:
        """Queue a notification that is not an incident's transition (an Alertmanager report):
        one entry per receiver it is for."""
        with self._write("queue a notification"):
            return self._enqueue(fingerprint, kind, payload, time.time(), incident_id)

    def _enqueue(
        self, fp: str | None, kind: NotificationKind, payload: Payload, now: float,
        incident_id: int | None = None,
    ) -> list[OutboxEntry]:
        raw = dump_payload(payload)
        receivers: list[str | None] = (
            [route.name for route in self.routes if _accepts(route.match, payload)] if self.routes else [None]
        )
        entries = []
        for receiver in receivers:
            cursor = self._db.execute(
                "INSERT INTO outbox (fingerprint, kind, payload, created_at, incident_id, receiver)"
                " VALUES (?,?,?,?,?,?)",
                (fp, kind.value, raw, now, incident_id, receiver),
            )
            entry_id = int(cursor.lastrowid or 0)
            entries.append(
                OutboxEntry(
                    entry_id, fp, kind, json.loads(raw), now, 0, incident_id=incident_id, receiver=receiver
                )
            )
        return entries

    # --- delivering --------------------------------------------------------------------------

    _ENTRY_COLUMNS = (
        "id, fingerprint, kind, payload, created_at, attempts, marker, next_attempt_at,"
        " attempt_started_at, last_error, incident_id, receiver"
    )

    def _receiver_rows(self, receiver: str | None) -> tuple[str, tuple[object, ...]]:
        """The WHERE clause of one receiver's rows (the first receiver's include the unnamed)."""
        if receiver is None:
            return "1", ()
        if self._is_primary(receiver):
            return "(receiver=? OR receiver IS NULL)", (receiver,)
        return "receiver=?", (receiver,)

    def pending(self, limit: int = 100, *, receiver: str | None = None) -> list[OutboxEntry]:
        """Queued notifications, oldest first (``receiver``: only that receiver's)."""
        where, args = self._receiver_rows(receiver)
        with self._reading("read the outbox") as db:
            rows = db.execute(
                f"SELECT {self._ENTRY_COLUMNS} FROM outbox WHERE {where} ORDER BY id LIMIT ?", (*args, limit)
            ).fetchall()
        return [
            OutboxEntry(
                int(r[0]), r[1], NotificationKind(r[2]), json.loads(r[3]), float(r[4]), int(r[5]),
                r[6], float(r[7] or 0), None if r[8] is None else float(r[8]), r[9],
                None if r[10] is None else int(r[10]), r[11],
            )
            for r in rows
        ]

    def pending_count(self) -> int:
        with self._reading("count the outbox") as db:
            return int(db.execute("SELECT count(*) FROM outbox").fetchone()[0])

    def begin_attempt(self, entry_id: int, *, marker: str, now: float | None = None) -> None:
        """Record, before posting, that a post of this entry (carrying ``marker``) is under way."""
        now = time.time() if now is None else now
        with self._write("record a delivery attempt") as db:
            db.execute(
                "UPDATE outbox SET marker=COALESCE(marker, ?), attempt_started_at=?, attempts=attempts+1"
                " WHERE id=?",
                (marker, now, entry_id),
            )

    def attempt_failed(
        self, entry_id: int, error: str, *, retry_at: float, in_doubt: bool, count_attempt: bool = False
    ) -> None:
        """Keep the entry for another try at ``retry_at``; ``in_doubt`` when it may have been posted.

        ``count_attempt``: this failure (a look at the channel that failed) counts as an attempt,
        so the backoff keeps growing while Slack stays unreachable.
        """
        with self._write("record a failed delivery") as db:
            db.execute(
                "UPDATE outbox SET last_error=?, next_attempt_at=?, attempts=attempts+?,"
                " attempt_started_at=CASE WHEN ? THEN attempt_started_at ELSE NULL END WHERE id=?",
                (error[:500], retry_at, 1 if count_attempt else 0, in_doubt, entry_id),
            )

    def reset_backoff(self, *, except_id: int, receiver: str | None = None) -> None:
        """The channel took a message: the others wait no longer for the outage that is over
        (``receiver``: only that receiver's, another one's outage may not be over)."""
        where, args = self._receiver_rows(receiver)
        with self._write("reset the backoff") as db:
            db.execute(
                "UPDATE outbox SET next_attempt_at=0, attempts=0 WHERE id!=? AND next_attempt_at>0"
                f" AND attempt_started_at IS NULL AND {where}",
                (except_id, *args),
            )

    def dead_letter(self, entry_id: int, error: str, *, reason: str = "", now: float | None = None) -> None:
        """Move an entry the channel refused out of the queue into ``dead_letters`` (retried slowly).

        An incident whose first message is dead-lettered is marked so: its resolution is never
        posted, and its other messages wait with it.
        """
        now = time.time() if now is None else now
        with self._write("dead-letter a notification") as db:
            db.execute(
                "INSERT OR REPLACE INTO dead_letters (id, fingerprint, kind, payload, created_at, attempts,"
                " error, dead_at, incident_id, marker, reason, retries, receiver) SELECT id, fingerprint,"
                " kind, payload, created_at, attempts, ?, ?, incident_id, marker, ?, retries, receiver"
                " FROM outbox WHERE id=?",
                (error[:500], now, reason, entry_id),
            )
            row = db.execute(
                "SELECT kind, incident_id, receiver FROM outbox WHERE id=?", (entry_id,)
            ).fetchone()
            if row is not None and row[0] == NotificationKind.new.value and row[1] is not None:
                self._set_position(int(row[1]), row[2], landed=-1)
            db.execute("DELETE FROM outbox WHERE id=?", (entry_id,))

    def dead_letters(self) -> list[tuple[int, str, str]]:
        """``(id, kind, error)`` of every dead-lettered notification, oldest first."""
        with self._reading("read the dead letters") as db:
            rows = db.execute("SELECT id, kind, error FROM dead_letters ORDER BY id").fetchall()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def retry_dead_letters(
        self, *, older_than_s: float = 0.0, max_retries: int | None = None, now: float | None = None,
        receiver: str | None = None,
    ) -> int:
        """Put dead letters back in the queue, in their place (their own ids); how many.

        Those dead for ``older_than_s`` at least and retried fewer than ``max_retries`` times
        (``None``: any; a replay); never one whose payload cannot render or whose layout Slack
        refused. Its incident's first message counts as not landed again until it is sent.
        """
        now = time.time() if now is None else now
        placeholders = ",".join("?" * len(_NOT_RETRIED))
        where, args = self._receiver_rows(receiver)
        with self._write("retry the dead letters") as db:
            rows = db.execute(
                f"SELECT id, kind, incident_id, receiver FROM dead_letters WHERE dead_at<=? AND retries<?"
                f" AND COALESCE(reason, '') NOT IN ({placeholders}) AND {where} ORDER BY id",
                (now - older_than_s, 10**9 if max_retries is None else max_retries, *_NOT_RETRIED, *args),
            ).fetchall()
            for entry_id, kind, incident_id, owner in rows:
                db.execute(
                    "INSERT INTO outbox (id, fingerprint, kind, payload, created_at, attempts, marker,"
                    " incident_id, retries, last_error, receiver) SELECT id, fingerprint, kind, payload,"
                    " created_at, 0, marker, incident_id, retries+1, error, receiver FROM dead_letters"
                    " WHERE id=?",
                    (entry_id,),
                )
                if kind == NotificationKind.new.value and incident_id is not None:
                    self._set_position(int(incident_id), owner, landed=0, only_if_landed=-1)
                db.execute("DELETE FROM dead_letters WHERE id=?", (entry_id,))
        ids = [int(r[0]) for r in rows]
        return len(ids)

    def mark_sent(
        self, entry_id: int, *, channel: str | None = None, ts: str | None = None, starts_thread: bool = False
    ) -> None:
        """Drop a delivered entry; remember where its incident's message and thread are.

        ``starts_thread``: this message (a reply reposted at top level because its thread was
        gone) is where the incident's later messages now go.
        """
        with self._write("record a delivery") as db:
            row = db.execute(
                "SELECT fingerprint, kind, incident_id, payload, receiver FROM outbox WHERE id=?", (entry_id,)
            ).fetchone()
            db.execute("DELETE FROM outbox WHERE id=?", (entry_id,))
            if row is None:
                return
            fp, kind, incident, raw, receiver = row
            if not self._is_primary(receiver):
                self._record_other(
                    receiver, kind, incident, raw, channel=channel, ts=ts, starts_thread=starts_thread
                )
                return
            if kind == NotificationKind.digest.value and ts:
                for member in DigestPayload.model_validate_json(raw).incident_ids:
                    db.execute(
                        "UPDATE incidents SET channel=?, thread_ts=? WHERE id=?", (channel, ts, member)
                    )
            elif incident is not None and kind == NotificationKind.new.value:
                db.execute(
                    "UPDATE incidents SET landed=1, channel=COALESCE(?, channel), message_ts=?,"
                    " thread_ts=COALESCE(thread_ts, ?) WHERE id=?",
                    (channel, ts, ts, incident),
                )
            elif incident is not None and starts_thread and ts:
                db.execute("UPDATE incidents SET channel=?, thread_ts=? WHERE id=?", (channel, ts, incident))
            if fp and ts and (starts_thread or kind == NotificationKind.new.value):
                db.execute(
                    "UPDATE findings SET slack_channel=?, slack_ts=? WHERE fingerprint=?", (channel, ts, fp)
                )

    def _record_other(
        self, receiver: str, kind: str, incident: int | None, raw: str, *,
        channel: str | None, ts: str | None, starts_thread: bool,
    ) -> None:
        """Where a receiver other than the first put an incident's message (``receiver_posts``)."""
        if kind == NotificationKind.digest.value and ts:
            for member in DigestPayload.model_validate_json(raw).incident_ids:
                self._set_position(member, receiver, channel=channel, thread_ts=ts)
        elif incident is not None and kind == NotificationKind.new.value:
            self._set_position(incident, receiver, landed=1, channel=channel, message_ts=ts, thread_ts=ts,
                               keep_thread=True)
        elif incident is not None and starts_thread and ts:
            self._set_position(incident, receiver, channel=channel, thread_ts=ts)

    def _set_position(
        self, incident: int, receiver: str | None, *, landed: int | None = None,
        only_if_landed: int | None = None,
        channel: str | None = None, message_ts: str | None = None, thread_ts: str | None = None,
        keep_thread: bool = False,
    ) -> None:
        """Update where (and whether) an incident's messages landed for one receiver, in the
        transaction under way."""
        if self._is_primary(receiver):
            if landed is not None:
                guard = "" if only_if_landed is None else f" AND landed={int(only_if_landed)}"
                self._db.execute(f"UPDATE incidents SET landed=? WHERE id=?{guard}", (landed, incident))
            return
        self._db.execute(
            "INSERT OR IGNORE INTO receiver_posts (incident_id, receiver) VALUES (?, ?)", (incident, receiver)
        )
        if landed is not None:
            guard = "" if only_if_landed is None else f" AND landed={int(only_if_landed)}"
            self._db.execute(
                f"UPDATE receiver_posts SET landed=? WHERE incident_id=? AND receiver=?{guard}",
                (landed, incident, receiver),
            )
        if channel is not None or message_ts is not None or thread_ts is not None:
            thread = "COALESCE(thread_ts, ?)" if keep_thread else "COALESCE(?, thread_ts)"
            self._db.execute(
                f"UPDATE receiver_posts SET channel=COALESCE(?, channel), message_ts=COALESCE(?, message_ts),"
                f" thread_ts={thread} WHERE incident_id=? AND receiver=?",
                (channel, message_ts, thread_ts, incident, receiver),
            )

    def incident_causes(self, *, since: float) -> list[Finding]:
        """The causes of the incidents open, or resolved at or after ``since`` (a return reopens
        them): each one's leading cause, or the cause it names as not seen now."""
        with self._reading("read the incidents") as db:
            rows = db.execute(
                "SELECT view FROM incidents WHERE status IN ('pending', 'open')"
                " OR (status='resolved' AND resolved_at >= ?)",
                (since,),
            ).fetchall()
        causes: list[Finding] = []
        for (raw,) in rows:
            view = IncidentView.model_validate_json(raw)
            cause = view.earlier_cause or (view.lead if view.has_cause else None)
            if cause is not None:
                causes.append(cause)
        return causes

    def incident_thread(self, incident_id: int, *, receiver: str | None = None) -> IncidentThread | None:
        """Where an incident's message and thread are, and whether its first message landed
        (``receiver``: for that receiver; default the first)."""
        with self._reading("read an incident") as db:
            if not self._is_primary(receiver):
                if db.execute("SELECT 1 FROM incidents WHERE id=?", (incident_id,)).fetchone() is None:
                    return None
                row = db.execute(
                    "SELECT p.channel, p.message_ts, p.thread_ts, p.landed, i.status FROM receiver_posts p"
                    " JOIN incidents i ON i.id=p.incident_id WHERE p.incident_id=? AND p.receiver=?",
                    (incident_id, receiver),
                ).fetchone()
                if row is None:
                    status = db.execute("SELECT status FROM incidents WHERE id=?", (incident_id,)).fetchone()
                    return IncidentThread(None, None, None, 0, status[0] == "resolved")
            else:
                row = db.execute(
                    "SELECT channel, message_ts, thread_ts, landed, status FROM incidents WHERE id=?",
                    (incident_id,),
                ).fetchone()
        return IncidentThread(row[0], row[1], row[2], int(row[3]), row[4] == "resolved") if row else None

    def thread_of(self, fp: str, *, receiver: str | None = None) -> tuple[str | None, str | None]:
        """``(channel, ts)`` of the thread of this finding's newest incident (or its own), if known."""
        if not self._is_primary(receiver):
            with self._reading("read a thread") as db:
                row = db.execute(
                    "SELECT p.channel, p.thread_ts FROM receiver_posts p"
                    " JOIN incidents i ON i.id=p.incident_id"
                    " WHERE p.receiver=? AND i.members LIKE ? AND p.thread_ts IS NOT NULL"
                    " ORDER BY i.id DESC LIMIT 1",
                    (receiver, f'%"{fp}"%'),
                ).fetchone()
            return (row[0], row[1]) if row else (None, None)
        with self._reading("read a thread") as db:
            row = db.execute(
                "SELECT channel, thread_ts FROM incidents WHERE members LIKE ? AND thread_ts IS NOT NULL"
                " ORDER BY id DESC LIMIT 1",
                (f'%"{fp}"%',),
            ).fetchone()
            if row is None:
                row = db.execute(
                    "SELECT slack_channel, slack_ts FROM findings WHERE fingerprint=?", (fp,)
                ).fetchone()
        return (row[0], row[1]) if row else (None, None)

    def incident_for_service(self, service: str) -> int | None:
        """The newest open incident about ``service`` whose thread is known (an alert's report goes there)."""
        with self._reading("find an incident") as db:
            for incident_id, view in db.execute(
                "SELECT id, view FROM incidents WHERE status='open' AND thread_ts IS NOT NULL"
                " ORDER BY id DESC"
            ):
                labels = json.loads(view).get("lead", {}).get("labels", {})
                if service in (service_of(labels), labels.get("job")):
                    return int(incident_id)
        return None

    def remember(self, key: str, value: str) -> None:
        """Keep a small fact across restarts (the Slack channel's id)."""
        with self._write("remember a value") as db:
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (key, value),
            )

    def recall(self, key: str) -> str | None:
        with self._reading("read a value") as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return str(row[0]) if row else None

    # --- reading -----------------------------------------------------------------------------

    def incident_of(self, fp: str) -> int | None:
        """The newest incident holding this finding, if any."""
        with self._reading("find an incident") as db:
            row = db.execute(
                "SELECT id FROM incidents WHERE members LIKE ? ORDER BY id DESC LIMIT 1", (f'%"{fp}"%',)
            ).fetchone()
        return int(row[0]) if row else None

    def active_findings(self) -> list[Finding]:
        rows = self._db.execute("SELECT finding FROM findings WHERE status='active' ORDER BY first_seen")
        return [Finding.model_validate_json(r[0]) for r in rows]

    def integrity_ok(self) -> bool:
        """SQLite's full integrity check of the file (what a restart after a crash relies on)."""
        return bool(self._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok")

    # --- capacity on record ------------------------------------------------------------------

    _CAPACITY_COLUMNS = (
        "target, capacity_rps, slo_p99_ms, slo_error_ratio, limit_reason, measured_at, service, namespace,"
        " bottleneck_cause"
    )

    def record_capacity(self, run: CapacityRun) -> None:
        """Keep one ``diagnose capacity`` run (every run is kept; see :meth:`capacities_on_record`)."""
        with self._write("record a capacity run") as db:
            db.execute(
                f"INSERT INTO capacity_runs ({self._CAPACITY_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
                (run.target, run.capacity_rps, run.slo_p99_ms, run.slo_error_ratio, run.limit,
                 run.measured_at, run.service, run.namespace, run.bottleneck_cause),
            )  # fmt: skip

    def capacity_runs(self, target: str | None = None) -> list[CapacityRun]:
        """Every run kept (of ``target``), oldest first."""
        where, args = ("WHERE target=?", (target,)) if target is not None else ("", ())
        with self._reading("read the capacity runs") as db:
            rows = db.execute(
                f"SELECT {self._CAPACITY_COLUMNS} FROM capacity_runs {where} ORDER BY measured_at, id", args
            ).fetchall()
        return [_capacity_run(row) for row in rows]

    def capacities_on_record(self) -> list[CapacityRun]:
        """The capacity on record of each target: its newest run that found one."""
        with self._reading("read the capacities on record") as db:
            rows = db.execute(
                f"SELECT {self._CAPACITY_COLUMNS} FROM capacity_runs WHERE id IN (SELECT id FROM"
                " (SELECT id, row_number() OVER (PARTITION BY target ORDER BY measured_at DESC, id DESC)"
                " AS n FROM capacity_runs WHERE capacity_rps IS NOT NULL AND limit_reason != 'aborted')"
                " WHERE n=1) ORDER BY target"
            ).fetchall()
        return [_capacity_run(row) for row in rows]


def _capacity_run(row: Sequence[Any]) -> CapacityRun:
    return CapacityRun(
        target=str(row[0]),
        capacity_rps=None if row[1] is None else float(row[1]),
        slo_p99_ms=float(row[2]),
        slo_error_ratio=float(row[3]),
        limit=str(row[4]),
        measured_at=float(row[5]),
        service=row[6],
        namespace=row[7],
        bottleneck_cause=row[8],
    )


def _first_error(diagnosis: Diagnosis, sources: set[str]) -> str:
    """The first error of ``sources`` in ``diagnosis``, as a report shows it."""
    return next((str(e) for e in diagnosis.errors if e.source in sources), "a source failed")


def _accepts(match: Match, payload: Payload) -> bool:
    """Whether a receiver with ``match`` is told of ``payload``: of any finding it is about."""
    if isinstance(payload, IncidentPayload):
        return match.accepts_any(payload.view.findings)
    if isinstance(payload, FindingPayload):
        return match.accepts(payload.finding)
    if isinstance(payload, AlertReportPayload):
        findings = payload.diagnosis.findings
        return match.accepts_any(findings) if findings else match.accepts(None)
    return any(match.accepts_row(row.severity, row.service, row.cause) for row in payload.rows)


class ReceiverOutbox:
    """One receiver's view of the store: the :class:`~diagnoser.notify.outbox.OutboxStore` its
    delivery drives (its rows, its positions, its channel)."""

    def __init__(self, store: StateStore, receiver: str) -> None:
        self.store = store
        self.receiver = receiver

    def pending(self, limit: int = 100) -> list[OutboxEntry]:
        return self.store.pending(limit, receiver=self.receiver)

    def begin_attempt(self, entry_id: int, *, marker: str, now: float | None = None) -> None:
        self.store.begin_attempt(entry_id, marker=marker, now=now)

    def attempt_failed(
        self, entry_id: int, error: str, *, retry_at: float, in_doubt: bool, count_attempt: bool = False
    ) -> None:
        self.store.attempt_failed(
            entry_id, error, retry_at=retry_at, in_doubt=in_doubt, count_attempt=count_attempt
        )

    def dead_letter(self, entry_id: int, error: str, *, reason: str = "", now: float | None = None) -> None:
        self.store.dead_letter(entry_id, error, reason=reason, now=now)

    def mark_sent(
        self, entry_id: int, *, channel: str | None = None, ts: str | None = None, starts_thread: bool = False
    ) -> None:
        self.store.mark_sent(entry_id, channel=channel, ts=ts, starts_thread=starts_thread)

    def reset_backoff(self, *, except_id: int) -> None:
        self.store.reset_backoff(except_id=except_id, receiver=self.receiver)

    def retry_dead_letters(
        self, *, older_than_s: float = 0.0, max_retries: int | None = None, now: float | None = None
    ) -> int:
        return self.store.retry_dead_letters(
            older_than_s=older_than_s, max_retries=max_retries, now=now, receiver=self.receiver
        )

    def thread_of(self, fp: str) -> tuple[str | None, str | None]:
        return self.store.thread_of(fp, receiver=self.receiver)

    def incident_thread(self, incident_id: int) -> IncidentThread | None:
        return self.store.incident_thread(incident_id, receiver=self.receiver)

    def _key(self, key: str) -> str:
        # The first receiver keeps the key an older version wrote (the Slack channel's id).
        return key if self.store._is_primary(self.receiver) else f"{key}:{self.receiver}"

    def remember(self, key: str, value: str) -> None:
        self.store.remember(self._key(key), value)

    def recall(self, key: str) -> str | None:
        return self.store.recall(self._key(key))
