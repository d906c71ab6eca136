"""The pure parts of ``diagnose capacity``: the search, the bottleneck analysis, the renderers."""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from diagnoser.capacity import (
    CapacityReport,
    CapacityStep,
    EvaluatedStep,
    Limit,
    RateSearch,
    SloTarget,
    StepLatency,
    find_bottleneck,
)
from diagnoser.capacity.plot import write_plot
from diagnoser.capacity.render import render_capacity_markdown, render_capacity_table, step_cells
from diagnoser.capacity.slack import render_capacity_report
from diagnoser.models import Evidence, Finding, Severity

# -- the search -------------------------------------------------------------------------------


def drive(search: RateSearch, knee: float, served_at_overload: float | None = None) -> list[float]:
    """Run the search against a service that holds every rate up to ``knee``."""
    tried = []
    while (rate := search.next_rate()) is not None:
        tried.append(rate)
        held = rate <= knee
        served = None if held else (served_at_overload if served_at_overload is not None else knee)
        search.record(rate, held=held, served_rate=served)
        assert len(tried) < 30
    return tried


def test_search_climbs_then_aims_at_the_served_rate() -> None:
    search = RateSearch(start_rate=50, max_rate=1000)
    tried = drive(search, knee=470)
    assert tried[:5] == [50, 100, 200, 400, 800]
    # The overloaded step served about 470 req/s: just below, then just above it, and done.
    assert tried[5:] == [451, 489]
    assert search.capacity == 451 and 489 - 451 <= 0.1 * 451
    assert all(rate <= 1000 for rate in tried)


def test_search_bisects_when_the_failing_step_gives_no_estimate() -> None:
    search = RateSearch(start_rate=100, max_rate=1000)
    tried = drive(search, knee=333, served_at_overload=400 * 0.99)  # not saturated: no estimate
    capacity, ceiling = search.capacity, search.lowest_failure
    assert capacity is not None and ceiling is not None
    assert capacity <= 333 < ceiling and ceiling - capacity <= 0.1 * capacity
    assert len(tried) <= 8


@pytest.mark.parametrize(
    ("start", "maximum", "knee", "expected"),
    [
        (50, 300, 10_000, [50, 100, 200, 300]),  # never above the maximum; stops when it holds
        (50, 1000, 10, [50]),  # the first step fails: nothing held, nothing narrowed
    ],
)
def test_search_bounds(start: float, maximum: float, knee: float, expected: list[float]) -> None:
    assert drive(RateSearch(start_rate=start, max_rate=maximum), knee) == expected


def test_a_rate_that_held_only_a_scouting_step_is_run_again_in_full_before_it_is_the_answer() -> None:
    search = RateSearch(start_rate=100, max_rate=400)
    for rate in (100, 200, 400):
        assert search.next_rate() == rate
        search.record(rate, held=True, scouted=True)
    assert search.next_rate() == 400  # the maximum held only a scouting step: confirm it
    search.record(400, held=True)
    assert search.next_rate() is None and search.capacity == 400


def test_a_scouted_rate_that_fails_its_confirmation_is_a_failure() -> None:
    search = RateSearch(start_rate=100, max_rate=1000)
    search.record(100, held=True, scouted=True)
    search.record(200, held=False, served_rate=105)  # the knee is about 105: nothing left between
    search.record(105, held=False, served_rate=104)
    assert search.next_rate() == 100  # the bracket is closed on a scouted rate: confirm it
    search.record(100, held=False)
    assert search.capacity is None and search.next_rate() is None


def test_fixed_steps_run_in_order_and_stop_at_the_first_failure() -> None:
    search = RateSearch(start_rate=1, max_rate=5000, fixed_steps=[1000, 2000, 3000, 4000, 5000])
    assert drive(search, knee=3500) == [1000, 2000, 3000, 4000]
    assert search.capacity == 3000


# -- the bottleneck ---------------------------------------------------------------------------


def finding(cause: str, value: float, *, kind: str = "cause", threshold: float = 0.95, pending: float = 0.0,
            rule_id: str | None = None, explains: tuple[str, ...] = ("latency_slo_breach",)) -> Finding:  # fmt: skip
    labels = {"job": "features", "pool": "redis"}
    return Finding(
        rule_id=rule_id or f"test/{cause}",
        cause=cause,
        kind=kind,  # type: ignore[arg-type]
        severity=Severity.critical,
        title=cause,
        summary=f"{cause} at {value}",
        evidence=[
            Evidence(source="prometheus", query="q1", labels=labels, value=value, threshold=threshold),
            Evidence(source="prometheus", query="q2", labels=labels, value=pending),
        ],
        recommendation=f"raise it ({value}, {pending})",
        runbook_url=f"https://runbooks/{cause}.md",
        labels=labels,
        explains=list(explains) if kind == "cause" else [],
    )


SYMPTOM = finding("latency_slo_breach", 0.2, kind="symptom", threshold=0.05)


def steps(held: list[Finding], failed: list[Finding], *more: tuple[float, list[Finding]]) -> list[EvaluatedStep]:
    result = [
        EvaluatedStep(rate=100, held=True, failed_on=None, findings=[]),
        EvaluatedStep(rate=400, held=True, failed_on=None, findings=held),
        EvaluatedStep(rate=440, held=False, failed_on="latency", findings=failed),
    ]
    result += [EvaluatedStep(rate=r, held=False, failed_on="latency", findings=f) for r, f in more]
    return result


def test_a_cause_that_appears_at_the_knee_is_the_bottleneck() -> None:
    pool = finding("connection_pool_exhaustion", 1.0, pending=12)
    bottleneck, notes = find_bottleneck(steps([], [pool, SYMPTOM]))
    assert bottleneck is not None and not notes
    assert bottleneck.cause == "connection_pool_exhaustion" and bottleneck.first_seen_at_rate == 440
    assert bottleneck.runbook_url == "https://runbooks/connection_pool_exhaustion.md"


def test_a_cause_already_there_unchanged_is_not_named_and_the_report_says_so() -> None:
    leak = finding("memory_leak", 0.9, threshold=0.8)
    bottleneck, notes = find_bottleneck(steps([leak], [finding("memory_leak", 0.91, threshold=0.8), SYMPTOM]))
    assert bottleneck is None
    assert notes and notes[0].startswith("no saturation signal found") and "400 req/s (held)" in notes[0]


def test_a_cause_whose_values_rose_at_the_knee_is_named_with_the_knee_recommendation() -> None:
    at_held = finding("connection_pool_exhaustion", 0.96, pending=0.5)
    at_failed = finding("connection_pool_exhaustion", 1.0, pending=30)
    bottleneck, _ = find_bottleneck(steps([at_held], [at_failed, SYMPTOM]))
    assert bottleneck is not None and bottleneck.cause == "connection_pool_exhaustion"
    assert bottleneck.first_seen_at_rate == 400
    assert bottleneck.recommendation == at_held.recommendation  # measured at the knee, not in overload


def test_new_causes_rank_before_risen_ones_then_by_what_they_explain_then_by_rise() -> None:
    risen = finding("node_cpu_saturation", 0.99, threshold=0.9, pending=50)
    unrelated = finding("memory_leak", 5.0, threshold=0.8, explains=())
    small = finding("connection_pool_exhaustion", 0.96)
    large = finding("queue_backlog", 900, threshold=100)
    failed = [finding("node_cpu_saturation", 0.99, threshold=0.9, pending=500), unrelated, small, large, SYMPTOM]
    bottleneck, _ = find_bottleneck(steps([risen], failed))
    assert bottleneck is not None and bottleneck.cause == "queue_backlog"


def test_when_the_first_failing_step_shows_nothing_a_higher_one_is_read_and_noted() -> None:
    pool = finding("connection_pool_exhaustion", 1.0, pending=40)
    bottleneck, notes = find_bottleneck(steps([], [SYMPTOM], (800, [pool, SYMPTOM])))
    assert bottleneck is not None and bottleneck.first_seen_at_rate == 800
    assert "440 req/s" in notes[0] and "800 req/s" in notes[0]


def test_without_prometheus_no_bottleneck_is_looked_for() -> None:
    evaluated = [EvaluatedStep(rate=100, held=True, failed_on=None, findings=None),
                 EvaluatedStep(rate=200, held=False, failed_on="latency", findings=None)]  # fmt: skip
    bottleneck, notes = find_bottleneck(evaluated)
    assert bottleneck is None and "--prometheus-url" in notes[0]


# -- the views --------------------------------------------------------------------------------

AT = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def step(rate: float, p99: float, held: bool, **extra: object) -> CapacityStep:
    return CapacityStep(
        rate=rate, achieved_rate=rate * 0.999, served_rate=rate, duration_s=5.0,
        latency_ms=StepLatency(p50=21.5, p90=30.25, p99=p99, max=p99 * 1.5), error_ratio=0.0 if held else 0.0125,
        held=held, failed_on=None if held else "latency", findings=[] if held else ["connection_pool_exhaustion"],
        new_findings=[] if held else ["connection_pool_exhaustion"], started_at=AT, ended_at=AT, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def report() -> CapacityReport:
    pool = finding("connection_pool_exhaustion", 1.0, pending=12)
    bottleneck, _ = find_bottleneck(steps([], [pool, SYMPTOM]))
    return CapacityReport(
        target="http://127.0.0.1:8080/v1/features?user=42",
        slo=SloTarget(p99_ms=50, error_ratio=0.001),
        steps=[step(100, 23.5, True), step(400, 41.25, True), step(800, 912.0, False), step(440, 77.5, False)],
        capacity_rps=400, limit=Limit.latency, bottleneck=bottleneck, findings=[pool, SYMPTOM],
        max_rate=1000, evidence_checked=True,
    )  # fmt: skip


def test_table_markdown_and_json_carry_the_same_figures() -> None:
    data = report()
    console = Console(file=io.StringIO(), width=220)
    console.print(render_capacity_table(data))
    table = console.file.getvalue()  # type: ignore[attr-defined]
    markdown = render_capacity_markdown(data)
    again = CapacityReport.model_validate_json(data.model_dump_json())
    assert again.model_dump() == data.model_dump()
    for view in (table, markdown):
        for s in data.steps:
            row = next(line for line in view.splitlines() if line.strip(" |").startswith(f"{s.rate:g} "))
            for cell in step_cells(s)[:7]:
                assert cell in row, (cell, row)
        assert "capacity 400 req/s at p99 <= 50 ms" in view and "limit: latency" in view
        assert "connection_pool_exhaustion" in view and "https://runbooks/connection_pool_exhaustion.md" in view
    assert "<- capacity" in table  # the text chart marks the knee


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_plots_are_valid_pictures(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"knee{suffix}"
    write_plot(report(), path)
    if suffix == ".svg":
        assert ET.parse(path).getroot().tag.endswith("svg")
    else:
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 400


def test_slack_message_has_the_table_the_knee_the_bottleneck_and_the_runbook_button() -> None:
    message = render_capacity_report(report(), at=AT)
    text = str(message.blocks)
    assert message.blocks[0]["type"] == "header" and "Capacity of" in message.blocks[0]["text"]["text"]
    assert "capacity 400 req/s" in message.text and "connection_pool_exhaustion" in message.text
    table = next(b["text"]["text"] for b in message.blocks if b["type"] == "section" and "```" in b["text"]["text"])
    assert all(f"{s.rate:g}" in table for s in report().steps) and "912.0" in table
    buttons = [e for b in message.blocks if b["type"] == "actions" for e in b["elements"]]
    assert buttons == [{"type": "button", "text": {"type": "plain_text", "text": "Runbook", "emoji": False},
                        "url": "https://runbooks/connection_pool_exhaustion.md", "action_id": "runbook"}]  # fmt: skip
    assert len(message.blocks) <= 50 and math.isfinite(len(text))
