"""README stays current: its rule table is the pack, its commands are the ones that exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def test_rule_table_matches_the_pack() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/readme_rules.py", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_quick_start_commands_exist() -> None:
    readme = (REPO / "README.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "make test" in (REPO / ".ci" / "run").read_text()
