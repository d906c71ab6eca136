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

Failures of the file itself are :class:`~diagnoser.errors.StateError` with a ``reason``: a path that
cannot be opened or written (missing permission, read-only, a directory) is refused at start; a
file that is not a valid SQLite database is set aside (renamed ``<name>.corrupt-<UTC time>``) and a
fresh one started; a full disk fails the one transaction, which SQLite has already rolled back,
and the next one succeeds once there is space again (nothing half-written, nothing decided twice).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from diagnoser.errors import StateError
from diagnoser.models import Diagnosis, Finding, Severity

__all__ = ["NotificationKind", "OutboxEntry", "StateStore", "fingerprint"]

log = logging.getLogger(__name__)

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
CREATE TABLE IF NOT EXISTS dead_letters (
    id           INTEGER PRIMARY KEY,
    fingerprint  TEXT,
    kind         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    created_at   REAL NOT NULL,
    attempts     INTEGER NOT NULL,
    error        TEXT NOT NULL,
    dead_at      REAL NOT NULL
);
"""
#: Outbox columns added after the first release; an older file gains them when opened.
_OUTBOX_ADDED_COLUMNS = {
    # The id the message carries (Slack message metadata), to find it again after an answer
    # that never came.
    "marker": "TEXT",
    # Not tried again before this time (Retry-After, backoff).
    "next_attempt_at": "REAL NOT NULL DEFAULT 0",
    # Set before each post and cleared when its outcome is known: still set means the post
    # may have reached Slack (timeout, crash) and must be looked for before it is sent again.
    "attempt_started_at": "REAL",
}
#: Less free space than this next to the state file, and an I/O error is a full disk.
_FULL_BELOW_BYTES = 64 * 1024
_SQLITE_REASONS = {
    "SQLITE_FULL": "disk_full",
    "SQLITE_READONLY": "read_only",
    "SQLITE_CORRUPT": "corrupt",
    "SQLITE_NOTADB": "corrupt",
    "SQLITE_CANTOPEN": "unopenable",
    "SQLITE_PERM": "unopenable",
    "SQLITE_AUTH": "unopenable",
    "SQLITE_BUSY": "locked",
    "SQLITE_LOCKED": "locked",
}


def _disk_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path.parent).free < _FULL_BELOW_BYTES
    except OSError:
        return False


def _state_error(path: Path, what: str, exc: sqlite3.Error) -> StateError:
    """A one-line :class:`StateError` naming the file, what was being done and what to do."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    reason = next((r for prefix, r in _SQLITE_REASONS.items() if name.startswith(prefix)), "io")
    if reason == "io" and _disk_full(path):
        # A full disk also surfaces as an I/O error (SQLite cannot map its -shm file, a write
        # of the WAL fails): say what it is.
        reason = "disk_full"
    if reason == "disk_full" or "disk is full" in str(exc):
        reason = "disk_full"
        advice = "the disk is full: free some space (nothing is lost: the next run makes the change again)"
    elif reason == "read_only":
        advice = "give the daemon write access to the file and its directory, or set daemon.state_path"
    elif reason == "corrupt":
        advice = "it is not a valid SQLite database"
    elif reason == "unopenable":
        advice = "check that the path and its directory exist and are writable, or set daemon.state_path"
    elif reason == "locked":
        advice = "another process holds it locked"
    else:
        advice = "an I/O error"
    return StateError(f"state file {path}: cannot {what}: {exc} ({advice})", reason=reason)



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
    marker: str | None = None
    next_attempt_at: float = 0.0
    attempt_started_at: float | None = None
    last_error: str | None = None

    @property
    def in_doubt(self) -> bool:
        """True when an earlier post may have reached Slack without its answer reaching us."""
        return self.attempt_started_at is not None

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
        #: Where a corrupted file was moved when this store started afresh, else ``None``.
        self.set_aside: Path | None = None
        try:
            self._db = self._open()
        except StateError as exc:
            if exc.reason != "corrupt":
                raise
            self.set_aside = self._set_aside_corrupted()
            log.error(
                "STATE FILE CORRUPTED: %s was set aside as %s and a fresh state started; findings"
                " active before will be notified again, queued notifications are in the old file",
                path,
                self.set_aside,
                extra={"error": str(exc)},
            )
            self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        path = self.path
        if str(path) != ":memory:":
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StateError(
                    f"state file {path}: cannot create its directory: {exc.strerror or exc}"
                    " (check the path and its permissions, or set daemon.state_path)",
                    reason="unopenable",
                ) from exc
            if path.is_dir():
                raise StateError(
                    f"state file {path} is a directory (set daemon.state_path)", reason="unopenable"
                )
        try:
            db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _state_error(path, "open it", exc) from exc
        try:
            # WAL keeps a crash mid-write from corrupting the file; NORMAL is durable at
            # checkpoints and on every commit in WAL mode except for a power loss, which a
            # daemon can live with.
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            check = db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise StateError(
                    f"state file {path}: failed its integrity check: {check[0] if check else '?'}",
                    reason="corrupt",
                )
            db.executescript(_SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(outbox)")}
            for column, declaration in _OUTBOX_ADDED_COLUMNS.items():
                if column not in present:
                    db.execute(f"ALTER TABLE outbox ADD COLUMN {column} {declaration}")
            # A write now, so a read-only file or a full disk is found at start, not mid-run.
            db.execute(
                "INSERT INTO meta (key, value) VALUES ('opened_at', ?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(time.time()),),
            )
        except sqlite3.Error as exc:
            db.close()
            raise _state_error(path, "open it", exc) from exc
        except StateError:
            db.close()
            raise
        return db

    def _set_aside_corrupted(self) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = self.path.with_name(self.path.name + suffix)
            if source.exists():
                try:
                    source.rename(target.with_name(target.name + suffix))
                except OSError as exc:
                    raise StateError(
                        f"state file {self.path} is corrupted and cannot be set aside: {exc.strerror or exc}",
                        reason="corrupt",
                    ) from exc
        return target

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction; a SQLite failure comes out as one :class:`StateError`."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _state_error(self.path, what, exc) from exc
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException as exc:
            # SQLite rolls back by itself on some errors (a full disk among them); a ROLLBACK
            # then fails with "no transaction is active" and would hide the error that matters.
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _state_error(self.path, what, exc) from exc
            raise

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[sqlite3.Connection]:
        try:
            yield self._db
        except sqlite3.Error as exc:
            raise _state_error(self.path, what, exc) from exc

    def close(self) -> None:
        """Checkpoint the write-ahead log into the main file and close."""
        try:
            with contextlib.suppress(sqlite3.Error):  # a full disk must not stop the shutdown
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
        with self._write("record the diagnosis"):
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
        return entries

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

    def mark_failed(self, entry_id: int, error: str) -> None:
        with self._write("record a failed delivery") as db:
            db.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?",
                (error[:500], entry_id),
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
