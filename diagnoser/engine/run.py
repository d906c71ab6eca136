"""One diagnosis, end to end: build the configured sources, run the probe if asked, evaluate, close.

The CLI's ``diagnose now`` and the daemon's diagnose job both go through :func:`run_diagnosis`,
so they cannot drift apart. A source that cannot even be built (a kubeconfig that does not
parse, a malformed URL) or a probe that cannot run is handed to the evaluation with the
sources, and reported there like any other source failure: one route for every error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar, get_args

from diagnoser.config import Settings, check_paths
from diagnoser.engine.coverage import LOOKBACK_S, build_coverage, no_data_finding, summary_line
from diagnoser.engine.evaluate import RuleOutcome, diagnose
from diagnoser.engine.rank import rank_findings
from diagnoser.engine.silences import apply_silences
from diagnoser.models import Diagnosis, SourceError
from diagnoser.probe.result import ProbeResult
from diagnoser.ruleset import RuleSet, load_rules
from diagnoser.signals.catalogue import use_signal_files
from diagnoser.sources import SourceName, Sources
from diagnoser.sources.prometheus import PrometheusSource

if TYPE_CHECKING:
    from diagnoser.sources.elasticsearch import ElasticsearchSource
    from diagnoser.sources.kubernetes import KubernetesSource

__all__ = ["BuiltSources", "build_sources", "check_inputs", "load_ruleset", "run_diagnosis", "with_coverage"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Supplies this diagnosis's probe result: a prepared probe run now, or (the daemon) the latest one.
ProbeSupplier = Callable[[], Awaitable[ProbeResult | None]]


@dataclass
class BuiltSources:
    sources: Sources
    errors: list[SourceError] = field(default_factory=list)

    async def aclose(self) -> None:
        """Close every source, each on its own (best effort): HTTP clients end their connections politely."""
        for source in self.sources.clients():
            try:
                await source.aclose()
            except Exception:  # closing is best effort, and one failing does not keep the others open
                log.debug("closing %r failed", source, exc_info=True)


def load_ruleset(settings: Settings) -> RuleSet:
    """The built-in pack (unless disabled) plus the configured rule directories.

    The signal catalogue (shipped plus ``signal_files``) is chosen first, so rules naming
    signals are checked against it; a bad catalogue file raises :class:`ConfigError`.
    """
    use_signal_files(settings.signal_files)
    return load_rules(settings.rule_dirs, include_builtin=not settings.disable_builtin_rules)


def build_sources(settings: Settings) -> BuiltSources:
    """Construct every configured source; a source that cannot be built becomes an error entry."""
    built = BuiltSources(Sources())
    if settings.prometheus.url:
        try:
            built.sources.prometheus = PrometheusSource(
                settings.prometheus, metric_overrides=settings.metrics
            )
        except (ValueError, OSError) as exc:
            built.errors.append(SourceError(source="prometheus", message=f"cannot set up: {exc}"))
    if settings.elasticsearch.urls or settings.elasticsearch.slowlog_paths:
        built.sources.elasticsearch = _set_up("elasticsearch", lambda: _elasticsearch(settings), built.errors)
    if settings.kubernetes.enabled:
        built.sources.kubernetes = _set_up("kubernetes", lambda: _kubernetes(settings), built.errors)
    return built


def with_coverage(
    diagnosis: Diagnosis,
    rules: RuleSet,
    outcomes: list[RuleOutcome],
    settings: Settings,
    sources: Sources,
    *,
    present_metrics: set[str] | SourceError | None,
) -> Diagnosis:
    """``diagnosis`` with its coverage, plus a ``no_data`` finding when no rule had any data.

    Configured silences apply here, so ``diagnose now`` and the daemon silence alike; what they
    keep out of ``findings`` is listed in ``coverage.silenced``.
    """
    now = datetime.now(UTC)
    kept, silenced = apply_silences(diagnosis.findings, settings.silences, now)
    still_reported = {finding.rule_id for finding in kept}
    fully_silenced = {s.rule_id: s.comment for s in silenced if s.rule_id not in still_reported}
    failed = {error.source for error in diagnosis.errors}
    configured = [name for name in get_args(SourceName) if sources.get(name) is not None or name in failed]
    coverage = build_coverage(
        rules,
        outcomes,
        settings,
        configured=configured,
        present_metrics=present_metrics,
        silenced=fully_silenced,
        source_errors=diagnosis.errors,
        probe_finished=sources.probe.finished if sources.probe is not None else None,
    )
    empty = no_data_finding(coverage, diagnosis.evaluated_at, settings)
    if empty is not None:
        more_kept, more_silenced = apply_silences([empty], settings.silences, now)
        kept += more_kept
        silenced += more_silenced
    coverage.silenced = silenced
    coverage.summary = summary_line(coverage)
    return diagnosis.model_copy(update={"coverage": coverage, "findings": rank_findings(kept)})


def _set_up(name: str, build: Callable[[], T], errors: list[SourceError]) -> T | None:
    """``build()``, or ``None`` and an error entry: a source that cannot be set up is reported."""
    try:
        return build()
    except Exception as exc:
        errors.append(SourceError(source=name, message=f"cannot set up: {type(exc).__name__}: {exc}"))
        return None


def _elasticsearch(settings: Settings) -> ElasticsearchSource | None:
    from diagnoser.sources.elasticsearch import ElasticsearchSource  # the client loads only when used

    return ElasticsearchSource.from_settings(settings.elasticsearch)


def _kubernetes(settings: Settings) -> KubernetesSource:
    from diagnoser.sources.kubernetes import KubernetesSource  # the client loads only when used

    return KubernetesSource.from_settings(settings.kubernetes)


async def run_diagnosis(
    settings: Settings,
    *,
    rules: RuleSet | None = None,
    at: datetime | None = None,
    probe: ProbeSupplier | None = None,
    sources: BuiltSources | None = None,
) -> Diagnosis:
    """Evaluate every rule as of ``at`` (default now) over the configured sources."""
    rules = rules if rules is not None else load_ruleset(settings)
    owned = sources is None
    built = sources or build_sources(settings)
    try:
        # Kept sources (the daemon's) keep their build errors; this run's probe failure is its own.
        errors = list(built.errors)
        built.sources.probe = await _probe(probe, errors)
        instant = at or datetime.now(UTC)
        # Which metrics exist at the instant: asked alongside the rules, within their deadline.
        names = (
            asyncio.ensure_future(built.sources.prometheus.metric_names(instant, LOOKBACK_S))
            if built.sources.prometheus is not None
            else None
        )
        outcomes: list[RuleOutcome] = []
        started = time.monotonic()
        diagnosis = await diagnose(
            rules, settings, built.sources, at=instant, errors=errors, record=outcomes
        )
        present: set[str] | SourceError | None = None
        if names is not None:
            # Rules done early: the names may still come within what is left of the deadline.
            await asyncio.wait({names}, timeout=max(0.0, settings.deadline_s - (time.monotonic() - started)))
            if names.done():
                present = names.result()
            else:
                names.cancel()
        return with_coverage(
            diagnosis, rules, outcomes, settings, built.sources, present_metrics=present
        )
    finally:
        if owned:
            await built.aclose()


async def _probe(probe: ProbeSupplier | None, errors: list[SourceError]) -> ProbeResult | None:
    """The probe's result; a probe that cannot run is an error entry, and the rest goes on."""
    if probe is None:
        return None
    try:
        return await probe()
    except Exception as exc:
        errors.append(SourceError(source="probe", message=f"probe did not run: {exc}"))
        return None


def check_inputs(settings: Settings, *, daemon: bool = False) -> None:
    """Configured paths exist, then the Kubernetes credentials load once: a kubeconfig that does
    not load is the user's configuration to fix (exit 2), not a source outage to report."""
    check_paths(settings, daemon=daemon)
    if settings.kubernetes.enabled:
        from diagnoser.sources.kubernetes import KubernetesSource

        KubernetesSource.from_settings(settings.kubernetes).close()
