"""Starting the current daemon on the state file every earlier schema left behind.

Each file under ``tests/fixtures/state_upgrade/`` was written by that release's own code
(``generate.py`` there): ``still`` and ``gone`` announced in Slack an hour before the upgrade,
``stale`` decided and never delivered, ``dead`` refused by Slack (where the release had dead
letters). The schemas: ``c014a37`` (findings and a plain outbox), ``e634e76`` (dead letters,
markers, retries in time), ``e7dd209`` (incidents), ``b1c9bac`` (edits' timing); the current one
adds receivers. With ``still`` still saturated and the others gone, the current daemon must:
announce nothing again (``still`` is adopted in its old thread), resolve ``gone`` in its old
thread, and never post ``stale`` or ``dead``, not even once their dead letters are retried.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diagnoser.daemon import Daemon
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.fixtures.slack_server import PostedMessage, SlackFixtureServer

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "state_upgrade"
RELEASES = ("c014a37", "e634e76", "e7dd209", "b1c9bac")


@pytest.mark.parametrize("release", RELEASES)
async def test_the_current_daemon_takes_over_an_older_state_file(
    release: str, tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    state = tmp_path / "state.sqlite3"
    shutil.copyfile(FIXTURES / f"{release}.sqlite3", state)
    posted = json.loads((FIXTURES / f"{release}.slack.json").read_text(encoding="utf-8"))
    # The channel holds what the older daemon posted, as Slack would.
    slack.messages.extend(
        PostedMessage("api", {"text": m["text"], "channel": m["channel"]}, m["ts"], m["channel"]) for m in posted
    )
    still, gone = (m["ts"] for m in posted)
    pool_app.set("upgrade", "still", 0.97)
    # Prometheus holds it before the daemon starts: a first diagnosis without it would clear it.
    query = 'shop_pool_used_ratio{service="upgrade", pool="still"}'
    await wait_for(lambda: live_prometheus.value(query) == 0.97, 20, "the pool scraped")
    settings = daemon_settings(
        tmp_path, live_prometheus.url, "upgrade", slack=slack, state=state,
        slack_settings={"dead_letter_retry_s": 0.5},
    )  # fmt: skip
    daemon = Daemon(settings)
    await daemon.start()
    try:
        await wait_for(
            lambda: any(r.text.startswith("Resolved") for r in slack.replies(gone)), 20, "gone resolved in its thread"
        )
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 8, 20, "eight more diagnoses")
        assert daemon.state is not None
        await wait_for(lambda: daemon.state.pending_count() == 0, 20, "the outbox drained")  # type: ignore[union-attr]
    finally:
        await daemon.stop()
        pool_app.set("upgrade", "still", 0.1)
    new_posts = [m for m in slack.messages[len(posted):] if not m.thread_ts]
    assert new_posts == [], [m.text for m in new_posts]  # nothing announced again, nothing stale
    assert sum(r.text.startswith("Resolved") for r in slack.replies(gone)) == 1
    assert not any(r.text.startswith("Resolved") for r in slack.replies(still))
    told = json.dumps([m.body for m in slack.messages[len(posted):]] + [u.body for u in slack.updates])
    assert "Pool stale" not in told and "Pool dead" not in told
