"""The open-loop probe: a small, steady, safe load that measures what users get.

Requests leave on their own schedule whatever the server does, so a stall shows in full in the
latency (no coordinated omission); answers are validated (status, empty bodies, empty JSON, a
JSON path, truncation); hard caps, a host allowlist and abort-on-error-ratio keep it safe to aim
at production. ::

    spec = spec_from_url("http://127.0.0.1:8080/health", rate=50, duration_s=10)
    result = await run_probe(spec, settings.probe, explicit_target=True)
    print(result.latency_ms.p99, result.failures.empty_json)
"""

from __future__ import annotations

from diagnoser.probe.entry import build_spec, run_probe
from diagnoser.probe.open_loop import LiveStats, ProbeRun
from diagnoser.probe.result import ProbeResult, merge_histograms
from diagnoser.probe.spec import ProbeSpec, enforce_safety, load_probe_file, spec_from_url

__all__ = [
    "LiveStats",
    "ProbeResult",
    "ProbeRun",
    "ProbeSpec",
    "build_spec",
    "enforce_safety",
    "load_probe_file",
    "merge_histograms",
    "run_probe",
    "spec_from_url",
]
