"""Where a classic histogram's quantiles stop: each job's highest finite bucket (``le``).

``histogram_quantile`` answers the highest finite bound for any quantile that falls in the
``+Inf`` bucket, so a p99 read at or near that bound may be far above it. The bound is the
family's own, whatever its convention (prometheus_client's defaults end at 10 s, the FastAPI
instrumentator's at 1 s), and may differ between the jobs that write one family.

The bucket series of one family across an estate are many (every route, pod and bound), and a
query over all of them costs as much as the quantile itself. So the bounds are asked in steps
that read as little as possible: the family's ``le`` values from the series index
(``/api/v1/label/le/values``, no samples read), then which of the wanted jobs hold the highest of
them (the series of one bound only), and only for the jobs that do not, their own lower bounds.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from diagnoser.models import SourceError
from diagnoser.numbers import format_number
from diagnoser.promql import format_duration, highest_bounds, selector_text
from diagnoser.sources.prometheus import PrometheusSource, Sample

__all__ = ["NEAR_TOP_BUCKET", "BucketFamily", "TopBuckets", "capped_notes", "top_buckets"]

#: A quantile at or above this share of the highest finite ``le`` is said to be capped by it. The
#: false positive: the caveat on a p99 well inside the buckets (prometheus_client's default buckets
#: end at 10 s: the gateways of py-httpx-remote-service-slow and haproxy-global-maxconn read
#: 2-7 s); checked on those beds and the instrumentator's (buckets to 1 s) in the atlas recordings.
NEAR_TOP_BUCKET = 0.9
#: Jobs listed in one matcher at most (and their names' length): more read the family whole. The
#: index lookup goes in a GET's URL, which proxies in front of Prometheus cap at a few KB.
MAX_LISTED_JOBS = 64
MAX_LISTED_CHARS = 2000
#: How far back a bucket series counts as held (Prometheus' default lookback).
LOOKBACK_S = 300.0

Matchers = Sequence[tuple[str, str, str]]
#: Per bucket selector, the highest finite ``le`` in seconds, per job ('' for any job).
TopBuckets = dict[str, dict[str, float]]


@dataclass(frozen=True)
class BucketFamily:
    """The ``_bucket`` series a quantile reads, and the jobs its holding rows came from (``None``:
    some row was summed over jobs, so only the family's own highest bound can speak for it)."""

    metric: str
    matchers: Matchers
    scale: float
    jobs: frozenset[str] | None

    @property
    def selector(self) -> str:
        return selector_text(self.metric, self.matchers)


async def top_buckets(
    source: PrometheusSource, families: Collection[BucketFamily], at: datetime
) -> TopBuckets:
    """Each family's highest finite bound in seconds, per wanted job and overall ('')."""
    listed = list(families)
    answers = await asyncio.gather(*(_family_tops(source, family, at) for family in listed))
    return {family.selector: tops for family, tops in zip(listed, answers, strict=True)}


async def _family_tops(source: PrometheusSource, family: BucketFamily, at: datetime) -> dict[str, float]:
    jobs = family.jobs
    held = await source.label_values("le", _selector(family, jobs), at, LOOKBACK_S)
    if isinstance(held, SourceError):
        return {}
    spellings: dict[float, list[str]] = {}  # "1" and "1.0" (Prometheus 3 normalises) are one bound
    for text in held:
        try:
            bound = float(text)
        except ValueError:
            continue
        if math.isfinite(bound):
            spellings.setdefault(bound, []).append(text)
    if not spellings:
        return {}
    bounds = sorted(spellings, reverse=True)
    tops = {"": bounds[0] * family.scale}
    if not jobs:
        return tops
    missing = set(jobs)
    for level in (bounds[:1], bounds[1:]):
        if not missing or not level:
            break
        matcher = ("le", "=~", _alternation(s for bound in level for s in spellings[bound]))
        ranged = f"{_selector(family, missing, matcher)}[{format_duration(LOOKBACK_S)}]"
        query = f"count by (job, le) (last_over_time({ranged}))"
        answer = await source.query(query, at)
        if isinstance(answer, SourceError):
            return tops
        for job, bound in highest_bounds((sample.labels for sample in answer), "job").items():
            if job in missing:
                tops[job] = bound * family.scale
        missing -= tops.keys()
    return tops


def _selector(family: BucketFamily, jobs: Collection[str] | None, *more: tuple[str, str, str]) -> str:
    matchers = [*family.matchers, *more]
    if jobs and len(jobs) <= MAX_LISTED_JOBS and sum(len(job) + 1 for job in jobs) <= MAX_LISTED_CHARS:
        matchers.append(("job", "=~", _alternation(jobs)))
    return selector_text(family.metric, matchers)


def _alternation(values: Iterable[str]) -> str:
    """An RE2 alternation matching exactly ``values`` (each escaped)."""
    return "|".join(re.escape(value) for value in sorted(set(values)))


def capped_notes(
    selectors: Sequence[str], sample: Sample, tops: Mapping[str, Mapping[str, float]]
) -> list[str]:
    """A caveat when the quantile ``sample`` reads at or near the highest finite bucket of a
    histogram its query reads (``selectors``: those histograms' bucket selectors)."""
    notes = []
    for selector in selectors:
        per_job = tops.get(selector, {})
        top = per_job.get(sample.labels.get("job", ""), per_job.get(""))
        if top is not None and top > 0 and sample.value >= NEAR_TOP_BUCKET * top:
            bound = format_number(top)
            notes.append(
                f"the histogram's highest finite bucket is {bound} s, so a quantile above it"
                f" reads as {bound} s"
            )
    return list(dict.fromkeys(notes))
