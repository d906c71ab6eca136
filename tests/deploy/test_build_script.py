"""``make image`` without a container builder says what to install instead of failing obscurely."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.deploy.rendering import REPO


def _run_without(tmp_path: Path, *, with_docker_client: bool) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dirname = shutil.which("dirname")
    assert dirname is not None
    (bin_dir / "dirname").symlink_to(dirname)
    if with_docker_client:  # a docker CLI whose daemon does not answer
        (bin_dir / "docker").write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
        (bin_dir / "docker").chmod(0o755)
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, str(REPO / "scripts" / "build-image.sh")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_no_builder_is_a_clear_error(tmp_path: Path) -> None:
    done = _run_without(tmp_path, with_docker_client=False)
    assert done.returncode == 1
    assert "no container builder: install docker, podman or buildah" in done.stderr


def test_a_docker_client_without_its_daemon_is_named(tmp_path: Path) -> None:
    done = _run_without(tmp_path, with_docker_client=True)
    assert done.returncode == 1
    assert "docker is installed but its daemon does not answer" in done.stderr
