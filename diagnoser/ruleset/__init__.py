"""The rule pack: rule files, their schema, templates, ``compute`` expressions and lint.

- :mod:`~diagnoser.ruleset.schema`: a rule file as written, a loaded :class:`Rule`, a :class:`RuleSet`;
- :mod:`~diagnoser.ruleset.loader`: loading directories of rule files, every problem gathered;
- :mod:`~diagnoser.ruleset.templating`: ``${...}`` values in conditions, ``{...}`` in findings' texts;
- :mod:`~diagnoser.ruleset.expressions`: the safe ``compute:`` expressions and sizing functions
  (Little's law, replicas, shards);
- :mod:`~diagnoser.ruleset.lint`: what only a careful reader or a live Prometheus finds.
"""

from __future__ import annotations

from diagnoser.ruleset.loader import builtin_rules_dir, load_rule_file, load_rules
from diagnoser.ruleset.schema import Condition, OnsetSpec, Rule, RuleSet, resolve_condition

__all__ = [
    "Condition",
    "OnsetSpec",
    "Rule",
    "RuleSet",
    "builtin_rules_dir",
    "load_rule_file",
    "load_rules",
    "resolve_condition",
]
