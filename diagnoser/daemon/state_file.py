"""The state file itself: one SQLite file that is opened safely, set aside when corrupted, and written whole.

:class:`StateFile` opens the file in WAL mode, creates or upgrades its tables (``findings``,
``incidents``, ``receiver_posts``, ``outbox``, ``dead_letters``, ``meta``, ``capacity_runs``) and
writes once at start, so a path that cannot be opened or written (missing permission, read-only,
a directory) is refused before the daemon runs.
A file an older release wrote gains what it lacks (``upgraded``; what its rows mean is
:mod:`~diagnoser.daemon.state_upgrade`'s). A file that is not a valid SQLite database is set
aside (renamed ``<name>.corrupt-<UTC time>``) and a fresh one started. Every failure comes out as one
:class:`~diagnoser.errors.StateError` naming the file, what was being done, a ``reason``
(``disk_full``, ``read_only``, ``corrupt``, ``unopenable``, ``locked``, ``io``) and what to do;
a full disk fails the one transaction, which SQLite has already rolled back. ::

    file = StateFile(Path("state.sqlite3"))
    with file.write("record the diagnosis") as db:
        db.execute("UPDATE findings SET ...")
    file.close()
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from diagnoser.errors import StateError

__all__ = ["StateFile"]

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
CREATE TABLE IF NOT EXISTS incidents (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    status         TEXT NOT NULL CHECK (status IN ('pending', 'open', 'resolved', 'merged')),
    members        TEXT NOT NULL,
    view           TEXT NOT NULL,
    opened_at      REAL NOT NULL,
    last_seen      REAL NOT NULL,
    cleared_at     REAL,
    resolved_at    REAL,
    last_reply_at  REAL,
    last_notified  REAL,
    last_edit_at   REAL,
    landed         INTEGER NOT NULL DEFAULT 0,
    channel        TEXT,
    message_ts     TEXT,
    thread_ts      TEXT
);
CREATE TABLE IF NOT EXISTS receiver_posts (
    incident_id  INTEGER NOT NULL,
    receiver     TEXT NOT NULL,
    channel      TEXT,
    message_ts   TEXT,
    thread_ts    TEXT,
    landed       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (incident_id, receiver)
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
CREATE TABLE IF NOT EXISTS capacity_runs (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    target            TEXT NOT NULL,
    service           TEXT,
    namespace         TEXT,
    capacity_rps      REAL,
    slo_p99_ms        REAL NOT NULL,
    slo_error_ratio   REAL NOT NULL,
    limit_reason      TEXT NOT NULL,
    bottleneck_cause  TEXT,
    measured_at       REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS capacity_runs_by_target ON capacity_runs (target, measured_at);
"""
#: Columns added after the first release, by table; an older file gains them when opened.
_ADDED_COLUMNS: dict[str, dict[str, str]] = {}
_OUTBOX_ADDED_COLUMNS = {
    # The id the message carries (Slack message metadata), to find it again after an answer
    # that never came.
    "marker": "TEXT",
    # Not tried again before this time (Retry-After, backoff).
    "next_attempt_at": "REAL NOT NULL DEFAULT 0",
    # Set before each post and cleared when its outcome is known: still set means the post
    # may have reached Slack (timeout, crash) and must be looked for before it is sent again.
    "attempt_started_at": "REAL",
    # The incident it is about (threads, edits, and holding a reply whose first message failed).
    "incident_id": "INTEGER",
    # How many times it came back from the dead letters.
    "retries": "INTEGER NOT NULL DEFAULT 0",
    # The receiver it is for (one row per receiver that matches); NULL: the first receiver
    # (rows an older version queued, or a daemon with no receivers).
    "receiver": "TEXT",
}
_ADDED_COLUMNS["outbox"] = _OUTBOX_ADDED_COLUMNS
_ADDED_COLUMNS["incidents"] = {
    # When its message was last edited for a number that moved (edits as rare as replies).
    "last_edit_at": "REAL",
    # When its thread was told that its rules could not read their evidence (told once per
    # outage; cleared when they can again).
    "unread_since": "REAL",
}
_ADDED_COLUMNS["dead_letters"] = {
    "incident_id": "INTEGER",
    "marker": "TEXT",
    # What refused it (``invalid_auth``...): only refusals are retried on the slow schedule.
    "reason": "TEXT",
    "retries": "INTEGER NOT NULL DEFAULT 0",
    "receiver": "TEXT",
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


class StateFile:
    """One open SQLite state file and its transactions; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: Where a corrupted file was moved when this store started afresh, else ``None``.
        self.set_aside: Path | None = None
        #: True when the file an older release wrote was upgraded on opening (tables or
        #: columns added to a file that held findings): its rows may need adopting.
        self.upgraded = False
        try:
            self.db = self._open()
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
            self.db = self._open()

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
            tables = "SELECT name FROM sqlite_master WHERE type='table'"
            before = {row[0] for row in db.execute(tables)}
            db.executescript(_SCHEMA)
            changed = {row[0] for row in db.execute(tables)} - before
            for table, added in _ADDED_COLUMNS.items():
                present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                for column, declaration in added.items():
                    if column not in present:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                        changed.add(table)
            self.upgraded = "findings" in before and bool(changed)
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
    def write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction; a SQLite failure comes out as one :class:`StateError`."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _state_error(self.path, what, exc) from exc
        try:
            yield self.db
            self.db.execute("COMMIT")
        except BaseException as exc:
            # SQLite rolls back by itself on some errors (a full disk among them); a ROLLBACK
            # then fails with "no transaction is active" and would hide the error that matters.
            if self.db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _state_error(self.path, what, exc) from exc
            raise

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[sqlite3.Connection]:
        """Reads; a SQLite failure comes out as one :class:`StateError`."""
        try:
            yield self.db
        except sqlite3.Error as exc:
            raise _state_error(self.path, what, exc) from exc

    def close(self) -> None:
        """Checkpoint the write-ahead log into the main file and close."""
        try:
            with contextlib.suppress(sqlite3.Error):  # a full disk must not stop the shutdown
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self.db.close()
