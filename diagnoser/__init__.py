"""diagnoser: finds why a service is slow or failing, names the root cause, and says what to do.

The public surface::

    from diagnoser import load_settings, load_rules, diagnose, Sources, PrometheusSource

    settings = load_settings(overrides={"prometheus": {"url": "http://127.0.0.1:9090"}})
    rules = load_rules(settings.rule_dirs)
    sources = Sources(prometheus=PrometheusSource(settings.prometheus))
    diagnosis = asyncio.run(diagnose(rules, settings, sources))
    print(diagnosis.model_dump_json(indent=2))
"""

from __future__ import annotations

from diagnoser.checks import CheckContext, check_kind
from diagnoser.config import Settings, load_settings
from diagnoser.engine import diagnose
from diagnoser.errors import (
    ConfigError,
    DiagnoserError,
    ProbeSafetyError,
    RuleLoadError,
    SourceNotConfigured,
)
from diagnoser.models import Diagnosis, Evidence, Finding, Severity, SourceError
from diagnoser.recommend import pool_size_for
from diagnoser.ruleset import Rule, RuleSet, load_rules
from diagnoser.runner import run_diagnosis
from diagnoser.sources import Sources
from diagnoser.sources.prometheus import PrometheusSource

__version__ = "0.1.0"

__all__ = [
    "CheckContext",
    "ConfigError",
    "DiagnoserError",
    "Diagnosis",
    "Evidence",
    "Finding",
    "ProbeSafetyError",
    "PrometheusSource",
    "Rule",
    "RuleLoadError",
    "RuleSet",
    "Settings",
    "Severity",
    "SourceError",
    "SourceNotConfigured",
    "Sources",
    "__version__",
    "check_kind",
    "diagnose",
    "load_rules",
    "load_settings",
    "pool_size_for",
    "run_diagnosis",
]
