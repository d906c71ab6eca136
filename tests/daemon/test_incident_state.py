"""The incidents' lifecycle, decision by decision, on the state store with a clock the test sets.

pending_for, resolve_after, reopen_within, a cause found after its symptom, two incidents merged,
a digest for a burst, and no resolution for an incident whose first message never landed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from diagnoser.daemon.incidents import IncidentPolicy, group_findings
from diagnoser.daemon.state import StateStore
from diagnoser.models import Diagnosis, Evidence, Finding, Severity
from diagnoser.notify.outbox import OutboxEntry
from diagnoser.notify.payloads import IncidentPayload

AT = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


def cause(pool: str = "orders", service: str = "checkout", value: float = 0.97) -> Finding:
    return Finding(
        rule_id="pools/pool-exhaustion", cause="connection_pool_exhaustion", kind="cause",
        severity=Severity.critical, title=f"Pool {pool} exhausted", summary=f"pool {pool}: {value:.0%} in use",
        evidence=[Evidence(source="prometheus", query="q", value=value, threshold=0.95)],
        labels={"namespace": "shop", "service": service, "pool": pool}, explains=["latency_slo_breach"],
    )


def symptom(service: str = "checkout") -> Finding:
    return Finding(
        rule_id="http/latency-slo-breach", cause="latency_slo_breach", kind="symptom", severity=Severity.warning,
        title=f"p99 over SLO on {service}", summary="p99 900 ms", labels={"namespace": "shop", "service": service},
    )


def run(store: StateStore, *findings: Finding, now: float, policy: IncidentPolicy) -> list[OutboxEntry]:
    diagnosis = Diagnosis(evaluated_at=AT, findings=list(findings))
    return store.reconcile(diagnosis, cooldown_s=policy.cooldown_s, now=now, policy=policy)


def kinds(entries: list[OutboxEntry]) -> list[str]:
    return [e.kind.value for e in entries]


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return StateStore(tmp_path / "state.sqlite3")


def test_a_cause_folds_in_the_symptoms_it_explains_in_its_scope_only() -> None:
    groups = group_findings([cause(), symptom(), symptom("billing")])
    assert [(g.lead.cause, [f.labels["service"] for f in g.explained]) for g in groups] == [
        ("connection_pool_exhaustion", ["checkout"]),
        ("latency_slo_breach", []),
    ]
    assert groups[1].lead.labels["service"] == "billing"


def test_pending_for_holds_the_first_message_and_a_shorter_blip_is_never_posted(store: StateStore) -> None:
    policy = IncidentPolicy(pending_for_s=10, resolve_after_s=0)
    assert run(store, cause(), now=0, policy=policy) == []
    assert run(store, now=5, policy=policy) == []  # gone before it held: forgotten
    assert run(store, cause(), now=6, policy=policy) == []
    assert run(store, cause(), now=12, policy=policy) == []  # held 6 s since it came back
    assert kinds(run(store, cause(), now=16, policy=policy)) == ["new"]


def test_resolve_after_keeps_a_flapping_incident_open_and_resolves_it_once(store: StateStore) -> None:
    policy = IncidentPolicy(resolve_after_s=30)
    assert kinds(run(store, cause(), now=0, policy=policy)) == ["new"]
    said: list[str] = []
    for t in range(10, 300, 20):  # present 10 s, absent 10 s, for five minutes
        said += kinds(run(store, now=t, policy=policy))
        said += kinds(run(store, cause(), now=t + 10, policy=policy))
    assert said == []
    assert run(store, now=320, policy=policy) == []
    entries = run(store, now=350, policy=policy)
    assert kinds(entries) == ["resolved"]
    payload = entries[0].payload
    assert isinstance(payload, IncidentPayload)
    assert payload.view.state == "resolved" and payload.view.resolve_after_s == 30


def test_back_within_reopen_within_reopens_its_incident_and_later_is_a_new_one(store: StateStore) -> None:
    policy = IncidentPolicy(reopen_within_s=1800)
    first = run(store, cause(), now=0, policy=policy)
    assert kinds(run(store, now=10, policy=policy)) == ["resolved"]
    back = run(store, cause(), now=130, policy=policy)  # two minutes after it cleared
    assert kinds(back) == ["reopened"]
    assert back[0].incident_id == first[0].incident_id
    assert kinds(run(store, now=140, policy=policy)) == ["resolved"]
    again = run(store, cause(), now=140 + 3600, policy=policy)
    assert kinds(again) == ["new"] and again[0].incident_id != first[0].incident_id


def test_a_cause_found_after_its_symptom_leads_the_same_incident(store: StateStore) -> None:
    policy = IncidentPolicy()
    first = run(store, symptom(), now=0, policy=policy)
    assert kinds(first) == ["new"]
    changed = run(store, cause(), symptom(), now=10, policy=policy)
    assert [(e.kind.value, e.incident_id) for e in changed] == [("severity_changed", first[0].incident_id)]
    payload = changed[0].payload
    assert isinstance(payload, IncidentPayload)
    assert payload.view.lead.cause == "connection_pool_exhaustion"
    assert [f.cause for f in payload.view.explained] == ["latency_slo_breach"]
    # The symptom clears: an edit, no new message.
    assert kinds(run(store, cause(), now=20, policy=policy)) == ["update"]
    assert run(store, cause(), now=30, policy=policy) == []


def test_a_warning_cause_found_later_is_an_edit_and_a_rate_limited_reply(store: StateStore) -> None:
    policy = IncidentPolicy(reply_min_interval_s=300)
    warning = cause().model_copy(update={"severity": Severity.warning})
    run(store, symptom(), now=0, policy=policy)
    (entry,) = run(store, warning, symptom(), now=10, policy=policy)
    assert entry.kind.value == "cause_changed"
    assert isinstance(entry.payload, IncidentPayload) and entry.payload.note is not None
    assert entry.payload.note.startswith("Cause found: connection_pool_exhaustion")


def test_a_lone_symptom_incident_a_cause_comes_to_explain_is_merged_into_the_cause(store: StateStore) -> None:
    policy = IncidentPolicy(resolve_after_s=100)
    lone = run(store, symptom(), now=0, policy=policy)
    alone = run(store, cause(), now=10, policy=policy)  # the symptom is away for a moment
    assert kinds(alone) == ["new"] and alone[0].incident_id != lone[0].incident_id
    entries = run(store, cause(), symptom(), now=20, policy=policy)
    by_incident = {e.incident_id: e for e in entries}
    kept, merged = by_incident[alone[0].incident_id], by_incident[lone[0].incident_id]
    assert kept.kind.value == "update"  # the symptom is a line of the cause's message now
    assert isinstance(kept.payload, IncidentPayload)
    assert [f.cause for f in kept.payload.view.explained] == ["latency_slo_breach"]
    assert merged.kind.value == "update"
    assert isinstance(merged.payload, IncidentPayload) and merged.payload.view.state == "merged"
    # Merged for good: nothing more about it, and no resolution once the symptom clears.
    assert [e.incident_id for e in run(store, cause(), now=30, policy=policy)] == [alone[0].incident_id]
    assert all(e.incident_id != lone[0].incident_id for e in run(store, cause(), now=300, policy=policy))


def test_a_finding_stays_in_its_incident_while_the_incident_lives(store: StateStore) -> None:
    policy = IncidentPolicy(resolve_after_s=100)
    first = run(store, cause(), symptom(), now=0, policy=policy)
    assert kinds(first) == ["new"]
    # The cause is away for a cycle: the symptom stays a line of the same incident, no new post.
    entries = run(store, symptom(), now=10, policy=policy)
    assert all(e.kind.value not in ("new", "digest") for e in entries)
    assert {e.incident_id for e in entries} <= {first[0].incident_id}
    assert all(e.kind.value != "new" for e in run(store, cause(), symptom(), now=20, policy=policy))


def test_more_than_the_threshold_at_once_is_one_digest_then_their_messages(store: StateStore) -> None:
    policy = IncidentPolicy(digest_threshold=5)
    five = run(store, *(cause(f"p{n}") for n in range(5)), now=0, policy=policy)
    assert kinds(five) == ["new"] * 5
    still = [cause(f"p{n}") for n in range(5)]
    burst = run(store, *still, *(cause(f"q{n}", service="search") for n in range(6)), now=1, policy=policy)
    assert kinds(burst) == ["digest"] + ["new"] * 6
    assert all(isinstance(e.payload, IncidentPayload) and e.payload.in_digest for e in burst[1:])


def test_no_resolution_for_an_incident_whose_first_message_never_landed(store: StateStore) -> None:
    policy = IncidentPolicy()
    (new,) = run(store, cause(), now=0, policy=policy)
    store.dead_letter(new.id, "Slack refused the message: HTTP 200 invalid_auth", reason="invalid_auth", now=1)
    assert run(store, now=10, policy=policy) == []
    assert [kind for _, kind, _ in store.dead_letters()] == ["new"]
    # Replayed (the token is fixed): back in its place, its incident waiting for it again.
    assert store.retry_dead_letters(now=20) == 1
    assert [e.id for e in store.pending()] == [new.id]
    thread = store.incident_thread(new.incident_id or 0)
    assert thread is not None and thread.landed == 0


def test_dead_letters_are_retried_after_a_while_a_few_times_never_those_that_cannot_render(
    store: StateStore,
) -> None:
    policy = IncidentPolicy()
    a, b = run(store, cause("a"), cause("b"), now=0, policy=policy)
    store.dead_letter(a.id, "invalid_auth", reason="invalid_auth", now=100)
    store.dead_letter(b.id, "cannot render", reason="render", now=100)
    assert store.retry_dead_letters(older_than_s=60, max_retries=2, now=150) == 0
    assert store.retry_dead_letters(older_than_s=60, max_retries=2, now=160) == 1
    for n in (1, 2):
        store.dead_letter(a.id, "invalid_auth", reason="invalid_auth", now=200 * n)
        assert store.retry_dead_letters(older_than_s=60, max_retries=2, now=200 * n + 60) == (1 if n < 2 else 0)
    assert sorted(i for i, _, _ in store.dead_letters()) == [a.id, b.id]


def test_a_success_resets_the_others_backoff(store: StateStore) -> None:
    policy = IncidentPolicy()
    a, b, c = run(store, cause("a"), cause("b"), cause("c"), now=0, policy=policy)
    for entry in (a, b, c):
        store.attempt_failed(entry.id, "Slack unreachable", retry_at=500, in_doubt=False)
    store.mark_sent(a.id, channel="C1", ts="1.000100")
    store.reset_backoff(except_id=a.id)
    assert [(e.id, e.next_attempt_at) for e in store.pending()] == [(b.id, 0.0), (c.id, 0.0)]


def test_an_incident_with_a_cause_of_its_own_is_never_folded_into_another(store: StateStore) -> None:
    policy = IncidentPolicy(resolve_after_s=100)
    errors = symptom().model_copy(update={"rule_id": "http/error-rate", "cause": "error_rate_breach"})
    empty = Finding(
        rule_id="probe/empty", cause="empty_success_response", kind="cause", severity=Severity.critical,
        title="Empty 200s", summary="12% empty", labels={"target": "http://x"}, explains=["error_rate_breach"],
    )
    pool = cause().model_copy(update={"explains": ["latency_slo_breach", "error_rate_breach"]})
    (first,) = run(store, errors, empty, now=0, policy=policy)
    entries = run(store, errors, empty, pool, symptom(), now=10, policy=policy)
    assert kinds(entries) == ["new"] and entries[0].incident_id != first.incident_id
    # The pool clears: its incident resolves; the empty answers' incident goes on, untouched.
    later = run(store, errors, empty, now=20, policy=policy) + run(store, errors, empty, now=200, policy=policy)
    assert [(e.kind.value, e.incident_id) for e in later] == [("resolved", entries[0].incident_id)]


def test_an_incident_whose_cause_is_gone_keeps_it_and_is_not_taken_over(store: StateStore) -> None:
    policy = IncidentPolicy(resolve_after_s=100)
    errors = symptom().model_copy(update={"rule_id": "http/error-rate", "cause": "error_rate_breach"})
    empty = Finding(
        rule_id="probe/empty", cause="empty_success_response", kind="cause", severity=Severity.critical,
        title="Empty 200s", summary="12% empty", labels={"target": "http://x"}, explains=["error_rate_breach"],
    )
    pool = cause().model_copy(update={"explains": ["latency_slo_breach", "error_rate_breach"]})
    (first,) = run(store, pool, errors, now=0, policy=policy)
    # The pool is fixed; the errors last a little longer and another cause that explains them appears.
    entries = run(store, errors, empty, now=10, policy=policy)
    # The pool's message is edited to say its cause is not seen now; the errors stay in it.
    assert [(e.kind.value, e.incident_id == first.incident_id) for e in entries] == [
        ("new", False), ("update", True)]  # fmt: skip
    edited = entries[1].payload
    assert isinstance(edited, IncidentPayload) and edited.view.earlier_cause is not None
    assert edited.view.lead.cause == "error_rate_breach"
    shown = store.incident_thread(first.incident_id or 0)
    assert shown is not None
    assert run(store, errors, empty, now=100, policy=policy) == []
    # Resolution follows the cause: clear for resolve_after since it cleared at 10, whatever the errors do.
    (resolved,) = run(store, errors, empty, now=111, policy=policy)
    assert resolved.kind.value == "resolved" and resolved.incident_id == first.incident_id
    assert resolved.finding is not None and resolved.finding.cause == "connection_pool_exhaustion"
    assert isinstance(resolved.payload, IncidentPayload) and "still recovering: error_rate_breach" in (
        resolved.payload.note or "")
    # The errors recover later: said in the thread, once; no new incident for them meanwhile.
    assert run(store, errors, empty, now=150, policy=policy) == []
    (recovered,) = run(store, empty, now=160, policy=policy)
    assert recovered.incident_id == first.incident_id
    assert isinstance(recovered.payload, IncidentPayload)
    assert recovered.payload.note == "Symptoms recovered 2.5 min after the cause cleared"
    assert run(store, empty, now=170, policy=policy) == []


def test_serve_replay_dead_letters_puts_them_back_in_their_place(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    path = tmp_path / "state.sqlite3"
    store = StateStore(path)
    (new,) = run(store, cause(), now=0, policy=IncidentPolicy())
    store.dead_letter(new.id, "Slack refused the message: HTTP 200 invalid_auth", reason="invalid_auth", now=1)
    store.close()
    result = run_cli("serve", "--state", str(path), "--replay-dead-letters")
    assert result.code == 0, result.stderr
    assert f"1 dead-lettered notification(s) queued again in {path}" in result.stdout
    reopened = StateStore(path)
    try:
        assert [e.id for e in reopened.pending()] == [new.id] and reopened.dead_letters() == []
    finally:
        reopened.close()


def test_pending_for_counts_from_the_onset_the_rule_detected(store: StateStore) -> None:
    policy = IncidentPolicy(pending_for_s=120)
    began = cause().model_copy(update={"since": datetime.fromtimestamp(1000 - 100, UTC)})
    assert run(store, began, now=1000, policy=policy) == []  # held 100 s of 120
    assert kinds(run(store, began, now=1020, policy=policy)) == ["new"]


def test_a_rule_that_confirms_over_the_window_has_held_it_when_found(store: StateStore) -> None:
    policy = IncidentPolicy(pending_for_s=120, confirm_s=120, confirming_rules=frozenset({"pools/pool-exhaustion"}))
    assert kinds(run(store, cause(), now=1000, policy=policy)) == ["new"]
    other = symptom("billing")  # its rule does not confirm: pending_for from its first evaluation
    assert run(store, cause(), other, now=1001, policy=policy) == []
    assert kinds(run(store, cause(), other, now=1121, policy=policy)) == ["new"]


def test_resolution_follows_the_lead_cause_and_says_what_still_recovers(store: StateStore) -> None:
    policy = IncidentPolicy(resolve_after_s=60)
    assert kinds(run(store, cause(), symptom(), now=0, policy=policy)) == ["new"]
    (edit,) = run(store, symptom(), now=10, policy=policy)  # fixed; the p99 window still decays
    assert isinstance(edit.payload, IncidentPayload) and edit.kind.value == "update"
    assert edit.payload.view.earlier_cause is not None and edit.payload.view.lead.cause == "latency_slo_breach"
    assert run(store, symptom(), now=60, policy=policy) == []
    (resolved,) = run(store, symptom(), now=70, policy=policy)
    assert resolved.kind.value == "resolved" and isinstance(resolved.payload, IncidentPayload)
    assert resolved.payload.view.lead.cause == "connection_pool_exhaustion"
    assert resolved.payload.note == "Resolved: its cause cleared 1 min ago; still recovering: latency_slo_breach"
    (recovered,) = run(store, now=100, policy=policy)
    assert isinstance(recovered.payload, IncidentPayload)
    assert recovered.payload.note == "Symptoms recovered 1.5 min after the cause cleared"


def test_a_symptom_back_without_its_cause_is_told_so_and_stays_open_while_it_lasts(store: StateStore) -> None:
    policy = IncidentPolicy(resolve_after_s=30, reopen_within_s=1800)
    (first,) = run(store, cause(), symptom(), now=0, policy=policy)
    assert run(store, now=10, policy=policy) == []
    assert kinds(run(store, now=40, policy=policy)) == ["resolved"]
    (back,) = run(store, symptom(), now=100, policy=policy)
    assert back.kind.value == "reopened" and back.incident_id == first.incident_id
    assert isinstance(back.payload, IncidentPayload) and back.payload.view.lead.cause == "latency_slo_breach"
    assert "latency_slo_breach is back; connection_pool_exhaustion is not seen now" in (back.payload.note or "")
    assert run(store, symptom(), now=200, policy=policy) == []  # what came back is still there
    assert run(store, now=210, policy=policy) == []
    assert kinds(run(store, now=241, policy=policy)) == ["resolved"]
