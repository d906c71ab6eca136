"""A throw-away Prometheus on 127.0.0.1: backfilled from OpenMetrics, used by rule tests and the demo.

``diagnose rules test`` and the test suite use it the way promtool's rule tests use their own
evaluator, except that the queries run on a real Prometheus (the Debian package's binary), so
what passes here passes in production. Data is written with ``promtool tsdb
create-blocks-from openmetrics`` *before* the server starts, so it is queryable at once.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from diagnoser.errors import LocalPrometheusError
from diagnoser.testing.processes import free_port, stop_process

__all__ = ["LocalPrometheus", "LocalPrometheusError"]


@dataclass
class LocalPrometheus:
    """A Prometheus process in a temp dir; use as a context manager.

    >>> with LocalPrometheus(openmetrics=text) as prom:       # doctest: +SKIP
    ...     print(prom.url)
    """

    openmetrics: str | None = None
    scrape_targets: list[str] = field(default_factory=list)
    #: More scrape jobs by name (``{"redis": ["127.0.0.1:9121"]}``): series then carry their own ``job``.
    scrape_jobs: dict[str, list[str]] = field(default_factory=dict)
    scrape_interval: str = "1s"
    prometheus_bin: str = "prometheus"
    promtool_bin: str = "promtool"
    ready_timeout_s: float = 20.0
    port: int = 0
    workdir: Path | None = None
    #: ``--web.route-prefix``: the API under a path (``/prometheus``), as behind a proxy; in ``url``.
    route_prefix: str = ""
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _owns_workdir: bool = field(default=False, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.route_prefix.rstrip('/')}"

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        for binary in (self.prometheus_bin, self.promtool_bin):
            if shutil.which(binary) is None:
                raise LocalPrometheusError(
                    f"{binary} not found: install the Debian package 'prometheus' (make setup does)"
                )
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="diagnoser-prom-"))
            self._owns_workdir = True
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.openmetrics is not None:
            self._backfill(data)
        config = self.workdir / "prometheus.yml"
        config.write_text(self._config(), encoding="utf-8")
        self.port = self.port or free_port()
        log = (self.workdir / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [
                self.prometheus_bin,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                # Retention counts from the newest block: backfilled history must survive.
                "--storage.tsdb.retention.time=100y",
                "--query.lookback-delta=5m",
                *([f"--web.route-prefix={self.route_prefix}"] if self.route_prefix else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self._wait_ready()

    def _backfill(self, data: Path) -> None:
        assert self.workdir is not None
        source = self.workdir / "backfill.om"
        text = self.openmetrics or ""
        source.write_text(
            text if text.rstrip().endswith("# EOF") else text.rstrip("\n") + "\n# EOF\n", encoding="utf-8"
        )
        result = subprocess.run(
            [self.promtool_bin, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise LocalPrometheusError(
                f"promtool backfill failed: {(result.stderr or result.stdout).strip()[-500:]}"
            )

    def _config(self) -> str:
        lines = [
            "global:",
            f"  scrape_interval: {self.scrape_interval}",
            f"  evaluation_interval: {self.scrape_interval}",
        ]
        jobs = {"local": self.scrape_targets, **self.scrape_jobs} if self.scrape_targets else self.scrape_jobs
        if jobs:
            lines.append("scrape_configs:")
        for job, targets in jobs.items():
            lines += [f"  - job_name: {job}", "    static_configs:", "      - targets:"]
            lines += [f"          - {target}" for target in targets]
        return "\n".join(lines) + "\n"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise LocalPrometheusError(
                    f"prometheus exited with {self._process.returncode}: {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise LocalPrometheusError(f"prometheus not ready after {self.ready_timeout_s:g}s")

    def log_tail(self, lines: int = 20) -> str:
        if self.workdir is None:
            return ""
        path = self.workdir / "prometheus.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        stop_process(self._process)
        self._process = None
        if self._owns_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


@contextlib.contextmanager
def running(openmetrics: str) -> Iterator[LocalPrometheus]:
    """Shorthand: a backfilled local Prometheus for the duration of a ``with`` block."""
    with LocalPrometheus(openmetrics=openmetrics) as prom:
        yield prom
