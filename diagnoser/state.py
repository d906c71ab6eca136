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
        ts = send(entry)                    # raises while Slack is down: the entry stays queued
        store.mark_sent(entry.id, ts=ts)
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from diagnoser.models import Diagnosis, Finding, Severity

__all__ = ["NotificationKind", "OutboxEntry", "StateStore", "fingerprint"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS findings (
    fingerprint    TEXT PRIMARY KEY,
    rule_id        TEXT NOT NULL,
    cause          TEXT NOT NULL,
    severity       TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('active', 'resolved')),
    finding        TEXT NOT NULL,
    first_seen     REAL NOT NULL,
    last_seen      REAL NOT NULL,
    last_notified  REAL,
    slack_channel  TEXT,
    slack_ts       TEXT
);
CREATE TABLE IF NOT EXISTS outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    fingerprint  TEXT,
    kind         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    created_at   REAL NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT
);
CREATE TABLE IF NOT EXISTS meta (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
"""


class NotificationKind(StrEnum):
    """Why a message is sent; the Slack renderer picks its layout from it."""

    new = "new"
    #: Still there after the cooldown: a reminder in the same thread.
    repeat = "repeat"
    severity_changed = "severity_changed"
    resolved = "resolved"
    #: A diagnosis requested by an Alertmanager alert (not tied to one finding).
    alert_report = "alert_report"


@dataclass(frozen=True)
class OutboxEntry:
    """One queued notification: what to say and, for threading, which finding it belongs to."""

    id: int
    fingerprint: str | None
    kind: NotificationKind
    payload: dict[str, Any]
    created_at: float
    attempts: int

    @property
    def finding(self) -> Finding | None:
        raw = self.payload.get("finding")
        return Finding.model_validate(raw) if raw is not None else None


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


class StateStore:
    """Finding state and the notification outbox in one SQLite file; safe across restarts.

    Every method is a short transaction on a local file (well under a millisecond), so the daemon
    calls them from the event loop directly.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        if str(path) != ":memory:":
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        # WAL keeps a crash mid-write from corrupting the file; NORMAL is durable at checkpoints
        # and on every commit in WAL mode except for a power loss, which a daemon can live with.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Checkpoint the write-ahead log into the main file and close."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()

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
        queued: list[tuple[str | None, NotificationKind, dict[str, Any]]] = []
        self._db.execute("BEGIN IMMEDIATE")
        try:
            active = {
                row[0]: row
                for row in self._db.execute(
                    "SELECT fingerprint, severity, last_notified, finding FROM findings WHERE status='active'"
                )
            }
            seen: set[str] = set()
            for finding in diagnosis.findings:
                if finding.severity.rank < min_severity.rank:
                    continue
                fp = fingerprint(finding)
                if fp in seen:
                    continue
                seen.add(fp)
                body = json.dumps(_finding_json(finding))
                previous = active.get(fp)
                if previous is None:
                    self._db.execute(
                        "INSERT INTO findings (fingerprint, rule_id, cause, severity, status, finding,"
                        " first_seen, last_seen, last_notified) VALUES (?,?,?,?,'active',?,?,?,?)"
                        " ON CONFLICT(fingerprint) DO UPDATE SET severity=excluded.severity,"
                        " status='active', finding=excluded.finding, first_seen=excluded.first_seen,"
                        " last_seen=excluded.last_seen, last_notified=excluded.last_notified",
                        (fp, finding.rule_id, finding.cause, finding.severity.value, body, now, now, now),
                    )
                    queued.append((fp, NotificationKind.new, {"finding": _finding_json(finding)}))
                    continue
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
                if kind is not None:
                    payload: dict[str, Any] = {"finding": _finding_json(finding)}
                    if kind is NotificationKind.severity_changed:
                        payload["previous_severity"] = old_severity
                    queued.append((fp, kind, payload))
            quiet = set(silenced)
            for fp, (_, _, _, stored) in active.items():
                if fp in seen or fp in quiet:
                    continue
                finding = Finding.model_validate_json(stored)
                if failed_sources.intersection(e.source for e in finding.evidence):
                    continue
                self._db.execute(
                    "UPDATE findings SET status='resolved', last_notified=? WHERE fingerprint=?", (now, fp)
                )
                queued.append(
                    (fp, NotificationKind.resolved, {"finding": _finding_json(finding), "resolved_at": now})
                )
            entries = (
                [self._enqueue(fp, kind, payload, now) for fp, kind, payload in queued] if notify else []
            )
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('last_diagnosis_at', ?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(now),),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return entries

    def enqueue(
        self, kind: NotificationKind, payload: dict[str, Any], fingerprint: str | None = None
    ) -> OutboxEntry:
        """Queue a notification that is not a finding's transition (an Alertmanager report)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            entry = self._enqueue(fingerprint, kind, payload, time.time())
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
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

    def pending(self, limit: int = 100) -> list[OutboxEntry]:
        """Queued notifications, oldest first."""
        rows = self._db.execute(
            "SELECT id, fingerprint, kind, payload, created_at, attempts FROM outbox ORDER BY id LIMIT ?",
            (limit,),
        )
        return [
            OutboxEntry(int(r[0]), r[1], NotificationKind(r[2]), json.loads(r[3]), float(r[4]), int(r[5]))
            for r in rows
        ]

    def pending_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM outbox").fetchone()[0])

    def mark_sent(self, entry_id: int, *, channel: str | None = None, ts: str | None = None) -> None:
        """Drop a delivered entry; remember the thread its finding's first message started."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT fingerprint, kind FROM outbox WHERE id=?", (entry_id,)).fetchone()
            self._db.execute("DELETE FROM outbox WHERE id=?", (entry_id,))
            if row is not None and row[0] and ts and row[1] == NotificationKind.new.value:
                self._db.execute(
                    "UPDATE findings SET slack_channel=?, slack_ts=? WHERE fingerprint=?",
                    (channel, ts, row[0]),
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def mark_failed(self, entry_id: int, error: str) -> None:
        self._db.execute(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?", (error[:500], entry_id)
        )

    def thread_of(self, fp: str) -> tuple[str | None, str | None]:
        """``(channel, ts)`` of the message that started this finding's thread, if known."""
        row = self._db.execute(
            "SELECT slack_channel, slack_ts FROM findings WHERE fingerprint=?", (fp,)
        ).fetchone()
        return (row[0], row[1]) if row else (None, None)

    # --- reading -----------------------------------------------------------------------------

    def active_findings(self) -> list[Finding]:
        rows = self._db.execute("SELECT finding FROM findings WHERE status='active' ORDER BY first_seen")
        return [Finding.model_validate_json(r[0]) for r in rows]

    def last_diagnosis_at(self) -> float | None:
        row = self._db.execute("SELECT value FROM meta WHERE key='last_diagnosis_at'").fetchone()
        return float(row[0]) if row else None

    def integrity_ok(self) -> bool:
        return bool(self._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok")

    def forget(self, fingerprints: Iterable[str]) -> None:
        """Drop findings from the state (tests and manual clean-up)."""
        self._db.executemany("DELETE FROM findings WHERE fingerprint=?", [(fp,) for fp in fingerprints])
