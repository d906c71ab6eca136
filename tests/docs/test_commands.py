"""Every command line of the pages: its options exist, and the ones that need only Prometheus run.

A `diagnose` line is parsed by the real command-line app (``--help`` appended: options are parsed,
nothing runs). A line that reads nothing but Prometheus is then run as written, in a directory
holding the files it names, against the local Prometheus that holds the bundled incident
(``http://prometheus:9090`` stands for it). Lines that would reach other hosts (a probe target,
Kubernetes, Elasticsearch) are only parsed. `make`, `helm`, `kubectl` and `python` lines must name
targets, chart values, directories, scripts and options that exist.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import diagnoser.cli  # noqa: F401  (registers every command on the app)
from diagnoser.cli.app import app
from diagnoser.models import Diagnosis
from tests.conftest import REPO, IncidentPrometheus
from tests.docs.examples import Example, of_kind, run_in, write_rule_examples

DOCUMENTED_PROMETHEUS = "http://prometheus:9090"
#: Options that read something other than the local Prometheus: such a line is parsed, not run.
ELSEWHERE = {"--kubeconfig", "--in-cluster", "--elasticsearch-url", "--slowlog", "--probe"}
RUNNABLE = {("now",), ("rules", "list"), ("rules", "lint"), ("rules", "test")}


def _command_lines(example: Example) -> list[list[str]]:
    joined = example.text.replace("\\\n", " ")
    return [argv for argv in (shlex.split(line, comments=True) for line in joined.splitlines()) if argv]


COMMANDS = [(example, argv) for example in of_kind("commands") for argv in _command_lines(example)]
IDS = [f"{example}:{' '.join(argv[:3])}" for example, argv in COMMANDS]


def _subcommand(argv: list[str]) -> tuple[str, ...]:
    return tuple(argv[1:3]) if argv[1] == "rules" else (argv[1],)


def _runnable(argv: list[str]) -> bool:
    if argv[0] != "diagnose" or _subcommand(argv) not in RUNNABLE or ELSEWHERE & set(argv):
        return False
    urls = [token for token in argv if "://" in token]
    return all(url == DOCUMENTED_PROMETHEUS for url in urls)


@pytest.mark.parametrize(("example", "argv"), COMMANDS, ids=IDS)
def test_documented_command_exists(example: Example, argv: list[str]) -> None:
    program = argv[0]
    if program == "diagnose":
        result = CliRunner().invoke(app, [*argv[1:], "--help"])
        assert result.exit_code == 0, f"{example}: {shlex.join(argv)}\n{result.output}"
    elif program == "make":
        makefile = (REPO / "Makefile").read_text(encoding="utf-8")
        assert all(f"\n{target}:" in makefile for target in argv[1:]), argv
    elif program == "helm":
        _check_helm(argv)
    elif program == "kubectl":
        assert argv[1:3] == ["apply", "-k"], argv
        assert (REPO / argv[3] / "kustomization.yaml").is_file(), argv
    elif program in ("python", ".venv/bin/python"):
        script = REPO / argv[1]
        text = script.read_text(encoding="utf-8")
        assert all(f'"{flag}"' in text for flag in argv[2:] if flag.startswith("--")), argv
    else:
        pytest.fail(f"{example}: no check for {program!r} commands")


def _check_helm(argv: list[str]) -> None:
    assert argv[1] in ("install", "upgrade"), argv
    chart = REPO / argv[3]
    assert (chart / "Chart.yaml").is_file(), argv
    # A value is the chart's when its schema declares it (prometheus.url has no default in values.yaml).
    schema: dict[str, Any] = json.loads((chart / "values.schema.json").read_text(encoding="utf-8"))
    for index, token in enumerate(argv):
        if token == "--set":
            key = argv[index + 1].split("=", 1)[0]
            node = schema
            for part in key.split("."):
                assert part in node.get("properties", {}), f"{key} is not a value of the chart"
                node = node["properties"][part]


_RUNS = {shlex.join(argv): argv for _, argv in COMMANDS if _runnable(argv)}


@pytest.mark.integration
@pytest.mark.parametrize("argv", list(_RUNS.values()), ids=list(_RUNS))
def test_documented_command_runs(argv: list[str], incident_prometheus: IncidentPrometheus, tmp_path: Path) -> None:
    (tmp_path / "diagnoser.yaml").write_text(f"prometheus: {{url: {incident_prometheus.url}}}\n", encoding="utf-8")
    write_rule_examples(tmp_path)
    line = [incident_prometheus.url if token == DOCUMENTED_PROMETHEUS else token for token in argv]
    result = run_in(tmp_path, line)
    output = result.stdout + result.stderr
    if argv[1] == "now":
        # 0 or 1 is a report (1: something at warning or above, or no data at that instant); 2 is a usage error.
        assert result.code in (0, 1), output
        assert "coverage" in result.stdout.lower(), output
        if "json" in argv:
            Diagnosis.model_validate(json.loads(result.stdout))
    else:
        assert result.code == 0, output


def test_some_commands_run() -> None:
    """The runnable set is not empty by accident (a renamed option would empty it silently)."""
    assert {_subcommand(argv) for argv in _RUNS.values()} == RUNNABLE
