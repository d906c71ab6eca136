"""The daemon's memory: which findings are active, what was notified, and what still must be sent.

One SQLite file (a PersistentVolume in the cluster) holds two tables:

- ``findings``: one row per fingerprint (rule id, cause and the finding's identifying labels),
  with its severity, when it was first and last seen and last notified, and the Slack
  thread (``ts``) its first message started;
- ``outbox``: notifications not yet delivered, in the order they were decided.

:meth:`StateStore.reconcile` compares a diagnosis with the active findings and, in one
transaction, updates them and appends to the outbox: a new finding is notified once, a repeat
within the cooldown is silent, a change of severity is notified, a finding that is gone is
notified as resolved. Deciding and queueing in one transaction is what makes a restart neither
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

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from sqlite3 import Connection
from typing import Any, Protocol

from diagnoser.daemon.state_file import StateFile
from diagnoser.models import Diagnosis, Finding, Severity
from diagnoser.notify.outbox import NotificationKind, OutboxEntry

__all__ = ["StateStore", "fingerprint"]


class _Identified(Protocol):
    """What identifies a finding: a Finding, or a finding a silence kept out of a run."""

    @property
    def rule_id(self) -> str: ...

    @property
    def cause(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...


def fingerprint(finding: _Identified) -> str:
    """Stable identity of a finding across runs: rule, cause and its identifying labels.

    Measured values, titles and evidence change from run to run; they are not part of it.
    """
    key = json.dumps([finding.rule_id, finding.cause, sorted(finding.labels.items())], separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _finding_json(finding: Finding) -> dict[str, Any]:
    data = finding.model_dump(mode="json")
    data["explains"] = list(finding.explains)
    return data


#: A decision of :meth:`StateStore.reconcile`: the finding's fingerprint, what to say, its payload.
_Decision = tuple[str, NotificationKind, dict[str, Any]]


class StateStore:
    """Finding state and the notification outbox in one SQLite file; safe across restarts.

    Every method is a short transaction on a local file (well under a millisecond), so the daemon
    calls them from the event loop directly.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = StateFile(path)
        self._db: Connection = self._file.db

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
    ) -> list[OutboxEntry]:
        """Update the active findings from ``diagnosis`` and queue what must be said; return it.

        ``notify=False`` (a replica that is not the leader) keeps the state in step without
        queueing anything, as if it had notified, so that it does not repeat the leader's
        messages once it takes over.
        A finding whose evidence came from a source that failed in this run is not resolved:
        its absence says nothing about it. Nor is one a silence keeps out of this run
        (``silenced``: fingerprints): it is still there, only quiet.
        """
        now = time.time() if now is None else now
        failed_sources = {error.source for error in diagnosis.errors}
        seen: dict[str, Finding] = {}
        for finding in diagnosis.findings:
            if finding.severity.rank >= min_severity.rank:
                seen.setdefault(fingerprint(finding), finding)  # the first of duplicates counts
        with self._write("record the diagnosis"):
            active = {
                row[0]: row
                for row in self._db.execute(
                    "SELECT fingerprint, severity, last_notified, finding FROM findings WHERE status='active'"
                )
            }
            queued: list[_Decision] = []
            for fp, finding in seen.items():
                queued += self._record_present(fp, finding, active.get(fp), cooldown_s=cooldown_s, now=now)
            quiet = set(seen) | set(silenced)
            for fp, (_, _, _, stored) in active.items():
                if fp not in quiet:
                    gone = Finding.model_validate_json(stored)
                    queued += self._resolve_absent(fp, gone, failed_sources, now)
            entries = (
                [self._enqueue(fp, kind, payload, now) for fp, kind, payload in queued] if notify else []
            )
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('last_diagnosis_at', ?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(now),),
            )
        return entries

    def _record_present(
        self, fp: str, finding: Finding, previous: tuple[Any, ...] | None, *, cooldown_s: float, now: float
    ) -> list[_Decision]:
        """Insert or update a finding present in this run; what to say about it, if anything."""
        body = json.dumps(_finding_json(finding))
        if previous is None:
            self._db.execute(
                "INSERT INTO findings (fingerprint, rule_id, cause, severity, status, finding,"
                " first_seen, last_seen, last_notified) VALUES (?,?,?,?,'active',?,?,?,?)"
                " ON CONFLICT(fingerprint) DO UPDATE SET severity=excluded.severity,"
                " status='active', finding=excluded.finding, first_seen=excluded.first_seen,"
                " last_seen=excluded.last_seen, last_notified=excluded.last_notified",
                (fp, finding.rule_id, finding.cause, finding.severity.value, body, now, now, now),
            )
            return [(fp, NotificationKind.new, {"finding": _finding_json(finding)})]
        _, old_severity, last_notified, _ = previous
        kind: NotificationKind | None = None
        if old_severity != finding.severity.value:
            kind = NotificationKind.severity_changed
        elif last_notified is None or now - float(last_notified) >= cooldown_s:
            kind = NotificationKind.repeat
        self._db.execute(
            "UPDATE findings SET severity=?, finding=?, last_seen=?,"
            " last_notified=CASE WHEN ? THEN ? ELSE last_notified END WHERE fingerprint=?",
            (finding.severity.value, body, now, kind is not None, now, fp),
        )
        if kind is None:
            return []
        payload: dict[str, Any] = {"finding": _finding_json(finding)}
        if kind is NotificationKind.severity_changed:
            payload["previous_severity"] = old_severity
        return [(fp, kind, payload)]

    def _resolve_absent(
        self, fp: str, finding: Finding, failed_sources: set[str], now: float
    ) -> list[_Decision]:
        """Resolve an active finding this run did not report, unless a source it reads failed."""
        if failed_sources.intersection(e.source for e in finding.evidence):
            return []
        self._db.execute(
            "UPDATE findings SET status='resolved', last_notified=? WHERE fingerprint=?", (now, fp)
        )
        return [(fp, NotificationKind.resolved, {"finding": _finding_json(finding), "resolved_at": now})]

    def enqueue(
        self, kind: NotificationKind, payload: dict[str, Any], fingerprint: str | None = None
    ) -> OutboxEntry:
        """Queue a notification that is not a finding's transition (an Alertmanager report)."""
        with self._write("queue a notification"):
            entry = self._enqueue(fingerprint, kind, payload, time.time())
        return entry

    def _enqueue(
        self, fp: str | None, kind: NotificationKind, payload: dict[str, Any], now: float
    ) -> OutboxEntry:
        cursor = self._db.execute(
            "INSERT INTO outbox (fingerprint, kind, payload, created_at) VALUES (?,?,?,?)",
            (fp, kind.value, json.dumps(payload), now),
        )
        return OutboxEntry(int(cursor.lastrowid or 0), fp, kind, payload, now, 0)

    # --- delivering --------------------------------------------------------------------------

    _ENTRY_COLUMNS = (
        "id, fingerprint, kind, payload, created_at, attempts, marker, next_attempt_at,"
        " attempt_started_at, last_error"
    )

    def pending(self, limit: int = 100) -> list[OutboxEntry]:
        """Queued notifications, oldest first."""
        with self._reading("read the outbox") as db:
            rows = db.execute(
                f"SELECT {self._ENTRY_COLUMNS} FROM outbox ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [
            OutboxEntry(
                int(r[0]), r[1], NotificationKind(r[2]), json.loads(r[3]), float(r[4]), int(r[5]),
                r[6], float(r[7] or 0), None if r[8] is None else float(r[8]), r[9],
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

    def dead_letter(self, entry_id: int, error: str, *, now: float | None = None) -> None:
        """Move an entry Slack will never take out of the queue into ``dead_letters``, kept for people."""
        now = time.time() if now is None else now
        with self._write("dead-letter a notification") as db:
            db.execute(
                "INSERT OR REPLACE INTO dead_letters (id, fingerprint, kind, payload, created_at, attempts,"
                " error, dead_at) SELECT id, fingerprint, kind, payload, created_at, attempts, ?, ?"
                " FROM outbox WHERE id=?",
                (error[:500], now, entry_id),
            )
            db.execute("DELETE FROM outbox WHERE id=?", (entry_id,))

    def dead_letters(self) -> list[tuple[int, str, str]]:
        """``(id, kind, error)`` of every dead-lettered notification, oldest first."""
        with self._reading("read the dead letters") as db:
            rows = db.execute("SELECT id, kind, error FROM dead_letters ORDER BY id").fetchall()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def mark_sent(
        self, entry_id: int, *, channel: str | None = None, ts: str | None = None, starts_thread: bool = False
    ) -> None:
        """Drop a delivered entry; remember the thread its finding's first message started.

        ``starts_thread``: this message (a reply reposted at top level because its thread was
        gone) is where the finding's later messages now go.
        """
        with self._write("record a delivery") as db:
            row = db.execute("SELECT fingerprint, kind FROM outbox WHERE id=?", (entry_id,)).fetchone()
            db.execute("DELETE FROM outbox WHERE id=?", (entry_id,))
            if row is not None and row[0] and ts and (starts_thread or row[1] == NotificationKind.new.value):
                db.execute(
                    "UPDATE findings SET slack_channel=?, slack_ts=? WHERE fingerprint=?",
                    (channel, ts, row[0]),
                )

    def thread_of(self, fp: str) -> tuple[str | None, str | None]:
        """``(channel, ts)`` of the message that started this finding's thread, if known."""
        with self._reading("read a thread") as db:
            row = db.execute(
                "SELECT slack_channel, slack_ts FROM findings WHERE fingerprint=?", (fp,)
            ).fetchone()
        return (row[0], row[1]) if row else (None, None)

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


    # --- reading -----------------------------------------------------------------------------

    def active_findings(self) -> list[Finding]:
        rows = self._db.execute("SELECT finding FROM findings WHERE status='active' ORDER BY first_seen")
        return [Finding.model_validate_json(r[0]) for r in rows]

    def integrity_ok(self) -> bool:
        """SQLite's full integrity check of the file (what a restart after a crash relies on)."""
        return bool(self._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
