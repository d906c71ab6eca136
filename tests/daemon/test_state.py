"""The state store's decisions, table by table: new, repeat, cooldown, severity, resolved, outbox."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from diagnoser.daemon.state import StateStore, fingerprint
from diagnoser.models import Diagnosis, Evidence, Finding, Severity, SourceError
from diagnoser.notify.outbox import NotificationKind
from diagnoser.notify.payloads import AlertReportPayload

AT = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


def finding(pool: str = "orders-db", severity: str = "critical", value: float = 0.97, source: str = "prometheus",
            rule_id: str = "pools/pool-exhaustion") -> Finding:
    return Finding(
        rule_id=rule_id,
        cause="connection_pool_exhaustion",
        kind="cause",
        severity=Severity(severity),
        title=f"Pool {pool} exhausted",
        summary=f"pool {pool}: {value:.0%} in use",
        evidence=[Evidence(source=source, query="q", labels={"pool": pool}, value=value, threshold=0.95)],
        labels={"namespace": "shop", "job": "checkout", "pool": pool},
    )


def diagnosis(*findings: Finding, errors: tuple[SourceError, ...] = ()) -> Diagnosis:
    return Diagnosis(evaluated_at=AT, findings=list(findings), errors=list(errors))


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return StateStore(tmp_path / "state.sqlite3")


def kinds(entries: list) -> list[str]:  # type: ignore[type-arg]
    return [e.kind.value for e in entries]


def test_fingerprint_ignores_values_but_not_identity() -> None:
    assert fingerprint(finding(value=0.97)) == fingerprint(finding(value=0.99))
    assert fingerprint(finding(severity="warning")) == fingerprint(finding(severity="critical"))
    assert fingerprint(finding(pool="a")) != fingerprint(finding(pool="b"))
    assert fingerprint(finding(rule_id="x/y")) != fingerprint(finding())


def test_new_once_then_silent_within_cooldown_then_repeat(store: StateStore) -> None:
    assert kinds(store.reconcile(diagnosis(finding()), cooldown_s=60, now=1000)) == ["new"]
    assert store.reconcile(diagnosis(finding(value=0.99)), cooldown_s=60, now=1030) == []
    assert store.reconcile(diagnosis(finding()), cooldown_s=60, now=1059) == []
    assert kinds(store.reconcile(diagnosis(finding()), cooldown_s=60, now=1060)) == ["repeat"]
    assert store.reconcile(diagnosis(finding()), cooldown_s=60, now=1100) == []


def test_severity_change_is_notified_with_the_previous_one(store: StateStore) -> None:
    store.reconcile(diagnosis(finding(severity="warning")), cooldown_s=600, now=1000)
    entries = store.reconcile(diagnosis(finding(severity="critical")), cooldown_s=600, now=1010)
    assert kinds(entries) == ["severity_changed"]
    assert entries[0].payload.previous_severity == "warning"
    assert store.reconcile(diagnosis(finding(severity="critical")), cooldown_s=600, now=1020) == []


def test_cleared_is_resolved_once_and_a_return_is_new_again(store: StateStore) -> None:
    store.reconcile(diagnosis(finding()), cooldown_s=600, now=1000)
    entries = store.reconcile(diagnosis(), cooldown_s=600, now=1010)
    assert kinds(entries) == ["resolved"]
    assert entries[0].finding == finding()
    assert store.reconcile(diagnosis(), cooldown_s=600, now=1020) == []
    assert kinds(store.reconcile(diagnosis(finding()), cooldown_s=600, now=1030)) == ["new"]


def test_a_failing_source_does_not_resolve_what_it_measured(store: StateStore) -> None:
    store.reconcile(diagnosis(finding(pool="a"), finding(pool="b", source="elasticsearch")), cooldown_s=600, now=1)
    down = (SourceError(source="prometheus", message="connection refused"),)
    entries = store.reconcile(diagnosis(errors=down), cooldown_s=600, now=2)
    # "a" is held, its thread told once that its evidence could not be read; "b" is resolved.
    told = [(e.kind.value, e.finding.labels["pool"]) for e in entries if e.finding]
    assert told == [("repeat", "a"), ("resolved", "b")]
    assert "could not be read (prometheus: connection refused)" in str(entries[0].payload)
    assert [f.labels["pool"] for f in store.active_findings()] == ["a"]
    assert store.reconcile(diagnosis(errors=down), cooldown_s=600, now=3) == []


def test_below_the_minimum_severity_is_neither_kept_nor_notified(store: StateStore) -> None:
    assert store.reconcile(diagnosis(finding(severity="info")), cooldown_s=60, now=1) == []
    assert store.active_findings() == []
    entries = store.reconcile(diagnosis(finding(severity="info")), cooldown_s=60, min_severity=Severity.info, now=2)
    assert kinds(entries) == ["new"]


def test_a_follower_keeps_state_without_queueing_and_does_not_repeat_after_takeover(store: StateStore) -> None:
    assert store.reconcile(diagnosis(finding()), cooldown_s=600, notify=False, now=1000) == []
    assert store.pending_count() == 0
    # Now leader: the finding was already told by the old leader; nothing until the cooldown.
    assert store.reconcile(diagnosis(finding()), cooldown_s=600, now=1010) == []
    assert kinds(store.reconcile(diagnosis(finding()), cooldown_s=600, now=1600)) == ["repeat"]


def test_outbox_is_ordered_survives_reopening_and_remembers_threads(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    store = StateStore(path)
    store.reconcile(diagnosis(finding(pool="a")), cooldown_s=600, now=1)
    store.reconcile(diagnosis(finding(pool="a"), finding(pool="b")), cooldown_s=600, now=2)
    store.reconcile(diagnosis(finding(pool="b")), cooldown_s=600, now=3)
    store.enqueue(NotificationKind.alert_report, AlertReportPayload(diagnosis=diagnosis(), alert="X"))
    store.close()

    reopened = StateStore(path)
    pending = reopened.pending()
    assert [(e.kind.value, e.finding.labels["pool"] if e.finding else None) for e in pending] == [
        ("new", "a"), ("new", "b"), ("resolved", "a"), ("alert_report", None)
    ]
    reopened.begin_attempt(pending[0].id, marker="dgn-1")
    reopened.attempt_failed(pending[0].id, "Slack unreachable", retry_at=0, in_doubt=False)
    assert reopened.pending()[0].attempts == 1
    reopened.mark_sent(pending[0].id, channel="C1", ts="1700000000.000101")
    assert reopened.thread_of(fingerprint(finding(pool="a"))) == ("C1", "1700000000.000101")
    reopened.mark_sent(pending[2].id, channel="C1", ts="1700000000.000105")  # a reply does not move the thread
    assert reopened.thread_of(fingerprint(finding(pool="a"))) == ("C1", "1700000000.000101")
    assert [e.id for e in reopened.pending()] == [pending[1].id, pending[3].id]
    assert reopened.integrity_ok()
    reopened.close()


def test_a_failed_reconcile_leaves_nothing_half_written(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.reconcile(diagnosis(finding(pool="a")), cooldown_s=600, now=1)

    def boom(*args: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(store, "_enqueue", boom)
    with pytest.raises(RuntimeError):
        store.reconcile(diagnosis(finding(pool="b")), cooldown_s=600, now=2)
    monkeypatch.undo()
    assert [f.labels["pool"] for f in store.active_findings()] == ["a"]
    assert store.pending_count() == 1
    # The decision is taken again, whole, on the next run.
    assert kinds(store.reconcile(diagnosis(finding(pool="b")), cooldown_s=600, now=3)) == ["new", "resolved"]


def test_a_silenced_finding_stays_active_and_is_not_resolved(store: StateStore) -> None:
    from diagnoser.config import Silence
    from diagnoser.engine.silences import apply_silences

    store.reconcile(diagnosis(finding()), cooldown_s=60, now=1000)
    silence = Silence(matchers={"pool": "orders-db"}, until=datetime(2099, 1, 1, tzinfo=UTC), comment="known")
    kept, silenced = apply_silences([finding()], [silence], AT)
    assert kept == [] and [s.comment for s in silenced] == ["known"]
    quiet = [fingerprint(s) for s in silenced]
    assert store.reconcile(diagnosis(*kept), cooldown_s=60, now=1010, silenced=quiet) == []
    assert [f.rule_id for f in store.active_findings()] == ["pools/pool-exhaustion"]
    # Without the silence it would have been resolved.
    assert kinds(store.reconcile(diagnosis(), cooldown_s=60, now=1020)) == ["resolved"]
