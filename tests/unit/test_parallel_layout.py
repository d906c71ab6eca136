"""The parallel suite's layout holds: tests of one xdist group run on one worker, one at a time.

``make test`` runs with pytest-xdist's ``--dist loadgroup`` so that the load-heavy tests
(``tests.conftest.load_heavy``) never compete with each other for the cores. That grouping rests
on pytest and pytest-xdist agreeing on how a test's id is stored (pytest 9.2 and xdist 3.8 do
not, and then every test runs anywhere without a word); this runs a small suite the same way
and reads which worker ran what.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os, time
import pytest
pytestmark = pytest.mark.xdist_group("load")

@pytest.mark.parametrize("n", range(3))
def test_grouped(n):
    started = time.monotonic()
    time.sleep(0.2)
    with open(os.environ["LAYOUT_LOG"], "a") as log:
        log.write(f"grouped {os.environ['PYTEST_XDIST_WORKER']} {started} {time.monotonic()}\\n")
'''

FREE = '''
import os, time

def test_free_a():
    time.sleep(0.3)

def test_free_b():
    time.sleep(0.3)
'''


def test_a_group_runs_on_one_worker_one_test_at_a_time(tmp_path: Path) -> None:
    (tmp_path / "test_grouped_one.py").write_text(GROUPED)
    (tmp_path / "test_grouped_two.py").write_text(GROUPED)
    (tmp_path / "test_free.py").write_text(FREE)
    log = tmp_path / "layout.log"
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False, env={"LAYOUT_LOG": str(log), "PATH": ""},
        cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    runs = [line.split() for line in log.read_text().splitlines()]
    assert len(runs) == 6
    assert len({worker for _, worker, _, _ in runs}) == 1, runs
    spans = sorted((float(start), float(end)) for _, _, start, end in runs)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))
