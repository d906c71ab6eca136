"""Every command is built from the one kit in ``cli/app.py``: its --config, --format, errors and loop."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import diagnoser.cli
from tests.conftest import run_cli

CLI = Path(diagnoser.cli.__file__).parent
COMMANDS = sorted(path for path in CLI.glob("*.py") if path.name not in {"__init__.py", "app.py", "capacity_record.py", "timeparse.py"})


def test_every_command_is_a_module_of_the_cli_package() -> None:
    assert [path.stem for path in COMMANDS] == ["capacity", "now", "probe", "rules", "serve", "signals", "verify", "worker"]
    assert not (CLI.parent / "probe" / "cli.py").exists()


@pytest.mark.parametrize("module", COMMANDS, ids=lambda path: path.stem)
def test_a_command_declares_no_option_or_loop_of_its_own(module: Path) -> None:
    source = module.read_text(encoding="utf-8")
    # The shared ConfigOption and FormatOption, not a declaration per command.
    assert not re.search(r"typer\.Option\(\s*\"--(config|format)\"", source)
    assert not re.search(r"class \w*Output\w*\(StrEnum\)", source)  # nor an output enum of its own
    # One event loop for every command: run_loop, which runs the probe's.
    assert "asyncio.run(" not in source
    assert "run_event_loop(" not in source


@pytest.mark.parametrize("command", [["probe", "http://127.0.0.1:9/"], ["signals"]])
def test_a_format_a_command_does_not_print_is_not_offered(command: list[str], tmp_path: Path) -> None:
    shown = run_cli(*command, "--help", env={"HOME": str(tmp_path), "COLUMNS": "100"})
    assert "<table|json>" in shown.stdout and "markdown" not in shown.stdout
    result = run_cli(*command, "--format", "markdown", env={"HOME": str(tmp_path)})
    assert result.code == 2, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("error: Invalid value for '--format'") and "'markdown' is not one of 'table', 'json'" in line


@pytest.mark.parametrize("command", [["probe", "http://127.0.0.1:9/"], ["capacity", "http://127.0.0.1:9/",
                                     "--slo-p99-ms", "50"], ["rules", "list"], ["serve"], ["now"]])  # fmt: skip
def test_every_command_reports_a_bad_config_file_alike(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    result = run_cli(*command, "--config", str(missing), env={"HOME": str(tmp_path)})
    assert result.code == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {missing}: cannot read config"), result.stderr


def test_an_old_flag_name_sets_the_same_setting_and_says_so(tmp_path: Path) -> None:
    """`--max-error-ratio` is `--slo-error-ratio` (slo.error_ratio) and capacity's `--namespace` is
    `--job-namespace`: hidden, still working, with a line saying the name to use."""
    home = {"HOME": str(tmp_path)}
    capacity = ("capacity", "http://127.0.0.1:9/", "--slo-p99-ms", "50")
    ratio = run_cli(*capacity, "--max-error-ratio", "2", env=home)
    assert ratio.code == 2
    assert [line for line in ratio.stderr.splitlines() if line.strip()] == [
        "warning: --max-error-ratio is deprecated, use --slo-error-ratio",
        "error: invalid configuration: slo.error_ratio: Input should be less than or equal to 1",
    ]
    cluster = ("--on-cluster", "1", "--advertise", "10.0.0.5:7070", "--listen", "127.0.0.1:0", "--render-job", "-")
    namespace = run_cli(*capacity, *cluster, "--namespace", "Load_Test", env=home)
    assert namespace.code == 2
    assert [line for line in namespace.stderr.splitlines() if line.strip()] == [
        "warning: --namespace is deprecated, use --job-namespace",
        "error: --job-namespace 'Load_Test' is not a Kubernetes name (lowercase, digits, '-')",
    ]
    shown = run_cli("capacity", "--help", env={**home, "COLUMNS": "150"}).stdout
    assert "--slo-error-ratio" in shown and "--job-namespace" in shown
    assert "--max-error-ratio" not in shown and "--namespace " not in shown
