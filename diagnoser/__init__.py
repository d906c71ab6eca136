"""diagnoser: finds why a service is slow or failing, names the root cause, and says what to do.

The public surface::

    from diagnoser import DiagnosisConfig, load_settings, run_diagnosis

    settings = load_settings(overrides={"prometheus": {"url": "http://127.0.0.1:9090"}})
    diagnosis = asyncio.run(run_diagnosis(DiagnosisConfig.from_settings(settings)))
    print(diagnosis.model_dump_json(indent=2))

Names are imported on first use, so ``import diagnoser.models`` (or ``diagnoser.config``) loads
no HTTP or Kubernetes client. The package map is in ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagnoser.checks import CheckContext, check_kind
    from diagnoser.config import Settings, load_settings
    from diagnoser.engine import DiagnosisConfig, diagnose, run_diagnosis
    from diagnoser.errors import ConfigError, DiagnoserError, ProbeSafetyError, SourceNotConfigured
    from diagnoser.models import Diagnosis, Evidence, Finding, Severity, SourceError
    from diagnoser.ruleset import Rule, RuleSet, load_rules
    from diagnoser.ruleset.expressions import pool_size_for
    from diagnoser.sources import Sources
    from diagnoser.sources.prometheus import PrometheusSource

__version__ = "0.1.0"

#: Each public name and the module that defines it.
_HOMES = {
    "CheckContext": "diagnoser.checks",
    "check_kind": "diagnoser.checks",
    "Settings": "diagnoser.config",
    "load_settings": "diagnoser.config",
    "DiagnosisConfig": "diagnoser.engine",
    "diagnose": "diagnoser.engine",
    "run_diagnosis": "diagnoser.engine",
    "ConfigError": "diagnoser.errors",
    "DiagnoserError": "diagnoser.errors",
    "ProbeSafetyError": "diagnoser.errors",
    "SourceNotConfigured": "diagnoser.errors",
    "Diagnosis": "diagnoser.models",
    "Evidence": "diagnoser.models",
    "Finding": "diagnoser.models",
    "Severity": "diagnoser.models",
    "SourceError": "diagnoser.models",
    "Rule": "diagnoser.ruleset",
    "RuleSet": "diagnoser.ruleset",
    "load_rules": "diagnoser.ruleset",
    "Sources": "diagnoser.sources",
    "PrometheusSource": "diagnoser.sources.prometheus",
    "pool_size_for": "diagnoser.ruleset.expressions",
}

__all__ = [
    "CheckContext",
    "ConfigError",
    "DiagnoserError",
    "Diagnosis",
    "DiagnosisConfig",
    "Evidence",
    "Finding",
    "ProbeSafetyError",
    "PrometheusSource",
    "Rule",
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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'diagnoser' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
