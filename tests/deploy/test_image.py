"""The container image, built with ``make image`` and run the way the manifests run it: UID 10001,
read-only root filesystem, state and /tmp on mounts. ``diagnose --version`` and ``rules list`` work
in it, and ``serve`` against a local Prometheus turns /readyz to 200 and stops cleanly on SIGTERM.

Needs podman or docker (with its daemon). The Dockerfile's base is pulled when a registry answers;
where none does (these build machines), a Debian bookworm base with Debian's Python 3.11 is made
locally with debootstrap from the Debian archive and used instead (``BASE_IMAGE``): the same
Debian and Python minor version as the pinned ``python:3.11-slim-bookworm``, not the same bits.
Without a builder, or without a base, the test is skipped with the reason; DIAGNOSER_IMAGE_TEST=0
turns it off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from diagnoser.ruleset import load_rules
from diagnoser.testing.processes import free_port
from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import unavailable
from tests.deploy.rendering import REPO

# One worker builds the image once for the module's tests (a module fixture is per worker).
pytestmark = [pytest.mark.image, pytest.mark.integration, pytest.mark.xdist_group("image")]

IMAGE = "localhost/diagnoser:test"
LOCAL_BASE = "localhost/diagnoser-test-base:bookworm"
UID = 10001
# Modest explicit limits: a runtime without CAP_SYS_RESOURCE (a container inside a container)
# cannot raise RLIMIT_NOFILE to podman's default, and these are plenty for the daemon.
RUN_LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def _run(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def _pinned_base() -> str:
    for line in (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith("ARG BASE_IMAGE="):
            return line.split("=", 1)[1]
    raise AssertionError("the Dockerfile has no ARG BASE_IMAGE")


@dataclass(frozen=True)
class Engine:
    """A container engine that can build and run here, with the flags that make it work."""

    command: str
    global_flags: tuple[str, ...] = ()

    def argv(self, *args: str) -> list[str]:
        return [self.command, *self.global_flags, *args]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _run(self.argv(*args), timeout=timeout)


def _find_engine() -> Engine:
    if os.environ.get("DIAGNOSER_IMAGE_TEST") == "0":
        pytest.skip("DIAGNOSER_IMAGE_TEST=0: the image test is turned off")
    if shutil.which("docker") and _run(["docker", "info"], timeout=20).returncode == 0:
        return Engine("docker")
    if shutil.which("podman"):
        return Engine("podman")
    unavailable(
        "no container engine that can run the image: podman or docker (with its daemon) is needed; "
        "DIAGNOSER_IMAGE_TEST=1 scripts/setup.sh installs podman"
    )


def _base_image(engine: Engine) -> str:
    """The Dockerfile's pinned base if it can be had, else a local Debian one (made once)."""
    pinned = _pinned_base()
    if engine.run("image", "inspect", pinned).returncode == 0:
        return pinned
    pulled = engine.run("pull", pinned, timeout=300)
    if pulled.returncode == 0:
        return pinned
    if engine.run("image", "inspect", LOCAL_BASE).returncode == 0:
        return LOCAL_BASE
    if shutil.which("debootstrap") is None:
        unavailable(f"cannot pull {pinned} ({pulled.stderr.strip()[-300:]}) and debootstrap is not installed")
    with tempfile.TemporaryDirectory(prefix="diagnoser-base-") as root:
        made = _run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                "bookworm",
                root,
                "http://deb.debian.org/debian",
            ],
            timeout=900,
        )
        if made.returncode != 0:
            unavailable(
                f"cannot pull {pinned}, nor make a Debian base: {made.stdout[-300:]}{made.stderr[-300:]}"
            )
        shutil.rmtree(Path(root) / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            engine.argv("import", "-", LOCAL_BASE),
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        tar.wait()
    assert imported.returncode == 0, imported.stderr
    return LOCAL_BASE


def _runnable(engine: Engine) -> Engine:
    """``engine`` itself if it runs the image, else podman with runc and cgroupfs (for hosts whose
    cgroup layout crun refuses, such as hybrid cgroup v1/v2 sandboxes); unavailable if neither does."""
    argv = ["run", "--rm", *RUN_LIMITS, "--read-only", IMAGE, "--version"]
    tried = engine.run(*argv)
    if tried.returncode == 0:
        return engine
    if engine.command == "podman" and shutil.which("runc"):
        fallback = Engine("podman", ("--runtime", "runc", "--cgroup-manager", "cgroupfs"))
        if fallback.run(*argv).returncode == 0:
            return fallback
    unavailable(
        f"{engine.command} built the image but cannot run a container here: {tried.stderr.strip()[-400:]}"
    )


@pytest.fixture(scope="module")
def engine() -> Engine:
    found = _find_engine()
    base = _base_image(found)
    env = {**os.environ, "IMAGE": IMAGE, "BASE_IMAGE": base, "BUILDER": found.command}
    # The commit's time as the creation date: an unchanged tree rebuilds from cache.
    env["SOURCE_DATE_EPOCH"] = (
        _run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"]).stdout.strip() or "0"
    )
    if found.command == "podman":
        # chroot isolation: RUN steps need no OCI runtime (works inside containers and sandboxes);
        # host networking and the host's CA bundle: pip reaches the index the way this host does.
        flags = ["--isolation", "chroot", "--network", "host"]
        if Path("/etc/ssl/certs/ca-certificates.crt").is_file():
            flags += ["--volume", "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro"]
        env["BUILD_FLAGS"] = " ".join(flags)
    built = subprocess.run(
        ["make", "-C", str(REPO), "image"], env=env, capture_output=True, text=True, timeout=1500, check=False
    )
    assert built.returncode == 0, f"make image failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    return _runnable(found)


def project_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    return version


def test_the_image_runs_as_10001_with_the_documented_entrypoint(engine: Engine) -> None:
    inspected = engine.run("image", "inspect", IMAGE)
    assert inspected.returncode == 0, inspected.stderr
    (image,) = json.loads(inspected.stdout)
    config = image["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["diagnose"]
    assert config["Cmd"][0] == "serve" and "0.0.0.0:8080" in config["Cmd"]
    assert "Healthcheck" not in config or not config["Healthcheck"]  # Kubernetes probes instead
    assert config["Labels"]["org.opencontainers.image.version"] == project_version()
    assert config["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_version_and_rules_list_run_read_only_as_10001(engine: Engine) -> None:
    version = engine.run(
        "run", "--rm", *RUN_LIMITS, "--read-only", "--user", f"{UID}:{UID}", IMAGE, "--version"
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"diagnose {project_version()}"
    listed = engine.run(
        "run",
        "--rm",
        *RUN_LIMITS,
        "--read-only",
        "--user",
        f"{UID}:{UID}",
        IMAGE,
        "rules",
        "list",
        "--format",
        "json",
    )
    assert listed.returncode == 0, listed.stderr
    shipped = load_rules([])  # the same pack, read from this checkout
    assert sorted(r["id"] for r in json.loads(listed.stdout)) == sorted(shipped.rules)


def test_the_root_filesystem_is_read_only_and_the_user_unprivileged(engine: Engine) -> None:
    script = (
        "import os, errno\n"
        "print(os.getuid(), os.getgid())\n"
        "try:\n    open('/opt/diagnoser/x', 'w')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
    )
    done = engine.run(
        "run", "--rm", *RUN_LIMITS, "--read-only", "--entrypoint", "python3", IMAGE, "-c", script
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(UID), str(UID), "EROFS"]  # the image's own USER, no --user


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def test_serve_turns_ready_against_a_local_prometheus_and_stops_on_sigterm(
    engine: Engine, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, UID, UID)  # as a volume with fsGroup 10001 would be
    port = free_port()
    name = f"diagnoser-test-{port}"
    with LocalPrometheus(scrape_targets=[]) as prometheus:
        started = engine.run(
            "run", "--detach", "--name", name, *RUN_LIMITS, "--read-only", "--tmpfs", "/tmp",
            "--network", "host", "--volume", f"{state}:/var/lib/diagnoser",
            "--env", "DIAGNOSER_DAEMON__DIAGNOSE_INTERVAL_S=2", "--env", "DIAGNOSER_DAEMON__JITTER_S=0",
            IMAGE, "serve", "--prometheus-url", prometheus.url, "--listen", f"127.0.0.1:{port}",
            "--state", "/var/lib/diagnoser/state.sqlite3", "--log-format", "json",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        try:
            deadline = time.monotonic() + 90
            ready = 0
            while time.monotonic() < deadline and ready != 200:
                time.sleep(0.5)
                ready = _get(f"http://127.0.0.1:{port}/readyz")
            logs = engine.run("logs", name).stdout + engine.run("logs", name).stderr
            assert ready == 200, f"/readyz stayed {ready}; logs:\n{logs[-3000:]}"
            assert _get(f"http://127.0.0.1:{port}/healthz") == 200
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                assert "diagnoser_diagnoses_total" in answer.read().decode()
            assert (state / "state.sqlite3").stat().st_uid == UID
            stopped = engine.run("stop", "--time", "20", name, timeout=60)
            assert stopped.returncode == 0, stopped.stderr
            code = engine.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
            assert code == "0", f"serve exited {code} on SIGTERM"
        finally:
            engine.run("rm", "--force", name)
