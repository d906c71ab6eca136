"""Check kinds that rule conditions use; see :mod:`diagnoser.checks.registry`."""

from __future__ import annotations

from diagnoser.checks.registry import (
    CheckContext,
    CheckKind,
    CheckResult,
    check_kind,
    check_kinds,
    load_check_kinds,
)

__all__ = ["CheckContext", "CheckKind", "CheckResult", "check_kind", "check_kinds", "load_check_kinds"]
