"""Honest steps: a step that reached no steady state is unsustainable, and a server that refuses
work at a rate sheds load there.

The tallies and results here come from the probe's own recorder, counter and merge (what a step's
watcher and a worker's coordinator read), fed a schedule of sends and answers; the live runs
against real servers are in ``test_capacity_honest_live.py``.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rich.console import Console

from diagnoser.capacity.render import render_capacity_markdown, render_capacity_table, step_cells, text_chart
from diagnoser.capacity.report import Bottleneck, CapacityReport, CapacityStep, Limit, SloTarget, StepLatency
from diagnoser.capacity.run import CapacityInputs, CapacityOptions, CapacityRun, _Step
from diagnoser.capacity.shedding import load_shedding
from diagnoser.capacity.slack import render_capacity_report
from diagnoser.capacity.step import StepMeasurement, StepPlan
from diagnoser.capacity.sustain import StepSample, judge_sustain
from diagnoser.probe import build_spec
from diagnoser.probe.live import SlowCounter
from diagnoser.probe.parts import merge_parts, part_of
from diagnoser.probe.result import ERROR_RATIO_ABORT, PhaseShares, ProbeRecorder, ProbeResult

TICK_S = 0.25
AT = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def answer(recorder: ProbeRecorder, status: int | str | None = 200, failure: str | None = None,
           lag_s: float = 0.0001) -> None:  # fmt: skip
    recorder.record(latency_s=0.01 if status is not None else None, service_s=0.01, lag_s=lag_s,
                    opened_connection=False, connect_s=None, tls_s=None, ttfb_s=0.009, body_s=0.001,
                    status=status, failure=failure)  # fmt: skip


def watched(rate: float, served: float, seconds: float = 3.0, *, first_answer_s: float = 0.0,
            stall_at: float | None = None) -> list[StepSample]:  # fmt: skip
    """What a step's watcher samples, every quarter second, of a service answering ``served``
    requests per second (from ``first_answer_s``) while ``rate`` are sent; ``stall_at``: one tick
    with no answer, caught up at the next."""
    recorder = ProbeRecorder()
    counter = SlowCounter(recorder, 100.0)
    samples: list[StepSample] = []
    owed = 0.0
    for tick in range(1, round(seconds / TICK_S) + 1):
        elapsed = tick * TICK_S
        recorder.sent = round(rate * elapsed)  # as the open loop's dispatch counts them
        if elapsed > first_answer_s:
            owed += served * TICK_S
        if stall_at is None or abs(elapsed - stall_at) > TICK_S / 2:
            while owed >= 1 and recorder.finished < recorder.sent:
                answer(recorder)
                owed -= 1
        tally = counter.tally()
        samples.append(StepSample(elapsed, tally.completed, tally.sent, tally.in_flight, tally.send_lag_s))
    return samples


def test_a_backlog_growing_through_the_step_is_unsustainable() -> None:
    verdict = judge_sustain(watched(rate=160, served=100), 160)
    assert verdict is not None and verdict.cause == "backlog"
    assert verdict.in_flight == 180  # 60 requests a second piled up for 3 s
    assert verdict.growth_per_s is not None and abs(verdict.growth_per_s - 60) <= 5
    assert verdict.text == "unsustainable (backlog 180 in flight, growing)"


def test_a_steady_step_is_sustainable_through_a_stall_and_a_ramp() -> None:
    assert judge_sustain(watched(rate=100, served=100), 100) is None
    # One stall of the host: every answer of a quarter second late, then caught up.
    assert judge_sustain(watched(rate=100, served=100, stall_at=2.5), 100) is None
    # A slow but steady service: 60 requests in flight once the first answers come, 0.6 s in.
    assert judge_sustain(watched(rate=100, served=100, first_answer_s=0.6), 100) is None
    # Too short to tell.
    assert judge_sustain(watched(rate=160, served=100, seconds=1.0), 160) is None


def test_a_small_shortfall_is_a_p99_not_a_backlog() -> None:
    # 5 % short of the offered rate: a queue, but slow enough that the step's p99 tells it.
    assert judge_sustain(watched(rate=200, served=190), 200) is None


def test_a_sender_falling_further_behind_its_schedule_is_unsustainable() -> None:
    samples = [StepSample(t * TICK_S, 0, 25 * t, 0, 0.12 * t * TICK_S) for t in range(1, 13)]
    verdict = judge_sustain(samples, 100)
    assert verdict is not None and verdict.cause == "schedule" and verdict.behind_s == 0.36
    assert verdict.text == "unsustainable (send schedule behind by 0.36 s)"
    # A constant lag (a busy host) is not falling behind.
    assert judge_sustain([StepSample(t * TICK_S, 0, 25 * t, 0, 0.2) for t in range(1, 13)], 100) is None


def test_the_send_lag_is_taken_per_tally() -> None:
    recorder = ProbeRecorder()
    counter = SlowCounter(recorder, None)
    recorder.send_lag_max_s = 0.3  # as the open loop's dispatch keeps it
    assert counter.tally().send_lag_s == 0.3
    assert counter.tally().send_lag_s == 0.0


# -- load shedding ----------------------------------------------------------------------------


def result_of(recorder: ProbeRecorder, seconds: float = 3.0, lag_limit_ms: float = 2.0) -> ProbeResult:
    return recorder.build(target="http://127.0.0.1/", requested_rate=200, elapsed_s=seconds, aborted=False,
                          abort_reason=None, lag_limit_ms=lag_limit_ms)  # fmt: skip


def recorded(ok: int, refused: dict[int | str, int], other: dict[str, int] | None = None,
             lag_s: float = 0.0001) -> ProbeRecorder:  # fmt: skip
    recorder = ProbeRecorder()
    for _ in range(ok):
        answer(recorder, lag_s=lag_s)
    for status, count in refused.items():
        for _ in range(count):
            answer(recorder, status, "status", lag_s=lag_s)
    for failure, count in (other or {}).items():
        for _ in range(count):
            answer(recorder, None, failure, lag_s=lag_s)
    recorder.sent = recorder.finished
    return recorder


def test_refusals_at_a_rate_are_load_shedding_at_the_rate_answered() -> None:
    shed = load_shedding(200, result_of(recorded(300, {503: 240, 429: 60})))
    assert shed is not None and shed.kind == "load_shedding" and shed.cause == "load_shedding"
    assert shed.rule_id is None and shed.runbook_url is None
    assert shed.summary.startswith("the server sheds load at ~100 req/s: at 200 req/s it refused 50%")
    assert "503 x240, 429 x60" in shed.summary
    assert shed.evidence[0].value == 100.0


def test_shedding_measured_over_a_step_cut_by_the_abort_rule_says_it_is_rough() -> None:
    result = recorded(40, {503: 60}).build(target="http://127.0.0.1/", requested_rate=200, elapsed_s=0.5,
                                           aborted=True, abort_reason=ERROR_RATIO_ABORT + "60% over the last 1 s",
                                           lag_limit_ms=2.0)  # fmt: skip
    shed = load_shedding(200, result)
    assert shed is not None and shed.summary.startswith("the server sheds load at ~80 req/s")
    assert "(over 0.5 s only: the probe's abort rule stopped the step, so the rate is rough" in shed.summary


def test_grpc_refusals_are_load_shedding_too_and_a_message_too_large_is_not() -> None:
    # As the gRPC run records them: a status name, a ``status`` failure.
    shed = load_shedding(200, result_of(recorded(330, {"UNAVAILABLE": 200, "RESOURCE_EXHAUSTED": 70})))
    assert shed is not None and shed.summary.startswith("the server sheds load at ~110 req/s")
    recorder = ProbeRecorder()
    for _ in range(300):
        answer(recorder)
    for _ in range(100):
        answer(recorder, "RESOURCE_EXHAUSTED", "too_large")  # the answer was over the size limit
    assert load_shedding(200, result_of(recorder)) is None


def test_failures_that_are_not_refusals_are_not_load_shedding() -> None:
    assert load_shedding(200, result_of(recorded(300, {503: 40}, {"timeout": 200}))) is None
    assert load_shedding(200, result_of(recorded(300, {500: 200}))) is None
    assert load_shedding(200, result_of(recorded(300, {}))) is None


def test_shedding_merges_exactly_over_workers() -> None:
    parts = [part_of(recorded(150, {503: 150}), index=i, elapsed_s=3.0, aborted=False, abort_reason=None,
                     cpu_s=0.1) for i in range(2)]  # fmt: skip
    merged = merge_parts(parts, PhaseShares(), target="http://127.0.0.1/", requested_rate=200, lag_limit_ms=2.0)
    shed = load_shedding(200, merged)
    assert shed is not None and shed.summary.startswith("the server sheds load at ~100 req/s")
    assert merged.status_counts == {"200": 300, "503": 300}


def _run_report(measurement: StepMeasurement, held: StepMeasurement) -> CapacityReport:
    spec, _ = build_spec("http://127.0.0.1:9/", rate=1, duration_s=3)
    plan = StepPlan(spec=spec, explicit_target=True, step_s=3, min_step_s=3, slo_p99_ms=50, max_error_ratio=0.001)
    run = CapacityRun(plan, CapacityInputs(), CapacityOptions(start_rate=100, max_rate=400, fixed_steps=[100, 200]))
    run.search.record(100, held=True)
    run.search.record(200, held=False)
    return run._report([_Step(held, None), _Step(measurement, None)], None)


def _measured(rate: float, result: ProbeResult, failed_on: str | None, **extra: object) -> StepMeasurement:
    return StepMeasurement(rate=rate, result=result, started_at=AT, ended_at=AT, served_rate=rate,
                           failed_on=failed_on, stopped_early=False, interrupted=False, **extra)  # type: ignore[arg-type]  # fmt: skip


def test_a_shedding_knee_names_the_shedding_and_no_unrelated_schedule_note() -> None:
    # A busy host: the sender's lag p99 over its limit, which would add the scheduler note.
    failing = result_of(recorded(300, {503: 300}, lag_s=0.01))
    assert failing.bottleneck == "scheduler"
    report = _run_report(_measured(200, failing, "errors"), _measured(100, result_of(recorded(300, {})), None))
    assert report.bottleneck is not None and report.bottleneck.kind == "load_shedding"
    assert report.limit is Limit.errors and report.capacity_rps == 100
    assert report.notes == [
        "no Prometheus configured: what answers the refusals was not looked for (give --prometheus-url)"
    ]
    # The same busy host with a failure that is not shedding keeps the note.
    slow = result_of(recorded(600, {}, lag_s=0.01))
    report = _run_report(_measured(200, slow, "latency"), _measured(100, result_of(recorded(300, {})), None))
    assert report.bottleneck is None and any("fell behind its schedule" in note for note in report.notes)


# -- the views --------------------------------------------------------------------------------


def _step(rate: float, held: bool, **extra: object) -> CapacityStep:
    return CapacityStep(rate=rate, achieved_rate=rate, served_rate=rate, duration_s=3.0,
                        latency_ms=StepLatency(p50=5.0, p90=8.0, p99=1790.0 if not held else 10.0, max=2000.0),
                        error_ratio=0.0, held=held, failed_on=None if held else "latency", started_at=AT,
                        ended_at=AT, **extra)  # type: ignore[arg-type]  # fmt: skip


def test_views_show_unsustainable_instead_of_a_p99_and_shedding_without_a_runbook() -> None:
    backlog = judge_sustain(watched(rate=160, served=100), 160)
    shed = load_shedding(200, result_of(recorded(300, {503: 300})))
    assert backlog is not None and isinstance(shed, Bottleneck)
    report = CapacityReport(
        target="http://127.0.0.1:8080/", slo=SloTarget(p99_ms=100, error_ratio=0.001),
        steps=[_step(40, True), _step(160, False, unsustainable=backlog)], capacity_rps=40,
        limit=Limit.latency, bottleneck=shed, max_rate=400,
    )  # fmt: skip
    again = CapacityReport.model_validate_json(report.model_dump_json())
    assert again == report
    dumped = report.model_dump(mode="json")
    assert dumped["steps"][1]["unsustainable"] == {"cause": "backlog", "in_flight": 180, "behind_s": None,
                                                   "growth_per_s": backlog.growth_per_s}  # fmt: skip
    assert dumped["bottleneck"]["kind"] == "load_shedding" and dumped["bottleneck"]["rule_id"] is None
    cells = step_cells(report.steps[1])
    assert cells[4] == "unsustainable (backlog 180 in flight, growing)" and "1790.0" not in cells
    assert "unsustainable (backlog 180 in flight, growing)" in text_chart(report)
    console = Console(file=io.StringIO(), width=220)
    console.print(render_capacity_table(report))
    table = console.file.getvalue()  # type: ignore[attr-defined]
    markdown = render_capacity_markdown(report)
    for view in (table, markdown):
        assert "unsustainable (backlog 180 in flight, growing)" in view
        assert "the server sheds load at ~100 req/s" in view
        assert "runbook" not in view.lower() and "None" not in view
    message = render_capacity_report(report, at=AT)
    assert not [b for b in message.blocks if b["type"] == "actions"]  # no runbook button
    assert "the server sheds load at ~100 req/s" in str(message.blocks)
