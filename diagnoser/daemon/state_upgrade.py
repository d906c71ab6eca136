"""Taking over the rows an older release left in the state file, once, when the file is upgraded.

Every schema the state file had since its first release is upgraded in place by
:class:`~diagnoser.daemon.state_file.StateFile` (tables and columns added); what the rows mean
is settled here, so that the upgrade neither repeats nor forgets what the channel was told:

- an active finding that no incident holds (the releases before incidents kept findings alone)
  becomes an incident: *open* in the thread of the message announcing it when there was one
  (edited, replied to and resolved there), else *pending*, to be announced only if it is
  still there;
- an incident whose first message never landed (queued when the older daemon stopped, or
  dead-lettered) goes back to *pending*, and that message is dropped: the current daemon
  decides anew, so a problem that cleared during the upgrade is never announced late;
- queued messages about an adopted finding that an older release wrote without an incident
  are dropped for the same reason (the incident says what is still true).

A post that may have reached the channel (an attempt under way when the older daemon stopped)
is kept: the delivery looks it up before sending it again. A dead letter was refused: dropped. ::

    adopted = adopt_older_rows(db)   # within the store's write transaction
"""

from __future__ import annotations

import json
import logging
from sqlite3 import Connection

from pydantic import ValidationError

from diagnoser.models import Finding
from diagnoser.notify.outbox import NotificationKind
from diagnoser.notify.payloads import IncidentView

__all__ = ["adopt_older_rows"]

log = logging.getLogger(__name__)

_NEW = NotificationKind.new.value


def adopt_older_rows(db: Connection) -> int:
    """Adopt an older release's rows (see the module docstring); how many incidents changed."""
    changed = _adopt_lone_findings(db)
    changed += _reopen_unannounced(db)
    if changed:
        log.info("state file from an older release taken over: %d incidents adopted or re-decided", changed)
    return changed


def _adopt_lone_findings(db: Connection) -> int:
    held = {m for (members,) in db.execute("SELECT members FROM incidents") for m in json.loads(members)}
    adopted: list[str] = []
    rows = db.execute(
        "SELECT fingerprint, finding, first_seen, last_seen, last_notified, slack_channel, slack_ts"
        " FROM findings WHERE status='active' ORDER BY first_seen"
    ).fetchall()
    for fp, stored, first_seen, last_seen, last_notified, channel, ts in rows:
        if fp in held:
            continue
        try:
            finding = Finding.model_validate_json(stored)
        except ValidationError as exc:
            log.warning("an older release's finding %s cannot be read (%s): it is decided anew", fp, exc)
            continue
        view = IncidentView(lead=finding, opened_at=float(first_seen))
        status, landed = ("open", 1) if ts else ("pending", 0)
        db.execute(
            "INSERT INTO incidents (status, members, view, opened_at, last_seen, last_notified, landed,"
            " channel, message_ts, thread_ts) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (status, json.dumps([fp]), view.model_dump_json(), first_seen, last_seen,
             last_notified if ts else None, landed, channel, ts, ts),
        )  # fmt: skip
        adopted.append(fp)
    for fp in adopted:
        # What the older release queued about it, without an incident: the incident decides now.
        db.execute(
            "DELETE FROM outbox WHERE fingerprint=? AND incident_id IS NULL AND attempt_started_at IS NULL",
            (fp,),
        )
        db.execute("DELETE FROM dead_letters WHERE fingerprint=? AND incident_id IS NULL", (fp,))
    return len(adopted)


def _reopen_unannounced(db: Connection) -> int:
    """Open incidents whose first message never landed go back to pending; the message is dropped."""
    rows = db.execute("SELECT id FROM incidents WHERE status='open' AND landed<=0").fetchall()
    changed = 0
    for (incident_id,) in rows:
        in_doubt = db.execute(
            "SELECT 1 FROM outbox WHERE incident_id=? AND kind=? AND attempt_started_at IS NOT NULL",
            (incident_id, _NEW),
        ).fetchone()
        if in_doubt is not None:
            continue  # it may have been posted: the delivery finds out
        db.execute("DELETE FROM outbox WHERE incident_id=?", (incident_id,))
        db.execute("DELETE FROM dead_letters WHERE incident_id=?", (incident_id,))
        db.execute(
            "UPDATE incidents SET status='pending', landed=0, last_notified=NULL WHERE id=?", (incident_id,)
        )
        changed += 1
    return changed
