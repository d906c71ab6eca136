"""The shipped rule pack passes its own linter, as a user's `diagnose rules lint` would run it."""

from __future__ import annotations

import subprocess
import sys


def test_the_shipped_rules_lint_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "diagnoser", "rules", "lint"], capture_output=True, text=True, timeout=120
    )
    problems = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if "problem:" in line]
    assert problems == []
    assert done.returncode == 0, done.stdout + done.stderr
