"""YAML documents read with libyaml when PyYAML was built with it.

PyYAML's pure-Python parser spends a quarter of a second on the rule pack and the signal
catalogue at every start of ``diagnose``; its C binding (``CSafeLoader``, in every PyYAML wheel)
reads the same documents into the same values ten times faster. Both are the safe loader: plain
data only.
"""

from __future__ import annotations

from typing import Any

import yaml

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


def load_yaml(text: str) -> Any:
    """The single YAML document in ``text`` as plain data (``yaml.safe_load``, through libyaml)."""
    return yaml.load(text, Loader=_SafeLoader)
