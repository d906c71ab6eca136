"""The engine: one diagnosis, from configured sources to ranked findings with their coverage.

- :mod:`~diagnoser.engine.config`: what a diagnosis reads of the settings, taken apart once;
- :mod:`~diagnoser.engine.run`: build the sources, run the probe, evaluate, attach coverage,
  close (``diagnose now``, the daemon and ``diagnose capacity`` all go through it);
- :mod:`~diagnoser.engine.evaluate`: every rule concurrently under one deadline, holds into findings;
- :mod:`~diagnoser.engine.rank`: most important first; source failures as findings;
- :mod:`~diagnoser.engine.coverage`: what was checked, what had no data, what was silenced;
- :mod:`~diagnoser.engine.scope`, :mod:`~diagnoser.engine.silences`, :mod:`~diagnoser.engine.deadline`:
  filters, silences and the deadline of one run.
"""

from __future__ import annotations

from diagnoser.engine.config import DiagnosisConfig, RulePack, SourceSettings
from diagnoser.engine.evaluate import RuleOutcome, diagnose, evaluate_rule, subject_of
from diagnoser.engine.rank import rank_findings
from diagnoser.engine.run import BuiltSources, build_sources, load_ruleset, run_diagnosis

__all__ = [
    "BuiltSources",
    "DiagnosisConfig",
    "RuleOutcome",
    "RulePack",
    "SourceSettings",
    "build_sources",
    "diagnose",
    "evaluate_rule",
    "load_ruleset",
    "rank_findings",
    "run_diagnosis",
    "subject_of",
]
