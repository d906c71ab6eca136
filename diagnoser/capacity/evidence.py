"""A step's evidence: the rule pack evaluated as of the step's end, once Prometheus holds all of it.

Prometheus stamps a sample with the instant its scrape *started* and stores it when the answer
is in. A service at its knee answers its scrape slowly (up to 350 ms measured on a busy 2-core
host, the feature service overloaded at 1 s scrapes), so when a step ends, the sample of its last
second, often the most loaded one, can still be in flight; evaluated at once, the step would be
read without it, and what gave way at the first failing step could go unnamed. So before the
rule pack is evaluated:

- wait until every target scraped during the step has a sample stamped at or after the step's
  end (``timestamp(up)``, which any PromQL backend holding ``up`` answers), for at most
  ``SETTLE_MAX_S``: a scrape that started before the end has then been stored;
- choose the window: the step's own whole seconds (nothing before it), widened only when it
  holds fewer than two successful scrapes of any target, since ``rate()`` needs two samples (a
  step shorter than two scrape intervals).

::

    diagnosis = await evaluate_step(rules, config, sources, started_at=..., ended_at=...)
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from datetime import UTC, datetime

from diagnoser.engine import BuiltSources, DiagnosisConfig, run_diagnosis
from diagnoser.models import Diagnosis, SourceError
from diagnoser.ruleset import RuleSet
from diagnoser.sources import Sources
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["SETTLE_MAX_S", "evaluate_step", "settle", "step_window_s"]

log = logging.getLogger(__name__)

#: The longest wait for a step's last scrapes: a target scraped every 30 s answers within it.
SETTLE_MAX_S = 60.0
_POLL_S = 0.25
#: The widest window a short step's evidence is read over.
_MAX_WINDOW_S = 300


async def evaluate_step(
    rules: RuleSet, config: DiagnosisConfig, sources: Sources, *, started_at: datetime, ended_at: datetime
) -> Diagnosis:
    """The rule pack as of ``ended_at``, once its scrapes are in, over a window covering the step.

    Through the one pipeline (:func:`~diagnoser.engine.run_diagnosis`): silences keep a silenced
    cause from being named the bottleneck, the deadline bounds the evaluation, coverage is
    attached, findings are ranked. The sources stay open for the next step.
    """
    window_s = max(2, math.floor((ended_at - started_at).total_seconds()))
    if sources.prometheus is not None:
        await settle(sources.prometheus, started_at, ended_at)
        window_s = await step_window_s(sources.prometheus, ended_at, window_s)
    step_config = config.with_window(f"{window_s}s")
    return await run_diagnosis(step_config, rules=rules, at=ended_at, sources=BuiltSources(sources))


async def settle(
    prometheus: PrometheusSource, started_at: datetime, ended_at: datetime, max_wait_s: float = SETTLE_MAX_S
) -> bool:
    """Wait until every target scraped during the step has a sample stamped at or after its end.

    ``False`` when that did not happen within ``max_wait_s`` or Prometheus could not say (the
    rule pack then evaluates what there is, and reports a failing Prometheus itself). Targets
    not scraped since the step started (scraped less often than it lasted) are not waited for:
    no sample of theirs describes the step.
    """
    since, end = started_at.timestamp(), ended_at.timestamp()
    deadline = time.monotonic() + max_wait_s
    while True:
        answer = await prometheus.query("timestamp(up)", at=datetime.now(UTC), share=False)
        if isinstance(answer, SourceError):
            return False
        behind = [s for s in answer if since <= s.value < end]
        if not behind:
            return True
        if time.monotonic() >= deadline:
            log.info("%d target(s) not scraped since the step ended; evaluating without", len(behind))
            return False
        await asyncio.sleep(_POLL_S)


async def step_window_s(prometheus: PrometheusSource, ended_at: datetime, window_s: int) -> int:
    """``window_s``, doubled until some target has two successful scrapes in it (``rate()`` needs two)."""
    window = window_s
    while window < _MAX_WINDOW_S:
        answer = await prometheus.query(f"max(sum_over_time(up[{window}s]))", at=ended_at, share=False)
        if isinstance(answer, SourceError) or not answer or answer[0].value >= 2:
            return window
        window = min(2 * window, _MAX_WINDOW_S)
    return window
