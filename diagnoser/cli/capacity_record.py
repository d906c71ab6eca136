"""``diagnose capacity``'s record of each run in the daemon's state file (``--state``).

With ``--state PATH``, or a config that sets ``daemon.state_path`` (the file ``diagnose serve``
keeps), every run is kept in the state's ``capacity_runs`` table: the daemon exports the newest
per target on ``/metrics`` and shows it in the incidents about the service it measures
(:mod:`diagnoser.daemon.capacity_record`). The file is opened before the first request, so a path
that cannot be used is refused (exit 2) before any load is sent. ::

    diagnose capacity http://checkout.shop.svc:8080/ --slo-p99-ms 300 --state state.sqlite3 \\
        --service checkout --service-namespace shop
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from diagnoser.capacity.report import CapacityReport
from diagnoser.cli.app import FlagGroup, stderr
from diagnoser.config import load_settings
from diagnoser.daemon.capacity_record import run_from_report, service_measured
from diagnoser.daemon.state import StateStore
from diagnoser.errors import StateError
from diagnoser.probe.spec import ProbeSpec

__all__ = ["CapacityRecorder", "RecordFlags"]


@dataclass(frozen=True)
class RecordFlags(FlagGroup):
    """Where the run is kept, and which service it measures."""

    state: Annotated[
        Path | None,
        typer.Option(
            "--state", help="Record the run in this state file (default: daemon.state_path when set)."
        ),
    ] = None
    service: Annotated[
        str | None,
        typer.Option("--service", help="The service the target measures (its incidents show the capacity)."),
    ] = None
    service_namespace: Annotated[
        str | None, typer.Option("--service-namespace", help="That service's namespace (default: any).")
    ] = None

    def state_path(self, config: Path | None) -> Path | None:
        """``--state``, else ``daemon.state_path`` when the config file or the environment sets it
        (its default names no file anyone keeps), else none."""
        if self.state is not None:
            return self.state
        # Read without the command's flags over it: settings loaded with overrides count every
        # field as set, and only what the user wrote says where the daemon's state is.
        daemon = load_settings(config).daemon
        return Path(daemon.state_path) if "state_path" in daemon.model_fields_set else None


class CapacityRecorder:
    """The state file a run is recorded in, opened before the run (``StateError`` if it cannot be)."""

    def __init__(self, flags: RecordFlags, config: Path | None, spec: ProbeSpec) -> None:
        self.path = flags.state_path(config)
        self.service = flags.service or spec.service
        self.namespace = flags.service_namespace or spec.namespace
        self._store = StateStore(self.path) if self.path is not None else None
        if self._store is not None:
            self._store.close()  # open again at the end: a run may last an hour

    def record(self, report: CapacityReport) -> None:
        """Keep ``report``'s run; one line on stderr says where, and which service it measures."""
        if self.path is None or not report.steps:
            return
        service, namespace = self.service, self.namespace
        how = "as given"
        if not service:
            found = service_measured(report)
            if found is not None:
                namespace, service = found[0] or None, found[1]
                how = "the service whose symptom the rules found at the knee"
        run = run_from_report(report, service=service, namespace=namespace)
        try:
            store = StateStore(self.path)
            try:
                store.record_capacity(run)
            finally:
                store.close()
        except StateError as exc:
            stderr.print(f"capacity run not recorded: {exc}", markup=False, highlight=False, soft_wrap=True)
            return
        if not run.on_record:
            said = "kept, with no capacity found (not the capacity on record)"
        elif service:
            where = f"{namespace}/{service}" if namespace else service
            said = f"capacity on record for {where} ({how})"
        else:
            said = (
                "kept without a service: give --service (or service: in the probe file)"
                " for its incidents to show it"
            )
        stderr.print(f"recorded in {self.path}: {said}", markup=False, highlight=False, soft_wrap=True)
