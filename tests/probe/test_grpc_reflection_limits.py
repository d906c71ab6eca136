"""Server reflection that never ends, answers garbage or is asked too often: bounded, one clear error, cached.

``reflection_server.py`` serves hand-built descriptors in each misbehaviour (an endless import
chain, a slow one, ten thousand imports, bytes that are no descriptor, a message that is no
reflection response). Through the real CLI each is one ``error:`` line and exit 2, within the
run's deadline; the daemon's entry point (:func:`~diagnoser.probe.entry.run_probe`, what its probe
job calls on every run) asks a target's reflection once, not at every run.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from diagnoser.config import ProbeSettings
from diagnoser.errors import ProbeSafetyError
from diagnoser.probe import build_spec, run_probe
from diagnoser.probe.entry import resolve_target, run_event_loop
from tests.conftest import run_cli
from tests.probe.conftest import start_server_process

SERVER = Path(__file__).with_name("reflection_server.py")
#: ``ReflectionLimits``' defaults (checked by the last test): how deep and how wide a definition may go.
MAX_DEPTH = 32
MAX_FILES = 256


@dataclass
class ReflectionServer:
    port: int
    count_file: Path
    process: subprocess.Popen[str]

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}/chain.Svc/Get"

    def requests(self) -> int:
        return int(self.count_file.read_text() or 0) if self.count_file.exists() else 0


@pytest.fixture
def reflection(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReflectionServer]:
    """The server in the mode the test names (``@pytest.mark.parametrize("reflection", [...], indirect=True)``)."""
    count_file = tmp_path / "requests"
    port, process = start_server_process(SERVER, "--mode", request.param, "--count-file", str(count_file))
    try:
        yield ReflectionServer(port, count_file, process)
    finally:
        process.kill()
        process.wait()


def _one_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.parametrize("reflection", ["chain"], indirect=True)
def test_an_endless_import_chain_is_refused_within_the_deadline(reflection: ReflectionServer) -> None:
    started = time.monotonic()
    result = run_cli("now", "--probe", reflection.url, "--deadline", "10", timeout=60)
    elapsed = time.monotonic() - started
    assert result.code == 2, result.stderr
    assert f"imports nested deeper than {MAX_DEPTH} files" in _one_error(result.stderr)
    # One request per file of the chain, to the depth limit: not thousands.
    assert reflection.requests() == MAX_DEPTH + 1
    # The bound that matters: the run ends by its deadline (10 s), with room for a busy machine's
    # interpreter start-up; the chain alone would go on for as long as the server likes.
    assert elapsed < 10 + 15, elapsed


@pytest.mark.parametrize("reflection", ["slow-chain"], indirect=True)
def test_a_slow_chain_is_cut_at_the_runs_deadline(reflection: ReflectionServer) -> None:
    """A quarter of a second per file: the depth limit would take 8 s; a deadline of 4 s comes first."""
    started = time.monotonic()
    result = run_cli("now", "--probe", reflection.url, "--deadline", "4", timeout=60)
    elapsed = time.monotonic() - started
    assert result.code == 2, result.stderr
    assert "server reflection took longer than" in _one_error(result.stderr)
    assert reflection.requests() < MAX_DEPTH
    assert elapsed < 4 + 15, elapsed


@pytest.mark.parametrize(
    ("reflection", "says"),
    [
        ("wide", f"more than {MAX_FILES} files"),
        ("garbage-file", "answered bytes that are not a file descriptor"),
        ("garbage-message", "server reflection failed (INTERNAL"),
    ],
    indirect=["reflection"],
)
def test_malformed_or_huge_reflection_is_one_clear_error(reflection: ReflectionServer, says: str) -> None:
    result = run_cli("probe", reflection.url, "--rate", "5", "--duration", "1", timeout=60)
    assert result.code == 2, result.stderr
    assert says in _one_error(result.stderr)
    assert reflection.requests() <= MAX_FILES + 1


@pytest.mark.parametrize("reflection", ["finite"], indirect=True)
def test_the_daemons_probe_asks_a_targets_reflection_once(reflection: ReflectionServer) -> None:
    """Two probe runs as the daemon's probe job makes them: the second reuses the first's types."""
    from diagnoser.probe.grpc_schema import DESCRIPTORS, ReflectionLimits

    assert (ReflectionLimits().max_depth, ReflectionLimits().max_files) == (MAX_DEPTH, MAX_FILES)
    DESCRIPTORS.clear()
    spec, _ = build_spec(reflection.url, rate=5, duration_s=0.4)
    settings = ProbeSettings(allowed_hosts=["127.0.0.1"])

    async def twice() -> list[int]:
        sent = []
        for _ in range(2):
            result = await run_probe(spec, settings, explicit_target=False)
            sent.append(result.status_counts.get("OK", 0))
        return sent

    assert run_event_loop(twice()) == [2, 2]
    assert reflection.requests() == 3  # the service's file and its two imports, once
    # What is cached never skips the address rule: without 127.0.0.1 allowed, the same target is refused.
    with pytest.raises(ProbeSafetyError, match="loopback"):
        resolve_target(spec, ProbeSettings(allowed_hosts=["127.0.0.*"]), explicit_target=False)
