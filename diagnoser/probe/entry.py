"""How the rest of diagnoser runs a probe: build its spec, prepare it, run it on the one event loop.

``diagnose probe``, ``diagnose now --probe``, ``diagnose capacity`` and the daemon all come through
here, so a probe measures the same way whichever command runs it::

    spec, explicit = build_spec("probes/x.yaml")                  # a file: allowlist applies
    spec, explicit = build_spec("http://host/x", rate=20, duration_s=10)  # typed URL: no allowlist
    spec, explicit = build_spec("grpc://host:50051/pkg.Svc/Get", grpc=GrpcRequest(data='{"id": 1}'))
    probe = prepare_probe("probes/x.yaml", rate=20, duration_s=10, settings=settings.probe)  # may raise
    result = run_event_loop(probe())                              # a ProbeResult
    result = await run_probe(spec, settings.probe, explicit_target=explicit)   # inside a loop

A probe is checked when it is prepared (definition, caps, the allowlist for probe files), so a
refused probe is a usage error before any source is queried or any request sent; the resolved
addresses are checked when it runs, just before the first request. A gRPC probe's message types
are resolved when it is prepared too (its ``.proto`` compiled, or the server's reflection asked,
after the address check), so a method or a request message that does not fit is refused then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from diagnoser.config import ProbeSettings
from diagnoser.errors import ConfigError
from diagnoser.probe.caps import LoadCaps, probe_caps
from diagnoser.probe.grpc_target import GrpcOptions, is_grpc_url
from diagnoser.probe.live import LiveStats
from diagnoser.probe.open_loop import INTERRUPTED
from diagnoser.probe.result import ProbeResult
from diagnoser.probe.running import LocalRun, RunningProbe, default_workers
from diagnoser.probe.spec import (
    ProbeSpec,
    check_resolved_addresses,
    enforce_safety,
    load_probe_file,
    spec_from_url,
)
from diagnoser.probe.worker import WorkerLimits
from diagnoser.probe.workers import WorkerPool

__all__ = [
    "DEFAULT_URL_DURATION_S",
    "DEFAULT_URL_RATE",
    "GrpcRequest",
    "PreparedProbe",
    "build_spec",
    "is_url",
    "prepare_probe",
    "resolve_target",
    "run_event_loop",
    "run_probe",
]

#: A URL typed without --rate/--duration gets a gentle probe.
DEFAULT_URL_RATE = 10.0
DEFAULT_URL_DURATION_S = 10.0

_T = TypeVar("_T")


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://")) or is_grpc_url(target)


@dataclass(frozen=True)
class GrpcRequest:
    """What the command line says about a gRPC call (``--data``, ``--proto``, ``--import-path``,
    ``--metadata``).

    ``data`` is the request message as JSON, or ``@FILE`` to read it from a file. For a probe
    file, what is given here replaces the file's own; ``metadata`` is added to its headers.
    """

    data: str | None = None
    proto: Path | None = None
    import_paths: list[Path] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        return self.data is not None or self.proto is not None or bool(self.import_paths or self.metadata)

    def apply(self, spec: ProbeSpec) -> ProbeSpec:
        """``spec`` with these flags over its own; ``ConfigError`` for a spec that is not gRPC."""
        if not self.given:
            return spec
        if not spec.is_grpc:
            raise ConfigError("--data, --proto, --import-path and --metadata apply to grpc(s):// targets")
        options = spec.grpc or GrpcOptions()
        update: dict[str, Any] = {}
        if self.proto is not None:
            update["proto"] = self.proto
        if self.import_paths:
            update["import_paths"] = self.import_paths
        changes: dict[str, Any] = {"grpc": options.model_copy(update={**update, "descriptor_set": None})}
        if self.metadata:
            changes["headers"] = {**spec.headers, **self.metadata}
        if self.data is not None:
            changes.update(body=None, bodies=None, body_file=None)
            if self.data.startswith("@"):
                changes["body_file"] = Path(self.data[1:])
            else:
                changes["body"] = self.data
        return spec.model_copy(update=changes)


def build_spec(
    target: str,
    *,
    rate: float | None = None,
    duration_s: float | None = None,
    ramp_s: float | None = None,
    grpc: GrpcRequest | None = None,
) -> tuple[ProbeSpec, bool]:
    """A spec from a URL or a probe file path, and whether the target was typed explicitly.

    For a file, ``rate``/``duration_s`` (when given) replace its schedule with a constant one, so
    ``diagnose probe probes/x.yaml --rate 5`` is a gentler run of the same definition; ``grpc``
    (the gRPC flags) replaces its call's. Raises :class:`ConfigError` for a bad file or values.
    """
    spec, explicit = _build_spec(target, rate=rate, duration_s=duration_s, ramp_s=ramp_s)
    if grpc is not None:
        spec = grpc.apply(spec)
    return spec, explicit


def _build_spec(
    target: str, *, rate: float | None, duration_s: float | None, ramp_s: float | None
) -> tuple[ProbeSpec, bool]:
    if is_url(target):
        return (
            spec_from_url(
                target,
                rate=rate if rate is not None else DEFAULT_URL_RATE,
                duration_s=duration_s if duration_s is not None else DEFAULT_URL_DURATION_S,
                ramp_s=ramp_s,
            ),
            True,
        )
    path = Path(target)
    if not path.exists():
        raise ConfigError(f"{target}: neither an http(s):// or grpc(s):// URL nor an existing probe file")
    spec = load_probe_file(path)
    if rate is not None or duration_s is not None or ramp_s is not None:
        override = spec_from_url(
            spec.target,
            rate=rate if rate is not None else spec.peak_rate,
            duration_s=duration_s if duration_s is not None else spec.duration_s,
            ramp_s=ramp_s,
        )
        spec = spec.model_copy(update={"schedule": override.schedule})
    return spec, False


class PreparedProbe:
    """One probe, checked against the safety rules and ready to run: ``await probe()`` runs it once.

    Building it raises :class:`~diagnoser.errors.ProbeSafetyError` for a probe over its caps or a
    probe file's host outside the allowlist, and :class:`~diagnoser.errors.ConfigError` for a
    request body that cannot be read, before anything is sent. ``stop()`` ends a running probe
    early with a partial result (Ctrl-C); ``live()`` is what a progress view shows.

    ``caps`` are the probe's own unless a load test gives its own (``diagnose probe --load-test``:
    :func:`~diagnoser.probe.caps.capacity_caps`). ``workers``: processes that send it (1, the
    default, is this process; ``None`` picks :func:`~diagnoser.probe.running.default_workers`).
    ``within_s``: at most this long to resolve a gRPC target's message types (a run's deadline).
    """

    def __init__(
        self,
        spec: ProbeSpec,
        settings: ProbeSettings,
        *,
        explicit_target: bool,
        caps: LoadCaps | None = None,
        workers: int | None = 1,
        within_s: float | None = None,
    ) -> None:
        enforce_safety(spec, settings, explicit_target=explicit_target, caps=caps)
        spec.request_bodies()  # a body file that cannot be read is refused now, not in a worker
        spec = resolve_target(spec, settings, explicit_target=explicit_target, within_s=within_s)
        self.spec = spec
        self.settings = settings
        self.explicit_target = explicit_target
        self.caps = caps if caps is not None else probe_caps(settings)
        self.workers = workers if workers is not None else default_workers(spec.peak_rate)
        self._running: RunningProbe | None = (
            LocalRun(spec, settings, explicit_target=explicit_target) if self.workers == 1 else None
        )
        self._stop_reason: str | None = None
        self._started = False

    async def __call__(self) -> ProbeResult:
        """Check where the target's name resolves (the address rule), then send the schedule."""
        if self._started:
            raise RuntimeError("a prepared probe runs once; prepare another for the next run")
        self._started = True
        if self._running is not None:
            return await self._running.result()
        await check_resolved_addresses(self.spec, self.settings, explicit_target=self.explicit_target)
        targets = [self.spec.host] if self.explicit_target else []
        pool = WorkerPool(self.workers, limits=WorkerLimits.of(self.settings, self.caps, targets))
        try:
            await pool.start()
            running = pool.launch(self.spec, self.settings, explicit_target=self.explicit_target)
            self._running = running
            if self._stop_reason is not None:
                running.stop(self._stop_reason)
            return await running.result()
        finally:
            await pool.aclose()

    def stop(self, reason: str = INTERRUPTED) -> None:
        """End the run early; in-flight requests settle and the result covers what was sent."""
        self._stop_reason = self._stop_reason or reason
        if self._running is not None:
            self._running.stop(reason)

    def live(self) -> LiveStats:
        """A snapshot for the progress view; resets the recent-latency window it reads."""
        if self._running is None:  # the workers are starting
            return LiveStats(0.0, self.spec.duration_s, 0, 0, 0, 0.0, None, 0)
        return self._running.live()


def prepare_probe(
    target: str,
    *,
    rate: float,
    duration_s: float,
    settings: ProbeSettings,
    grpc: GrpcRequest | None = None,
    within_s: float | None = None,
) -> PreparedProbe:
    """The probe behind ``diagnose now --probe TARGET --probe-rate N --probe-duration S``.

    ``target`` is a URL or a probe file; ``rate``/``duration_s`` apply to a typed URL, while a probe
    file keeps its own schedule. Raises :class:`~diagnoser.errors.ConfigError` for a bad definition
    and :class:`~diagnoser.errors.ProbeSafetyError` for a refused one.
    """
    if is_url(target):
        spec, explicit = build_spec(target, rate=rate, duration_s=duration_s, grpc=grpc)
    else:
        spec, explicit = build_spec(target, grpc=grpc)
    return PreparedProbe(spec, settings, explicit_target=explicit, within_s=within_s)


def resolve_target(
    spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool, within_s: float | None = None
) -> ProbeSpec:
    """``spec`` ready to send: for gRPC, its message types resolved and its requests checked.

    An HTTP spec comes back as it is. A gRPC one has its ``.proto`` compiled or the server's
    reflection asked (the resolved-address rule first), once, within ``within_s`` seconds and the
    reflection limits; a spec already resolved is only checked, and a target resolved in the last
    few minutes reuses its types. Call it after :func:`~diagnoser.probe.spec.enforce_safety`;
    raises ``ConfigError``.
    """
    if not spec.is_grpc:
        return spec
    from diagnoser.probe.grpc_schema import resolve_grpc_spec

    return resolve_grpc_spec(spec, settings, explicit_target=explicit_target, within_s=within_s)


async def run_probe(spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool) -> ProbeResult:
    """Check the safety rules (``ProbeSafetyError`` before any request), then run the probe.

    A gRPC spec's message types are resolved in a thread first (compiling a proto or asking the
    server's reflection blocks), so a daemon's event loop keeps turning meanwhile.
    """
    if spec.is_grpc:
        enforce_safety(spec, settings, explicit_target=explicit_target)
        spec = await asyncio.to_thread(resolve_target, spec, settings, explicit_target=explicit_target)
    return await PreparedProbe(spec, settings, explicit_target=explicit_target)()


def run_event_loop(main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` to completion on the event loop every probe runs on: uvloop when installed.

    One policy for every command that runs a probe, so the same probe measures the same way. On
    uvloop the probe keeps its schedule closer (lower lag p99 at the same rate in ``bench/probe.py``);
    where uvloop is not installed (Windows) the default loop runs it.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
