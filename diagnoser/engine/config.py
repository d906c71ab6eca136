"""What one diagnosis reads of the settings, taken apart once by whoever assembles the run.

As httpx hands its transport a ``Timeout`` and ``Limits`` rather than the client's whole
configuration, the engine gets a :class:`DiagnosisConfig`: the sources to build, the rule pack
to load, the rules' variables, how findings are labelled, the window, the deadline and the
silences. The CLI and the daemon's assembly build it from the settings
(:meth:`DiagnosisConfig.from_settings`); nothing below them sees the whole settings::

    config = DiagnosisConfig.from_settings(settings)
    diagnosis = await run_diagnosis(config, at=at)
    step = config.with_window("42s")   # capacity: one step's own window, the confirm window with it
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from diagnoser.config.parts import FindingStyle
from diagnoser.config.sections import Silence
from diagnoser.config.settings import confirm_window_for
from diagnoser.ruleset.templating import RuleVariables
from diagnoser.signals import Catalogue, load_catalogue
from diagnoser.sources.registry import SourceSettings

if TYPE_CHECKING:
    from diagnoser.config.settings import Settings

__all__ = ["DiagnosisConfig", "RulePack", "SourceSettings", "catalogue_of"]


def catalogue_of(signal_files: Iterable[Path]) -> Catalogue:
    """The signal catalogue: the shipped one plus ``signal_files`` (cached).

    A bad catalogue file raises :class:`ConfigError`.
    """
    return load_catalogue(tuple(signal_files))


@dataclass(frozen=True)
class RulePack:
    """Where the rules come from: the built-in pack (unless left out), the rule directories, and
    the signal files their ``signal`` conditions are checked against."""

    rule_dirs: tuple[Path, ...] = ()
    builtin: bool = True
    signal_files: tuple[Path, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> RulePack:
        return cls(
            tuple(settings.rule_dirs), not settings.disable_builtin_rules, tuple(settings.signal_files)
        )

    @property
    def catalogue(self) -> Catalogue:
        return catalogue_of(self.signal_files)


@dataclass(frozen=True)
class DiagnosisConfig:
    """Everything one diagnosis reads of the configuration."""

    sources: SourceSettings = field(default_factory=SourceSettings)
    rules: RulePack = field(default_factory=RulePack)
    variables: RuleVariables = field(default_factory=RuleVariables)
    style: FindingStyle = field(default_factory=FindingStyle)
    #: Seconds the whole run may take (probe, rules, metric names).
    deadline_s: float = 30.0
    silences: tuple[Silence, ...] = ()
    #: ``confirm_window`` as configured (``None``: derived from the window, see :meth:`with_window`).
    confirm_window: str | None = None
    #: The scrape interval to assume where Prometheus holds no ``up`` series to measure it by
    #: (``None``: the configured windows stay). A live Prometheus writes ``up`` at every scrape; a
    #: rule scenario's series are backfilled without it, at the ``interval`` its file states.
    assumed_scrape_interval_s: float | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> DiagnosisConfig:
        return cls(
            sources=SourceSettings.from_settings(settings),
            rules=RulePack.from_settings(settings),
            variables=RuleVariables.from_settings(settings),
            style=FindingStyle.from_settings(settings),
            deadline_s=settings.deadline_s,
            silences=tuple(settings.silences),
            confirm_window=settings.confirm_window,
        )

    @property
    def window(self) -> str:
        """The range rules average and rate over (``${window}``)."""
        return self.variables.window

    @property
    def catalogue(self) -> Catalogue:
        return self.rules.catalogue

    def with_window(self, window: str) -> DiagnosisConfig:
        """The same configuration over another window; an unset confirm window follows it, as
        it follows ``window`` in the settings."""
        confirm = confirm_window_for(window, self.confirm_window)
        return replace(self, variables=replace(self.variables, window=window, confirm_window=confirm))
