"""The printer against a real Prometheus: every query of the shipped pack, as written and as
printed from its syntax tree, gets the same answer (signal queries under every convention)."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime

from diagnoser.config import PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.promql import normalise
from diagnoser.sources.prometheus import PrometheusSource, Sample
from tests.conftest import IncidentPrometheus
from tests.unit.test_promql import PACK


def _answer(result: list[Sample] | SourceError) -> object:
    if isinstance(result, SourceError):
        return result.message
    return sorted(
        (sorted(s.labels.items()), "NaN" if math.isnan(s.value) else s.value) for s in result
    )


def test_printed_pack_queries_get_the_same_answers(incident_prometheus: IncidentPrometheus) -> None:
    queries = sorted({query for _, query in PACK})
    printed = [normalise(query) for query in queries]
    assert any(p != q for p, q in zip(printed, queries, strict=True)), "the printer changed no query"

    async def ask_all() -> list[list[Sample] | SourceError]:
        source = PrometheusSource(PrometheusSettings(url=incident_prometheus.url))
        at = datetime.fromtimestamp(incident_prometheus.start_s + 35 * 60, UTC)
        try:
            return await asyncio.gather(*(source.query(q, at, share=False) for q in [*queries, *printed]))
        finally:
            await source.aclose()

    answers = asyncio.run(ask_all())
    written, reprinted = answers[: len(queries)], answers[len(queries) :]
    assert not any(isinstance(a, SourceError) for a in written), [a for a in written if isinstance(a, SourceError)][:3]
    differ = [q for q, a, b in zip(queries, written, reprinted, strict=True) if _answer(a) != _answer(b)]
    assert differ == []
    # The incident's data answers a good share of them, so the comparison is not of empty sets.
    assert sum(1 for a in written if a) >= 10
