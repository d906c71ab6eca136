"""The daemon package's surface: its public names, loaded only when used.

``diagnose now`` and the library import the models and the state without the daemon's server
side: importing the package or its state store must not load aiohttp or APScheduler.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import diagnoser.daemon

_ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; import json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, check=True, capture_output=True, text=True)
    return {name.split(".")[0] for name in json.loads(out.stdout)}


def test_importing_the_package_or_its_state_loads_no_server_library() -> None:
    loaded = _loaded_after("import diagnoser.models, diagnoser.daemon, diagnoser.daemon.state")
    assert not loaded & {"aiohttp", "apscheduler"}


def test_the_public_names_are_the_daemon_and_its_runner() -> None:
    assert sorted(diagnoser.daemon.__all__) == ["Daemon", "run_daemon"]
    from diagnoser.daemon.service import Daemon, run_daemon

    assert diagnoser.daemon.Daemon is Daemon
    assert diagnoser.daemon.run_daemon is run_daemon
