"""A rule that could not run is never read as "clear": through the real daemon, a real Prometheus
behind a proxy that starts failing mid-incident, and the Slack fixture.

While every rule errors, the incident is held (no "Resolved"), its thread is told once that the
evidence could not be read, and ``/readyz`` is not 200 and names the rules and the source. Once
Prometheus answers again and the pool is still saturated, nothing new is posted; once the pool
recovers, the incident is resolved once.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from diagnoser.daemon import Daemon
from diagnoser.models import Diagnosis, Evidence, Finding, Severity, SourceError
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.fixtures.prometheus_proxy import PrometheusProxy
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_an_incident_whose_rules_errored_is_held_told_once_and_readyz_says_so(
    tmp_path: Path, live_prometheus: LivePrometheus, pool_app: PoolApp, slack: SlackFixtureServer
) -> None:
    job = "held-errored"
    pool_app.set(job, "orders-db", 1.0)
    with PrometheusProxy(live_prometheus.url) as proxy:
        settings = daemon_settings(tmp_path, proxy.url, job, slack=slack, resolve_after_s=0)
        daemon = Daemon(settings)
        await daemon.start()
        try:
            await wait_for(lambda: len(slack.top_level()) == 1, 20, "the incident's message")
            (top,) = slack.top_level()
            assert "connection_pool_exhaustion" in top.text
            proxy.fail()
            held = [r for r in slack.replies(top.ts) if "could not be read" in r.text]
            await wait_for(
                lambda: any("could not be read" in r.text for r in slack.replies(top.ts)), 20, "the held note"
            )
            runs = daemon.runs
            await wait_for(lambda: daemon.runs >= runs + 6, 20, "six diagnoses while Prometheus fails")
            assert proxy.failed > 0
            held = [r for r in slack.replies(top.ts) if "could not be read" in r.text]
            assert len(held) == 1, [r.text for r in slack.replies(top.ts)]
            assert "prometheus" in held[0].text
            assert not any(r.text.startswith("Resolved") for r in slack.replies(top.ts))
            status, body = await asyncio.to_thread(readyz, daemon.http_port or 0)
            assert status == 503, body
            assert "every rule errored" in body and "test/pool-saturated" in body and "prometheus" in body
            # Prometheus answers again, the pool is still saturated: nothing new, nothing resolved.
            proxy.ok()
            runs = daemon.runs
            await wait_for(lambda: daemon.runs >= runs + 4, 20, "four diagnoses with Prometheus back")
            status, body = await asyncio.to_thread(readyz, daemon.http_port or 0)
            assert status == 200, body
            assert [m.ts for m in slack.top_level() if "connection_pool_exhaustion" in m.text] == [top.ts]
            assert not any(r.text.startswith("Resolved") for r in slack.replies(top.ts))
            # The pool recovers: resolved once, in its thread.
            pool_app.set(job, "orders-db", 0.1)
            await wait_for(
                lambda: any(r.text.startswith("Resolved") for r in slack.replies(top.ts)), 20, "the resolution"
            )
            assert sum(r.text.startswith("Resolved") for r in slack.replies(top.ts)) == 1
        finally:
            await daemon.stop()
            pool_app.set(job, "orders-db", 0.1)


def _finding(pool: str) -> Finding:
    return Finding(
        rule_id="test/pool-saturated",
        cause="connection_pool_exhaustion",
        kind="cause",
        severity=Severity.critical,
        title=f"Pool {pool} saturated",
        summary="100 %",
        evidence=[Evidence(source="prometheus", query="q", labels={"pool": pool}, value=1.0)],
        labels={"pool": pool},
    )


def test_a_rule_that_threw_does_not_resolve_what_it_found_before(tmp_path: Path) -> None:
    """The error names no source the finding read (the rule itself threw): still not "clear"."""
    from datetime import UTC, datetime

    from diagnoser.daemon.state import StateStore

    store = StateStore(tmp_path / "state.sqlite3")
    at = datetime.now(UTC)
    store.reconcile(Diagnosis(evaluated_at=at, findings=[_finding("a")]), cooldown_s=3600, now=100)
    threw = SourceError(
        source="engine", message="rule test/pool-saturated failed: ValueError: x", rules=["test/pool-saturated"]
    )
    queued = store.reconcile(Diagnosis(evaluated_at=at, errors=[threw]), cooldown_s=3600, now=110)
    assert [e.kind.value for e in queued] == ["repeat"]
    assert "could not be read" in str(queued[0].payload)
    assert [f.identity for f in store.active_findings()] == [_finding("a").identity]
    again = store.reconcile(Diagnosis(evaluated_at=at, errors=[threw]), cooldown_s=3600, now=120)
    assert again == []  # told once
    resolved = store.reconcile(Diagnosis(evaluated_at=at), cooldown_s=3600, now=130)
    assert [e.kind.value for e in resolved] == ["resolved"]
    store.close()
