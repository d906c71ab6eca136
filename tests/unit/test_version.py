"""``diagnose --version`` prints the installed distribution's version (the image test runs it)."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from diagnoser.cli import app


def test_version_flag_prints_the_installed_version_and_exits() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"diagnose {version('diagnoser')}\n"


def test_version_flag_runs_before_any_command() -> None:
    result = CliRunner().invoke(app, ["--version", "rules", "list"])
    assert result.exit_code == 0
    assert result.output.startswith("diagnose ")
