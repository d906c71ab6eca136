"""The state file going wrong: unusable at start, corrupted, and the disk filling up while running.

An unusable path is one line on stderr and exit 2; a corrupted file is set aside with a timestamp
and a fresh state started, loudly; a full disk (a real one: a small tmpfs, filled up) fails the
writes of that moment with one ERROR line each and ``diagnoser_state_errors_total{reason="disk_full"}``,
diagnoses go on, and once space returns the decisions are taken and sent as if nothing happened.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnoser.daemon import Daemon
from diagnoser.daemon.state import StateStore
from diagnoser.testing.processes import free_port
from tests.conftest import unavailable
from tests.daemon.conftest import LivePrometheus, PoolApp, daemon_settings, wait_for
from tests.daemon.test_serve_process import _healthy, _start, _wait, serve_argv
from tests.fixtures.slack_server import SlackFixtureServer

pytestmark = pytest.mark.integration


def _serve(state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    return subprocess.run(
        [*serve_argv(), "--state", str(state), "--listen", "127.0.0.1:0", "--prometheus-url", "http://127.0.0.1:1"],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )


@pytest.mark.parametrize("kind", ["a directory", "under a path that cannot exist"])
def test_an_unusable_state_path_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    if kind == "a directory":
        state = tmp_path / "state.sqlite3"
        state.mkdir()
    else:
        state = Path("/proc/self/no-such-dir") / str(uuid.uuid4()) / "state.sqlite3"
    result = _serve(state)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "cannot run the daemon: state file" in lines[0]
    assert "Traceback" not in result.stderr


def test_a_corrupted_state_file_is_set_aside_and_a_fresh_one_started(tmp_path: Path) -> None:
    state = tmp_path / "state.sqlite3"
    state.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))  # a torn, overwritten file
    port = free_port()
    config = {
        "prometheus": {"url": "http://127.0.0.1:1"},
        "daemon": {"listen": f"127.0.0.1:{port}", "state_path": str(state), "jitter_s": 0},
    }
    process, log = _start(config, tmp_path)
    try:
        _wait(lambda: _healthy(port), 20, "/healthz", process, log)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert "STATE FILE CORRUPTED" in output
    aside = sorted(tmp_path.glob("state.sqlite3.corrupt-*"))
    assert [p.name for p in aside if not p.name.endswith(("-wal", "-shm"))], output
    assert aside[0].read_bytes()[:16] == b"SQLite format 3\x00"  # the old bytes kept for inspection
    fresh = StateStore(state)
    try:
        assert fresh.integrity_ok()
        assert fresh.set_aside is None
    finally:
        fresh.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a real file system that fills up (needs permission to mount)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if result.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(directory: Path) -> Path:
    """Write zeros until the file system says ENOSPC (unbuffered, down to the last block)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def test_a_read_only_or_full_disk_at_start_is_one_line_and_exit_2(small_disk: Path) -> None:
    state = small_disk / "state.sqlite3"
    StateStore(state).close()  # a good state file from an earlier life
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        result = _serve(state)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot run the daemon: state file" in lines[0], result.stderr
    assert "writ" in lines[0]  # "read-only" or "not writable": what to fix

    filler = _fill(small_disk)
    state.with_name("state.sqlite3-wal").unlink(missing_ok=True)
    result = _serve(state)
    filler.unlink()
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "disk is full" in lines[0], result.stderr


async def test_disk_full_while_running_is_counted_and_recovered(
    small_disk: Path,
    tmp_path: Path,
    live_prometheus: LivePrometheus,
    pool_app: PoolApp,
    slack: SlackFixtureServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = daemon_settings(tmp_path, live_prometheus.url, "diskfull", slack=slack,
                               state=small_disk / "state.sqlite3")
    daemon = Daemon(settings)
    await daemon.start()
    try:
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 2, what="two diagnoses")
        filler = _fill(small_disk)
        caplog.clear()
        # The incident starts while nothing can be written.
        pool_app.set("diskfull", "orders", 0.97)
        await wait_for(lambda: daemon.metrics.state_errors.labels("disk_full")._value.get() >= 3, within=20,
                       what="disk-full errors counted")
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 3, what="diagnoses going on")
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors and all("disk is full" in r.getMessage() for r in errors), [r.getMessage() for r in errors]
        assert not any(r.exc_info for r in errors)  # one line each, no traceback
        assert not any("no transaction is active" in r.getMessage() for r in caplog.records)
        assert slack.messages == []
        # Space is back: the decision is taken whole and sent once.
        filler.unlink()
        await wait_for(lambda: len(slack.messages) == 1, within=20, what="the message after recovery")
        assert "pool orders" in slack.messages[0].text
        assert daemon.state is not None and daemon.state.integrity_ok()
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 3, what="three more diagnoses")
        assert len(slack.messages) == 1
    finally:
        await daemon.stop()
        pool_app.set("diskfull", "orders", 0.1)
