"""What a cause's own measurements read now, once its rule no longer holds.

An incident whose cause is gone while its symptoms last (or came back without it) must say what
is seen now, never the old numbers: "pool not saturated now: 55 % of 20". The rule that found
the cause emits nothing once it stops holding, so its evidence rows (the first few: the headline
ratio, the limit, the usage) are asked again, as they were asked, at the diagnosis instant, and
the series with the finding's labels kept. A query that fails or answers nothing is no reading:
the message then says only that the cause is not seen now. ::

    readings = await current_readings(prometheus, absent_causes, at=diagnosis.evaluated_at)
    print(readings[cause.identity][0].value)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import datetime

from diagnoser.engine.rank import agrees
from diagnoser.models import Evidence, Finding, SourceError
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["READ_AGAIN", "current_readings"]

log = logging.getLogger(__name__)

#: Evidence rows asked again per cause: its conditions' and the first evidence after them (for a
#: pool: the share in use, the waiting, the size, the connections used); the rest (rates, hold
#: times) is no part of "what is seen now".
READ_AGAIN = 4
#: Causes read again per diagnosis at most: a bounded cost whatever the state holds.
_MAX_CAUSES = 10


async def current_readings(
    source: PrometheusSource, causes: Iterable[Finding], *, at: datetime
) -> dict[str, list[Evidence]]:
    """Each cause's first Prometheus evidence rows as they read at ``at``, by the cause's identity
    (a cause none of whose rows answered is left out)."""
    chosen = list({c.identity: c for c in causes}.values())[:_MAX_CAUSES]
    answers = await asyncio.gather(*(_read_again(source, cause, at) for cause in chosen))
    return {cause.identity: rows for cause, rows in zip(chosen, answers, strict=True) if rows}


async def _read_again(source: PrometheusSource, cause: Finding, at: datetime) -> list[Evidence]:
    rows = [r for r in cause.evidence if r.source == "prometheus" and r.query][:READ_AGAIN]
    answers = await asyncio.gather(*(source.query(r.query, at) for r in rows))
    now: list[Evidence] = []
    for row, answer in zip(rows, answers, strict=True):
        if isinstance(answer, SourceError):
            log.debug("cannot read %s again: %s", cause.rule_id, answer.message)
            continue
        # The series the finding was about (a pool, an instance), never another one's numbers.
        same = [s for s in answer if s.is_finite and agrees(row.labels, s.labels)]
        if same:
            # A detail with numbers of its own was about the old reading: not repeated as current.
            detail = row.detail if row.detail and not any(c.isdigit() for c in row.detail) else None
            now.append(row.model_copy(update={"value": max(s.value for s in same), "detail": detail}))
    return now
