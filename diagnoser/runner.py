"""One diagnosis, end to end: build the configured sources, run the probe if asked, evaluate, close.

The CLI's ``diagnose now`` and the daemon's diagnose job both go through :func:`run_diagnosis`,
so they cannot drift apart. A source that cannot even be built (a kubeconfig that does not
parse, a malformed URL) becomes an error entry like any other source failure.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from diagnoser.config import Settings
from diagnoser.coverage import LOOKBACK_S, SOURCES, build_coverage, no_data_finding, summary_line
from diagnoser.engine import RuleOutcome, attach_source_errors, diagnose, rank_findings
from diagnoser.models import Diagnosis, SourceError
from diagnoser.ruleset import RuleSet, load_rules
from diagnoser.signals.catalogue import use_signal_files
from diagnoser.silences import apply_silences
from diagnoser.sources import Sources
from diagnoser.sources.prometheus import PrometheusSource

__all__ = ["BuiltSources", "build_sources", "load_ruleset", "run_diagnosis", "with_coverage"]

log = logging.getLogger(__name__)

#: Runs the probe for this diagnosis and returns its result (a ProbeResult); set by the caller.
ProbeRunner = Callable[[], Awaitable[Any]]


@dataclass
class BuiltSources:
    sources: Sources
    errors: list[SourceError] = field(default_factory=list)

    async def aclose(self) -> None:
        """Close every source; some close synchronously, the Elasticsearch client asynchronously."""
        for source in (self.sources.prometheus, self.sources.elasticsearch, self.sources.kubernetes):
            # Prefer the asynchronous close: it lets an HTTP client end its connections politely.
            close = getattr(source, "aclose", None) or getattr(source, "close", None)
            if close is None:
                continue
            try:
                result = close()
                if inspect.isawaitable(result):
                    await result
            except Exception:  # closing is best effort
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
        built.sources.elasticsearch = _optional_source("elasticsearch", settings, built.errors)
    if settings.kubernetes.enabled:
        built.sources.kubernetes = _optional_source("kubernetes", settings, built.errors)
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
    configured = [
        name
        for name in SOURCES
        if getattr(sources, name, None) is not None or any(e.source == name for e in diagnosis.errors)
    ]
    coverage = build_coverage(
        rules,
        outcomes,
        settings,
        configured=configured,
        present_metrics=present_metrics,
        silenced=fully_silenced,
        source_errors=diagnosis.errors,
        probe_finished=getattr(sources.probe, "finished", None),
    )
    empty = no_data_finding(coverage, diagnosis.evaluated_at, settings)
    if empty is not None:
        more_kept, more_silenced = apply_silences([empty], settings.silences, now)
        kept += more_kept
        silenced += more_silenced
    coverage.silenced = silenced
    coverage.summary = summary_line(coverage)
    return diagnosis.model_copy(update={"coverage": coverage, "findings": rank_findings(kept)})


def _optional_source(name: str, settings: Settings, errors: list[SourceError]) -> Any:
    try:
        if name == "elasticsearch":
            from diagnoser.sources.elasticsearch import ElasticsearchSource

            return ElasticsearchSource.from_settings(settings.elasticsearch)
        from diagnoser.sources.kubernetes import KubernetesSource

        return KubernetesSource.from_settings(settings.kubernetes)
    except Exception as exc:  # any failure to build is reported, never fatal
        errors.append(SourceError(source=name, message=f"cannot set up: {type(exc).__name__}: {exc}"))
        return None


async def run_diagnosis(
    settings: Settings,
    *,
    rules: RuleSet | None = None,
    at: datetime | None = None,
    probe: ProbeRunner | None = None,
    sources: BuiltSources | None = None,
) -> Diagnosis:
    """Evaluate every rule as of ``at`` (default now) over the configured sources."""
    rules = rules if rules is not None else load_ruleset(settings)
    owned = sources is None
    built = sources or build_sources(settings)
    try:
        probe_result: Any = None
        if probe is not None:
            try:
                probe_result = await probe()
            except Exception as exc:  # a probe that cannot run is reported, the rest goes on
                built.errors.append(SourceError(source="probe", message=f"probe did not run: {exc}"))
        built.sources.probe = probe_result
        instant = at or datetime.now(UTC)
        # Which metrics exist at the instant: asked alongside the rules, within their deadline.
        names = (
            asyncio.ensure_future(built.sources.prometheus.metric_names(instant, LOOKBACK_S))
            if built.sources.prometheus is not None
            else None
        )
        outcomes: list[RuleOutcome] = []
        started = time.monotonic()
        diagnosis = await diagnose(rules, settings, built.sources, at=instant, record=outcomes)
        if probe_result is not None and hasattr(probe_result, "model_dump"):
            diagnosis.probe = probe_result.model_dump(mode="json")
        if built.errors:
            diagnosis = attach_source_errors(diagnosis, built.errors, settings)
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
