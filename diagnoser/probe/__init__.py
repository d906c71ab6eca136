"""The open-loop probe: a small, steady, safe load that measures what users get.

Requests leave on their own schedule whatever the server does, so a stall shows in full in the
latency (no coordinated omission); answers are validated (status, empty bodies, empty JSON, a
JSON path, truncation); hard caps, a host allowlist and abort-on-error-ratio keep it safe to aim
at production. Every command runs a probe through :mod:`diagnoser.probe.entry`, on one event
loop policy (:func:`run_event_loop`)::

    probe = prepare_probe("http://127.0.0.1:8080/health", rate=50, duration_s=10, settings=settings.probe)
    result = run_event_loop(probe())
    print(result.latency_ms.p99, result.failures.empty_json)
"""

from __future__ import annotations

from diagnoser.probe.entry import PreparedProbe, build_spec, prepare_probe, run_event_loop, run_probe
from diagnoser.probe.open_loop import LiveStats, ProbeRun
from diagnoser.probe.result import ProbeResult, merge_histograms
from diagnoser.probe.spec import ProbeSpec, enforce_safety, load_probe_file, spec_from_url

__all__ = [
    "LiveStats",
    "PreparedProbe",
    "ProbeResult",
    "ProbeRun",
    "ProbeSpec",
    "build_spec",
    "enforce_safety",
    "load_probe_file",
    "merge_histograms",
    "prepare_probe",
    "run_event_loop",
    "run_probe",
    "spec_from_url",
]
