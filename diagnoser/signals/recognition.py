"""What a Prometheus holds at an instant, recognised once and shared by every rule.

:func:`recognition` asks the source for the metric names (the list every signal check already
shares), ``/api/v1/metadata``, and then, only for the few families recognition needs to look at,
one instant query for a series' labels per family, one for the names that may hold native
histograms (whose samples, not their names, say so: ``histogram_count`` answers only for native
histogram samples) and, for histograms without a unit, one for their bucket bounds; then, for each
gauge that pairs with a limit by name and labels, one query for whether it went above that limit
over the day (a limit it exceeds is not its limit). The result is kept by the source for the
instant, so rules never pay a round trip of their own. A metadata endpoint that fails or answers
nothing (VictoriaMetrics, backfilled data) leaves recognition to the names; a failing query leaves
the families it was about unrecognised (listed as look-alikes), never the rule failed. Which
catalogued conventions claim which families is decided by their labels (:mod:`diagnoser.signals.claims`,
one query, shared): a family that fits a convention's name and not its labels is recognised here.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from datetime import datetime

from diagnoser.models import SourceError
from diagnoser.promql import highest_bounds, quote
from diagnoser.signals.catalogue import Catalogue
from diagnoser.signals.claims import claims
from diagnoser.signals.infer import (
    Pairing,
    Recognition,
    candidate_pairs,
    candidate_series,
    overshoot_query,
    recognise,
    split_candidates,
    unitless_histograms,
)
from diagnoser.signals.peers import SPLIT_LABEL, split_query
from diagnoser.signals.shapes import Family, families_of, native_candidates
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["recognition"]


def _name_matcher(names: Iterable[str]) -> str:
    """``{__name__=~"a|b"}`` for metric names (which have no regex metacharacters but ``:``)."""
    return "{__name__=~" + quote("|".join(sorted(names))) + "}"


async def _label_sets(source: PrometheusSource, names: list[str], at: datetime) -> dict[str, frozenset[str]]:
    if not names:
        return {}
    samples = await source.query(f"topk by (__name__) (1, {_name_matcher(names)})", at)
    if isinstance(samples, SourceError):
        return {}
    return {s.labels.get("__name__", ""): frozenset(s.labels) - {"__name__"} for s in samples}


#: The label the native-histogram query copies each series' name into (``histogram_count`` drops it).
_FAMILY_LABEL = "diagnoser_family"


async def _native_label_sets(
    source: PrometheusSource, names: list[str], at: datetime
) -> dict[str, frozenset[str]]:
    """The label names of one series of each of ``names`` that holds native histograms."""
    if not names:
        return {}
    named = f'label_replace({_name_matcher(names)}, "{_FAMILY_LABEL}", "$1", "__name__", "(.+)")'
    samples = await source.query(f"topk by ({_FAMILY_LABEL}) (1, histogram_count({named}))", at)
    if isinstance(samples, SourceError):
        return {}
    return {
        s.labels[_FAMILY_LABEL]: frozenset(s.labels) - {"__name__", _FAMILY_LABEL}
        for s in samples
        if _FAMILY_LABEL in s.labels
    }


async def _bucket_bounds(source: PrometheusSource, names: list[str], at: datetime) -> dict[str, float]:
    if not names:
        return {}
    samples = await source.query(f"group by (__name__, le) ({_name_matcher(names)})", at)
    if isinstance(samples, SourceError):
        return {}
    return highest_bounds((sample.labels for sample in samples), "__name__")


async def _overshoots(
    source: PrometheusSource, pairs: list[Pairing], at: datetime
) -> dict[tuple[str, str], float]:
    """Per pair, whether its gauge went above its limit over the day (a failed query: unchecked)."""
    answers = await source.query_each([overshoot_query(pair) for pair in pairs], at)
    found: dict[tuple[str, str], float] = {}
    for pair, samples in zip(pairs, answers, strict=True):
        if not isinstance(samples, SourceError) and samples and not math.isnan(samples[0].value):
            found[(pair.used, pair.limit)] = samples[0].value
    return found


async def _splits(
    source: PrometheusSource, families: Mapping[str, tuple[Family, tuple[str, ...]]], at: datetime
) -> dict[str, dict[str, float]]:
    """Per family, how much each candidate peer label splits the slowdown (a failed query: none)."""
    names = sorted(families)
    answers = await source.query_each([split_query(*families[name]) for name in names], at)
    found: dict[str, dict[str, float]] = {}
    for name, samples in zip(names, answers, strict=True):
        if isinstance(samples, SourceError):
            continue
        found[name] = {
            s.labels[SPLIT_LABEL]: s.value
            for s in samples
            if SPLIT_LABEL in s.labels and math.isfinite(s.value)
        }
    return found


async def recognition(
    source: PrometheusSource, catalogue: Catalogue, at: datetime, lookback_s: float
) -> Recognition | SourceError:
    """The recognised signals and resources of the instant ``at`` (shared by every caller)."""

    async def ask() -> Recognition | SourceError:
        # Two round trips, each of independent calls: what exists, then what the candidates are.
        names, metadata = await asyncio.gather(source.metric_names(at, lookback_s), source.metadata(at))
        if isinstance(names, SourceError):
            return names
        described = {} if isinstance(metadata, SourceError) else metadata
        wanted = candidate_series(names, described, catalogue)
        families = families_of(names, described)
        asked = set(wanted)
        durations = {n: f for n, f in families.items() if f"{n}_count" in asked}
        labels, native, bounds, claimed = await asyncio.gather(
            _label_sets(source, wanted, at),
            _native_label_sets(source, native_candidates(names, described), at),
            _bucket_bounds(source, unitless_histograms(durations), at),
            claims(source, catalogue, at, lookback_s),
        )
        fitted = None if isinstance(claimed, SourceError) else claimed
        held_as = families_of(names, described, set(native))  # native histograms known now
        # A third round trip only where gauges pair with limits (is each limit above its gauge's
        # day?) and where a client duration's peer could be any of several labels.
        overshoots, splits = await asyncio.gather(
            _overshoots(source, candidate_pairs(names, described, labels, catalogue), at),
            _splits(
                source,
                split_candidates(names, described, {**labels, **native}, catalogue, fitted, held_as),
                at,
            ),
        )
        return recognise(
            names,
            described,
            {**labels, **native},
            catalogue,
            bounds,
            native=set(native),
            overshoots=overshoots,
            claims=fitted,
            splits=splits,
        )

    return await source.shared(("recognition", at.timestamp(), lookback_s, id(catalogue)), ask)
