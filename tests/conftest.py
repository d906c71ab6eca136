"""Shared fixtures: a real, backfilled Prometheus holding the bundled incident, the CLI runner."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from diagnoser.testing.rules import backfill_text, parse_duration

REPO = Path(__file__).resolve().parent.parent

#: A test that drives sustained load, whose verdict depends on having CPU to itself (a knee, a
#: rate held, a percentile). ``make test`` runs the suite in parallel (pytest-xdist, ``--dist
#: loadgroup``): every test so marked runs on one worker, one after the other, so two of them
#: never compete for this machine's cores; the rest share the other workers.
load_heavy = pytest.mark.xdist_group("load")
#: A test on a live bed (services, exporters, a daemon, scrapes every few seconds) whose verdict
#: is a detection: these run one after the other on their own worker too, beside at most one
#: load-heavy test, so the two longest chains of the suite are not one.
live_bed = pytest.mark.xdist_group("live")


def shared_bed(module: str) -> pytest.MarkDecorator:
    """Keep a module's tests on one worker: its module-scoped bed (a backfilled Prometheus, a run of
    every scenario) is then built once, not once on every worker that picked one of its tests."""
    return pytest.mark.xdist_group(f"bed:{module}")


#: How far ahead of unrelated work a load-heavy test's processes run (a nice value, inherited by
#: the servers, services and CLIs it starts).
LOAD_HEAVY_PRIORITY = 10


@pytest.fixture(scope="module", autouse=True)
def _load_heavy_ahead_of_other_work(request: pytest.FixtureRequest) -> Iterator[None]:
    """Run a load-heavy test's processes ahead of the other tests and anything else on the host.

    What it measures is a limit of the thing under test (a pool, a rate): on a host whose cores are
    kept busy (other test workers, other jobs), stalls of a hundred milliseconds in the service or
    the probe would otherwise fail steps far below it. Best effort: without the privilege to raise
    it, the priority stays as it is. Module-wide, so the module's own fixtures (a test bed, a
    capacity run shared by its tests) start with it too.
    """
    groups = list(request.node.iter_markers("xdist_group"))
    if load_heavy.mark not in groups and live_bed.mark not in groups:
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, before - LOAD_HEAVY_PRIORITY)
    try:
        yield
    finally:
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, before)
INCIDENT = REPO / "examples" / "checkout-incident.yaml"


@dataclass(frozen=True)
class IncidentPrometheus:
    url: str
    start_s: float

    def at(self, offset: str) -> str:
        """RFC 3339 instant ``offset`` after the incident timeline's start."""
        instant = datetime.fromtimestamp(self.start_s + parse_duration(offset), UTC)
        return instant.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="session")
def incident_prometheus() -> Iterator[IncidentPrometheus]:
    text, starts = backfill_text(INCIDENT)
    with LocalPrometheus(openmetrics=text) as prometheus:
        yield IncidentPrometheus(prometheus.url, starts[0])


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str


def unavailable(reason: str) -> NoReturn:
    """Skip a test this machine lacks a tool or a privilege for; on CI, where scripts/setup.sh
    provides both (CI=true), the same absence fails the test instead of hiding it."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (on CI scripts/setup.sh provides it: its absence is a failure)")
    pytest.skip(reason)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> CliResult:
    """Run ``diagnose`` as a user would: a separate process, real exit code and streams."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    full_env.update({"COLUMNS": "200", **(env or {})})
    completed = subprocess.run(
        [sys.executable, "-m", "diagnoser", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )
    return CliResult(completed.returncode, completed.stdout, completed.stderr)


def run_cli_here(*args: str) -> CliResult:
    """Run ``diagnose`` through its own Typer app in this process: the same flags, settings, engine
    and renderers as :func:`run_cli`, without the second of interpreter start-up a process costs.

    For tests of what a command reports (a diagnosis over a recorded bed, as JSON). What belongs to
    the process (exit on a signal, the streams' and the log's shape) is tested through
    :func:`run_cli`. The command's deadline counts from the invocation, as from a new process's
    start; the root logger and the warnings hook, which the command configures, are put back.
    """
    from unittest import mock

    from typer.testing import CliRunner

    from diagnoser.cli import app
    from diagnoser.engine import deadline

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    loggers = [x for x in logging.root.manager.loggerDict.values() if isinstance(x, logging.Logger)]
    levels = [(logger, logger.level) for logger in loggers]
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("DIAGNOSER_")}
    env["COLUMNS"] = "200"
    invoked = time.monotonic()
    try:
        with mock.patch.object(deadline, "process_age_s", side_effect=lambda: time.monotonic() - invoked):
            result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    finally:
        root.handlers[:], root.level = handlers, level
        for logger, before in levels:
            logger.setLevel(before)
        logging.captureWarnings(False)
    return CliResult(result.exit_code, result.stdout, result.stderr)
