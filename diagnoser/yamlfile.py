"""YAML documents read with libyaml when PyYAML was built with it, and YAML files read alike everywhere.

PyYAML's pure-Python parser spends a quarter of a second on the rule pack and the signal
catalogue at every start of ``diagnose``; its C binding (``CSafeLoader``, in every PyYAML wheel)
reads the same documents into the same values ten times faster. Both are the safe loader: plain
data only. :func:`read_yaml` is how every YAML file (config, probe, rule, signal catalogue, rule
test) is read: a file that cannot be read, is not UTF-8 or is not YAML is one
:class:`~diagnoser.errors.ConfigError` line naming the file and where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from diagnoser.errors import ConfigError

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


def load_yaml(text: str) -> Any:
    """The single YAML document in ``text`` as plain data (``yaml.safe_load``, through libyaml)."""
    return yaml.load(text, Loader=_SafeLoader)


def read_yaml(path: Path, what: str) -> Any:
    """The YAML document in the file at ``path`` (a ``what``: "config", "probe file"...).

    Raises :class:`ConfigError` ``"<path>: <why>"`` for a file that cannot be read, is not UTF-8
    text, or is not valid YAML (with the line and column of the problem).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise ConfigError(f"{path}: not UTF-8 text (byte {byte:#04x} at offset {exc.start})") from exc
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{at}: {reason}") from exc
