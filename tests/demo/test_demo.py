"""``make demo`` for real: the live incident lab in its quick mode, as a subprocess, judged by its output.

One run (about a minute and a half) feeds every test: a real Redis, redis_exporter, the feature
service, Prometheus, ``diagnose serve`` and the Slack sink, then two capacity searches with an
incident and a restart between them. The lab's processes inherit a marker in their environment,
so the process table can be read for them while the demo runs and after it exits.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

MARK = "DEMO_TEST_RUN_MARK"


def _marked(marker: str) -> set[int]:
    """PIDs of the processes whose environment carries the marker (this user's, readable ones)."""
    found = set()
    needle = f"{MARK}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                continue
    return found


@dataclass(frozen=True)
class DemoRun:
    code: int
    stdout: str
    stderr: str
    out: Path
    most_running: int
    left_running: set[int]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    out = tmp_path_factory.mktemp("demo-output")
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIAGNOSER_", "SLACK_"))}
    env[MARK] = marker
    process = subprocess.Popen(
        [sys.executable, str(REPO / "demo" / "run.py"), "--quick", "--out", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    counts: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(1.0):
            counts.append(len(_marked(marker) - {process.pid}))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        stdout, stderr = process.communicate(timeout=300)
    finally:
        done.set()
        watcher.join()
        if process.poll() is None:
            process.kill()
    return DemoRun(process.returncode, stdout, stderr, out, max(counts, default=0), _marked(marker))


def _slack_boxes(stdout: str) -> list[str]:
    """Each message the sink printed, as one text block."""
    return re.findall(r"^┌.*?^└", stdout, flags=re.MULTILINE | re.DOTALL)


def _ts(box: str) -> str:
    found = re.search(r"· ts (\d+\.\d+)", box)
    assert found, box
    return found.group(1)


def test_the_demo_completes_and_stops_every_process_it_started(demo: DemoRun) -> None:
    assert demo.code == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "Traceback" not in demo.stderr and "missing:" not in demo.stdout
    # Redis, its exporter, the service, Prometheus and the daemon at least, all seen running...
    assert demo.most_running >= 5
    # ...and none left once the demo has exited.
    assert demo.left_running == set()


def test_the_probe_finding_with_its_numbers_and_runbook(demo: DemoRun) -> None:
    box = next(b for b in _slack_boxes(demo.stdout) if "CRITICAL: EMPTY_SUCCESS_RESPONSE" in b)
    assert re.search(
        r'\d+\.\d% of answers are successes with nothing in them, e.g. 200 \{"features": \{\}\}', box
    )
    assert re.search(r"\[ Runbook \] → https://\S+/rules/probe/probe-empty-success-response\.md", box)


def test_capacity_names_the_pool_with_its_size_and_rises_after_the_fix(demo: DemoRun) -> None:
    headlines = re.findall(r"^capacity ([\d.]+) req/s at p99 <= 250 ms", demo.stdout, flags=re.MULTILINE)
    assert len(headlines) == 2, demo.stdout
    before, after = map(float, headlines)
    assert f"capacity: {before:g} req/s before, {after:g} req/s after the fix" in demo.stdout
    assert after >= 1.5 * before
    first = demo.stdout[: demo.stdout.index("Traffic grows to")]
    assert "bottleneck: connection_pool_exhaustion" in first
    sized = re.search(r"what to do: Raise the pool from 10 to (\d+) connections per instance", first)
    assert sized and int(sized.group(1)) > 10
    assert re.search(r"runbook: https://\S+/rules/pools/[\w-]+\.md", first)
    assert f"Restarting the service with the recommended pool of {sized.group(1)}" in demo.stdout
    for name in ("before", "after"):
        assert ET.parse(demo.out / f"capacity-{name}.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"


def test_slack_gets_the_pool_finding_then_its_resolution_in_the_same_thread(demo: DemoRun) -> None:
    boxes = _slack_boxes(demo.stdout)
    incident = demo.stdout.index("Traffic grows to")
    new = next(
        b for b in boxes if "CRITICAL: CONNECTION_POOL_EXHAUSTION" in b and demo.stdout.index(b) > incident
    )
    assert "reply in thread" not in new
    assert re.search(r"\d+% of 10 connections in use", new)
    assert re.search(r"\[ Runbook \] → https://\S+/rules/pools/[\w-]+\.md", new)
    resolved = next(b for b in boxes if "Resolved*: connection_pool_exhaustion" in b)
    assert f"reply in thread {_ts(new)}" in resolved
    assert demo.stdout.index(resolved) > demo.stdout.index("Restarting the service")
