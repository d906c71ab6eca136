"""``diagnose capacity``: find the highest rate that holds the SLO, and name what breaks first.

Open-loop steps of increasing rate (:mod:`.step`, chosen by :mod:`.search`), each judged on the
probe's own histograms; the rule pack evaluated as of each step's end (:mod:`.run`); the
bottleneck is the cause that appears between the last step that held and the first that
failed (:mod:`.bottleneck`). Reports render as a table, Markdown, JSON (:mod:`.report`), a
picture (:mod:`.plot`) and a Slack message (:mod:`.slack`). ::

    inputs = CapacityInputs.from_settings(settings)
    run = CapacityRun(plan, inputs, CapacityOptions(start_rate=50, max_rate=1000))
    report = await run.run()
    print(report.capacity_rps, report.limit, report.bottleneck)
"""

from __future__ import annotations

from diagnoser.capacity.bottleneck import EvaluatedStep, find_bottleneck
from diagnoser.capacity.report import Bottleneck, CapacityReport, CapacityStep, Limit, SloTarget, StepLatency
from diagnoser.capacity.run import CapacityInputs, CapacityOptions, CapacityRun
from diagnoser.capacity.search import RateSearch
from diagnoser.capacity.step import StepMeasurement, StepPlan, run_step

__all__ = [
    "Bottleneck",
    "CapacityInputs",
    "CapacityOptions",
    "CapacityReport",
    "CapacityRun",
    "CapacityStep",
    "EvaluatedStep",
    "Limit",
    "RateSearch",
    "SloTarget",
    "StepLatency",
    "StepMeasurement",
    "StepPlan",
    "find_bottleneck",
    "run_step",
]
