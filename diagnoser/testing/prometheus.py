"""A throw-away Prometheus on 127.0.0.1: backfilled from OpenMetrics, used by rule tests and the demo.

``diagnose rules test`` and the test suite use it the way promtool's rule tests use their own
evaluator, except that the queries run on a real Prometheus, so what passes here passes in
production. Data is written with ``promtool tsdb create-blocks-from openmetrics`` *before* the
server starts, so it is queryable at once; native histograms, which OpenMetrics text cannot
carry, are written into the running server through its remote-write receiver
(:mod:`diagnoser.testing.remote_write`).

Two majors can run: ``major="3"`` (Prometheus 3.5 LTS, native histograms on: ``make setup``
installs it under ``.venv/prometheus3``) and ``major="2"`` (the ``prometheus`` on ``PATH``,
Debian 12's 2.42). Unset, ``DIAGNOSER_TEST_PROMETHEUS`` (``2`` or ``3``) decides, else 3 where
it is installed and 2 otherwise::

    with LocalPrometheus(openmetrics=text, major="2") as prom:   # doctest: +SKIP
        print(prom.url, prom.version)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from diagnoser.errors import LocalPrometheusError
from diagnoser.testing.processes import free_port, stop_process
from diagnoser.testing.remote_write import FloatSeries, HistogramSeries, write

__all__ = ["PROMETHEUS_MAJOR_ENV", "LocalPrometheus", "LocalPrometheusError", "binaries", "default_major"]

#: ``2`` or ``3``: which Prometheus a :class:`LocalPrometheus` without ``major`` starts.
PROMETHEUS_MAJOR_ENV = "DIAGNOSER_TEST_PROMETHEUS"
#: Where ``make setup`` unpacks Prometheus 3.5 (beside the virtualenv's Python).
_PROMETHEUS3_DIR = "prometheus3"
Major = Literal["2", "3"]


def _installed_major(binary: str) -> str | None:
    """The major version ``binary --version`` reports, or ``None`` when it does not run."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except OSError:
        return None
    words = (out.stdout or out.stderr).split()
    # "prometheus, version 3.5.3+ds1 (branch: ...)"
    version = words[words.index("version") + 1] if "version" in words[:-1] else ""
    return version.split(".")[0] or None


@functools.cache
def binaries(major: Major) -> tuple[str, str] | None:
    """``(prometheus, promtool)`` of that major: for 3, the set-up's copy beside this Python (or
    ``DIAGNOSER_PROMETHEUS3_DIR``), else the ones on ``PATH`` when they are 3.x; for 2, those on
    ``PATH`` when they are 2.x. ``None`` when none is installed."""
    candidates: list[tuple[str, str]] = []
    if major == "3":
        dirs = [os.environ.get("DIAGNOSER_PROMETHEUS3_DIR", ""), str(Path(sys.prefix) / _PROMETHEUS3_DIR)]
        candidates += [(f"{d}/bin/prometheus", f"{d}/bin/promtool") for d in dirs if d]
    on_path = (shutil.which("prometheus"), shutil.which("promtool"))
    if on_path[0] and on_path[1]:
        candidates.append((on_path[0], on_path[1]))
    for prometheus, promtool in candidates:
        runnable = os.access(prometheus, os.X_OK) and os.access(promtool, os.X_OK)
        if runnable and _installed_major(prometheus) == major:
            return prometheus, promtool
    return None


def default_major() -> Major:
    """``DIAGNOSER_TEST_PROMETHEUS`` when set, else 3 where Prometheus 3 is installed, else 2."""
    chosen = os.environ.get(PROMETHEUS_MAJOR_ENV, "").strip()
    if chosen in ("2", "3"):
        return "3" if chosen == "3" else "2"
    if chosen:
        raise LocalPrometheusError(f"{PROMETHEUS_MAJOR_ENV}={chosen!r}: give 2 or 3")
    return "3" if binaries("3") is not None else "2"


@dataclass
class LocalPrometheus:
    """A Prometheus process in a temp dir; use as a context manager.

    >>> with LocalPrometheus(openmetrics=text) as prom:       # doctest: +SKIP
    ...     print(prom.url)
    """

    openmetrics: str | None = None
    #: An OpenMetrics file to backfill from instead of ``openmetrics`` (a bed of millions of series
    #: is gigabytes of text: it is streamed to promtool, never held in memory). It must end in ``# EOF``.
    openmetrics_file: Path | None = None
    scrape_targets: list[str] = field(default_factory=list)
    #: More scrape jobs by name (``{"redis": ["127.0.0.1:9121"]}``): series then carry their own ``job``.
    scrape_jobs: dict[str, list[str]] = field(default_factory=dict)
    scrape_interval: str = "1s"
    #: ``2`` or ``3`` (see the module); ``None``: :func:`default_major`.
    major: Major | None = None
    #: Explicit binaries (both, or neither: then ``major``'s are found).
    prometheus_bin: str | None = None
    promtool_bin: str | None = None
    #: On 3.x, scrape native histograms (``--enable-feature=native-histograms``); a client that
    #: exposes both kinds then gives only the native one unless ``scrape_classic_histograms``.
    native_histograms: bool = True
    #: Keep scraping the classic series of histograms that also have native buckets.
    scrape_classic_histograms: bool = False
    #: More ``--enable-feature`` names on 3.x (``type-and-unit-labels``).
    features: tuple[str, ...] = ()
    #: Series written through remote write once the server is up (3.x): what OpenMetrics cannot
    #: carry, native histograms (with the float series of the same span: a backfilled block's
    #: range is closed to later writes).
    series: Sequence[FloatSeries | HistogramSeries] = ()
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

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (what a benchmark reads its CPU time from)."""
        return self._process.pid if self._process is not None else None

    @property
    def version(self) -> str:
        """The major version this server runs (``2`` or ``3``), known once binaries are chosen."""
        self._choose_binaries()
        assert self.major is not None
        return self.major

    def _choose_binaries(self) -> tuple[str, str]:
        if self.prometheus_bin and self.promtool_bin:
            if self.major is None:
                self.major = "3" if _installed_major(self.prometheus_bin) == "3" else "2"
            return self.prometheus_bin, self.promtool_bin
        self.major = self.major or default_major()
        found = binaries(self.major)
        if found is None:
            hint = "make setup installs it" if self.major == "3" else "the Debian package 'prometheus'"
            raise LocalPrometheusError(f"Prometheus {self.major}.x not found ({hint})")
        self.prometheus_bin, self.promtool_bin = found
        return found

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        prometheus_bin, _ = self._choose_binaries()
        for binary in (self.prometheus_bin, self.promtool_bin):
            if binary is None or shutil.which(binary) is None:
                raise LocalPrometheusError(
                    f"{binary} not found: install the Debian package 'prometheus' (make setup does)"
                )
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="diagnoser-prom-"))
            self._owns_workdir = True
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.openmetrics is not None or self.openmetrics_file is not None:
            self._backfill(data)
        config = self.workdir / "prometheus.yml"
        config.write_text(self._config(), encoding="utf-8")
        self.port = self.port or free_port()
        log = (self.workdir / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [
                prometheus_bin,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                # Retention counts from the newest block: backfilled history must survive.
                "--storage.tsdb.retention.time=100y",
                "--query.lookback-delta=5m",
                *([f"--web.route-prefix={self.route_prefix}"] if self.route_prefix else []),
                *self._version_flags(),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self._wait_ready()
        if self.series:
            if self.major != "3":
                raise LocalPrometheusError("native histogram series need Prometheus 3 (major='3')")
            write(self.url, self.series)

    def _version_flags(self) -> list[str]:
        if self.major != "3":
            return []
        # Remote write carries what OpenMetrics text cannot (native histograms: testing.remote_write).
        flags = ["--web.enable-remote-write-receiver"]
        features = (*(("native-histograms",) if self.native_histograms else ()), *self.features)
        if features:
            flags.append(f"--enable-feature={','.join(features)}")
        return flags

    def _backfill(self, data: Path) -> None:
        assert self.workdir is not None
        source = self.openmetrics_file or self.workdir / "backfill.om"
        if self.openmetrics_file is None:
            text = self.openmetrics or ""
            source.write_text(
                text if text.rstrip().endswith("# EOF") else text.rstrip("\n") + "\n# EOF\n", encoding="utf-8"
            )
        result = subprocess.run(
            [str(self.promtool_bin), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
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
            lines.append(f"  - job_name: {json.dumps(job)}")
            if self.scrape_classic_histograms and self.major == "3":
                lines.append("    always_scrape_classic_histograms: true")
            lines += ["    static_configs:", "      - targets:"]
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
