"""The probe job: a probe definition run on the daemon's schedule, its latency in /metrics and its
result handed to the next diagnosis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from diagnoser.daemon import Daemon
from tests.daemon.conftest import LivePrometheus, daemon_settings, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def service() -> AsyncIterator[str]:
    """A service answering ``{"features": {...}}`` after 20 ms."""

    async def features(request: web.Request) -> web.Response:
        await asyncio.sleep(0.02)
        return web.json_response({"features": {"a": 1}})

    app = web.Application()
    app.router.add_get("/features", features)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}"
    await runner.cleanup()


async def test_probe_job_feeds_metrics_and_the_diagnosis(
    tmp_path: Path, live_prometheus: LivePrometheus, service: str
) -> None:
    probe = tmp_path / "checkout.yaml"
    probe.write_text(yaml.safe_dump({
        "target": f"{service}/features",
        "schedule": {"rate": 40, "duration_s": 1},
        "expect": {"status": [200], "json_path": "$.features"},
        "timeout_s": 2,
    }))
    settings = daemon_settings(tmp_path, live_prometheus.url, "probe-only", probe_files=[str(probe)],
                               probe_interval_s=60)
    settings = settings.model_copy(update={"probe": settings.probe.model_copy(update={"allowed_hosts": ["127.0.0.1"]})})
    daemon = Daemon(settings)
    await daemon.start()
    try:
        registry = daemon.metrics.registry
        await wait_for(lambda: (registry.get_sample_value("diagnoser_probe_runs_total",
                                                          {"probe": "checkout", "outcome": "ok"}) or 0) == 1,
                       what="one probe run")
        count = registry.get_sample_value("diagnoser_probe_latency_seconds_count", {"probe": "checkout"})
        assert count is not None and 35 <= count <= 41
        # Every request took at least the service's 20 ms and, on an idle machine, well under 1 s.
        assert registry.get_sample_value("diagnoser_probe_latency_seconds_bucket",
                                         {"probe": "checkout", "le": "0.01"}) == 0
        assert registry.get_sample_value("diagnoser_probe_latency_seconds_bucket",
                                         {"probe": "checkout", "le": "1.0"}) == count
        p99 = registry.get_sample_value("diagnoser_probe_last_p99_seconds", {"probe": "checkout"})
        assert p99 is not None and 0.02 <= p99 < 1.0
        diagnosis = await daemon.diagnose_job()
        assert diagnosis.probe is not None
        assert diagnosis.probe["target"] == f"{service}/features"
        assert diagnosis.probe["failures"]["missing_path"] == 0
    finally:
        await daemon.stop()


async def test_a_refused_probe_is_counted_and_the_daemon_goes_on(
    tmp_path: Path, live_prometheus: LivePrometheus, service: str
) -> None:
    probe = tmp_path / "elsewhere.yaml"
    probe.write_text(yaml.safe_dump({"target": f"{service}/features", "schedule": {"rate": 5, "duration_s": 1}}))
    # No allowed_hosts: a probe file's host must be allowed, so this one is refused before sending.
    settings = daemon_settings(tmp_path, live_prometheus.url, "probe-refused", probe_files=[str(probe)])
    daemon = Daemon(settings)
    await daemon.start()
    try:
        registry = daemon.metrics.registry
        await wait_for(lambda: registry.get_sample_value("diagnoser_probe_runs_total",
                                                         {"probe": "elsewhere", "outcome": "failed"}) == 1,
                       what="the refused probe counted")
        runs = daemon.runs
        await wait_for(lambda: daemon.runs >= runs + 2, what="diagnoses still running")
    finally:
        await daemon.stop()
