"""One diagnosis, end to end: build the configured sources, run the probe if asked, evaluate, close.

Every command goes through :func:`run_diagnosis`: ``diagnose now``, the daemon's diagnose job
and its Alertmanager receiver, each step of ``diagnose capacity`` and each case of ``diagnose
rules test``, so they cannot drift apart (the same sources, silences, coverage, deadline and
ranking). A run has one clock (:class:`~diagnoser.engine.deadline.Deadline`)
that the probe, the rules and the metric-name lookup all spend; the signal catalogue and the
Kubernetes credentials are built once; silences, ranking and coverage are each applied once, in
:func:`report`. A source that cannot even be built (a kubeconfig that does not parse, a
malformed URL) or a probe that cannot run is handed to the evaluation with the sources, and
reported there like any other source failure: one route for every error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from diagnoser.config import KubernetesSettings, check_paths
from diagnoser.engine.config import DiagnosisConfig, RulePack, SourceSettings, catalogue_of
from diagnoser.engine.coverage import (
    LOOKBACK_S,
    CoverageInputs,
    build_coverage,
    mark_silenced,
    no_data_finding,
    summary_line,
)
from diagnoser.engine.deadline import Deadline
from diagnoser.engine.evaluate import RuleOutcome, evaluate
from diagnoser.engine.rank import rank_findings
from diagnoser.engine.scrape_interval import with_scrape_floor
from diagnoser.engine.silences import apply_silences
from diagnoser.models import Diagnosis, SourceError
from diagnoser.probe.result import ProbeResult
from diagnoser.ruleset import RuleSet, load_rules
from diagnoser.sources import SourceName, Sources
from diagnoser.sources.registry import source_kinds

if TYPE_CHECKING:
    from diagnoser.sources.kubernetes.credentials import Credentials

__all__ = [
    "BuiltSources",
    "build_sources",
    "catalogue_of",
    "check_inputs",
    "load_ruleset",
    "report",
    "run_diagnosis",
]

log = logging.getLogger(__name__)
#: The longest the scrape-interval lookup may take before the rules start without it.
SCRAPE_FLOOR_TIMEOUT_S = 2.0

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


def load_ruleset(pack: RulePack) -> RuleSet:
    """The built-in pack (unless left out) plus the configured rule directories.

    Rules naming signals are checked against the pack's catalogue (:func:`catalogue_of`).
    """
    return load_rules(list(pack.rule_dirs), include_builtin=pack.builtin, catalogue=pack.catalogue)


def build_sources(settings: SourceSettings, *, credentials: Credentials | None = None) -> BuiltSources:
    """Construct every configured source kind (:mod:`diagnoser.sources.kinds`); a source that
    cannot be built becomes an error entry.

    ``credentials`` are the Kubernetes credentials :func:`check_inputs` loaded, so the kubeconfig
    is read once; without them they are loaded here.
    """
    built = BuiltSources(Sources())
    for kind in source_kinds().values():
        if not kind.configured(settings):
            continue
        try:
            client = kind.build(settings, credentials)
        except kind.plain_errors as exc:
            built.errors.append(SourceError(source=kind.name, message=f"cannot set up: {exc}"))
        except Exception as exc:
            message = f"cannot set up: {type(exc).__name__}: {exc}"
            built.errors.append(SourceError(source=kind.name, message=message))
        else:
            setattr(built.sources, kind.name, client)
    return built


def report(
    diagnosis: Diagnosis,
    rules: RuleSet,
    outcomes: list[RuleOutcome],
    config: DiagnosisConfig,
    sources: Sources,
    *,
    present_metrics: set[str] | SourceError | None,
) -> Diagnosis:
    """The evaluated ``diagnosis`` as reported: its coverage (built once), a ``no_data`` finding
    when no rule had any data, the configured silences (applied once, to every finding) and the
    findings ranked (once, after silencing: a silenced symptom no longer lifts its causes).

    ``diagnose now`` and the daemon silence alike; what silences keep out of ``findings`` is
    listed in ``coverage.silenced``.
    """
    failed = {error.source for error in diagnosis.errors}
    configured = [name for name in get_args(SourceName) if sources.get(name) is not None or name in failed]
    coverage = build_coverage(
        rules,
        outcomes,
        CoverageInputs.of(config),
        configured=configured,
        present_metrics=present_metrics,
        source_errors=diagnosis.errors,
        probe_finished=sources.probe.finished if sources.probe is not None else None,
        probe_aborted_on_errors=sources.probe is not None and sources.probe.aborted_on_errors,
    )
    # Whether no rule had data does not depend on silences: only a rule with findings is silenced.
    empty = no_data_finding(coverage, diagnosis.evaluated_at, config.style)
    findings = [*diagnosis.findings, *([empty] if empty is not None else [])]
    # One clock: a silence is judged at the instant diagnosed (``--at``), as the rules were.
    kept, silenced = apply_silences(findings, list(config.silences), diagnosis.evaluated_at)
    still_reported = {finding.rule_id for finding in kept}
    coverage = mark_silenced(
        coverage, {s.rule_id: s.comment for s in silenced if s.rule_id not in still_reported}
    )
    coverage.silenced = silenced
    coverage.summary = summary_line(coverage)
    return diagnosis.model_copy(update={"coverage": coverage, "findings": rank_findings(kept)})


async def run_diagnosis(
    config: DiagnosisConfig,
    *,
    rules: RuleSet | None = None,
    at: datetime | None = None,
    probe: ProbeSupplier | None = None,
    sources: BuiltSources | None = None,
    credentials: Credentials | None = None,
    deadline: Deadline | None = None,
) -> Diagnosis:
    """Evaluate every rule as of ``at`` (default now) over the configured sources.

    ``deadline`` is the run's one clock (default: ``config.deadline_s`` from now); the probe
    spends it too, and the rules get what is left. ``sources`` are kept open sources (the
    daemon's), else they are built (with ``credentials`` from :func:`check_inputs`) and closed.
    """
    clock = deadline or Deadline.starting_now(config.deadline_s)
    rules = rules if rules is not None else load_ruleset(config.rules)
    owned = sources is None
    built = sources or build_sources(config.sources, credentials=credentials)
    try:
        # Kept sources (the daemon's) keep their build errors; this run's probe failure is its own.
        errors = list(built.errors)
        if probe is not None or owned:
            built.sources.probe = await _probe(probe, errors)
        instant = at or datetime.now(UTC)
        # Which metrics exist at the instant: asked alongside the rules, within their deadline.
        names = (
            asyncio.ensure_future(built.sources.prometheus.metric_names(instant, LOOKBACK_S))
            if built.sources.prometheus is not None
            else None
        )
        # Windows that hold enough scrapes at the instant's scrape interval (2m at 15 s, 5m at 60 s),
        # asked within a small share of the rules' time: a Prometheus that does not answer keeps
        # the configured windows and leaves the rules their deadline.
        try:
            config = await asyncio.wait_for(
                with_scrape_floor(config, built.sources.prometheus, instant),
                min(SCRAPE_FLOOR_TIMEOUT_S, clock.for_rules() / 4),
            )
        except TimeoutError:
            log.warning("scrape interval not known in time: confirmation window kept at %s",
                        config.variables.confirm_window)
        outcomes: list[RuleOutcome] = []
        rules_s = clock.for_rules()
        rules_end = time.monotonic() + rules_s
        diagnosis = await evaluate(
            rules,
            config,
            built.sources,
            at=instant,
            errors=errors,
            record=outcomes,
            deadline_s=rules_s,
        )
        present = await _present_names(names, rules_end)
        return report(diagnosis, rules, outcomes, config, built.sources, present_metrics=present)
    finally:
        if owned:
            await built.aclose()


async def _present_names(
    names: asyncio.Future[set[str] | SourceError] | None, until: float
) -> set[str] | SourceError | None:
    """The metric names, if they come before ``until`` (monotonic): rules done early leave time."""
    if names is None:
        return None
    await asyncio.wait({names}, timeout=max(0.0, until - time.monotonic()))
    if names.done():
        return names.result()
    names.cancel()
    return None


async def _probe(probe: ProbeSupplier | None, errors: list[SourceError]) -> ProbeResult | None:
    """The probe's result; a probe that cannot run is an error entry, and the rest goes on."""
    if probe is None:
        return None
    try:
        return await probe()
    except Exception as exc:
        errors.append(SourceError(source="probe", message=f"probe did not run: {exc}"))
        return None


def check_inputs(
    paths: Iterable[tuple[str, Path | None]], kubernetes: KubernetesSettings
) -> Credentials | None:
    """Configured paths exist, then the Kubernetes credentials load: a kubeconfig that does not
    load is the user's configuration to fix (exit 2), not a source outage to report.

    ``paths`` are ``(key, path)`` as :meth:`Settings.input_paths` lists them. Returns the
    credentials (``None`` without Kubernetes), for :func:`build_sources` and leader election to
    use rather than read the kubeconfig again.
    """
    check_paths(paths)
    if not kubernetes.enabled:
        return None
    from diagnoser.sources.kubernetes.credentials import load_credentials

    return load_credentials(kubernetes)
