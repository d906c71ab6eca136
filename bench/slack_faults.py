"""A fault campaign against the daemon's Slack delivery and Alertmanager receiver; prints figures.

A real Prometheus scrapes a prometheus-client app whose pool gauge the campaign sets; for each
Slack fault (the fixture server answering 500, 429 with ``Retry-After``, hanging, answering after
the client's timeout, down) a fresh daemon (in this process, 0.5 s diagnoses) sees one incident
start and end: two notifications, the new finding and its resolution. The fault lasts a few
seconds from the first post; the campaign then waits for both notifications and a little more,
and counts what reached the channel. Then:

* SIGKILL during a late answer: ``diagnose serve`` as a process, Slack stores the first post and
  answers 20 s later, the process is killed while it waits and started again;
* a 429 storm (``Retry-After: 20``): the gaps between diagnoses meanwhile;
* 500 webhooks for one Alertmanager group: the posts they give;
* a Slack outage of ``--outage-s`` seconds (default 240, real time: the 4 minutes of the fault
  campaign) while ten incidents open: how long after Slack is back the queue is drained, in
  order, with the default retry settings and the sender's one message a second.

Usage: ``python bench/slack_faults.py [--outage-s 240] [--only-outage]`` (about 7 minutes with the
default outage). Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnoser.daemon import Daemon  # noqa: E402
from diagnoser.testing.processes import free_port  # noqa: E402
from diagnoser.testing.prometheus import LocalPrometheus  # noqa: E402
from tests.daemon.conftest import daemon_settings, write_rule  # noqa: E402
from tests.fixtures.slack_server import SlackFixtureServer  # noqa: E402

FAULT_S = 6.0


async def _until(condition: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _duplicates(slack: SlackFixtureServer) -> int:
    counts = Counter((m.text, m.thread_ts) for m in slack.messages)
    return sum(n - 1 for n in counts.values())


async def one_fault(name: str, gauge: Gauge, prometheus_url: str, workdir: Path) -> dict[str, Any]:
    """One incident (new + resolved) through one fault; what reached the channel."""
    job = f"bench-{name}"
    with SlackFixtureServer() as slack:
        faults: dict[str, Callable[[], None]] = {
            "500": slack.fail,
            "429": lambda: slack.ratelimit(10_000, retry_after_s=3),
            "hang": slack.hang,
            "slow": lambda: slack.slow(4.0, times=3),
            "down": slack.down,
        }
        faults[name]()
        settings = daemon_settings(
            workdir / name, prometheus_url, job, slack=slack,
            slack_settings={"timeout_s": 2, "in_doubt_settle_s": 5, "retry_base_s": 0.5, "retry_max_s": 4},
            diagnose_interval_s=0.5,
        )
        daemon = Daemon(settings)
        await daemon.start()
        try:
            gauge.labels(namespace="shop", service=job, pool="orders").set(0.97)
            await asyncio.sleep(FAULT_S)
            slack.set_ok()
            await _until(lambda: len(slack.messages) >= 1, 60)
            gauge.labels(namespace="shop", service=job, pool="orders").set(0.1)
            await _until(lambda: len(slack.messages) >= 2, 60)
            await asyncio.sleep(5)  # more diagnoses and outbox runs: anything sent twice shows now
            texts = ["resolved" if m.text.startswith("Resolved") else "new" for m in slack.messages]
            return {
                "fault": name,
                "notifications": 2,
                "posts": len(slack.messages),
                "duplicates": _duplicates(slack),
                "kinds": texts,
                "requests": len(slack.requests),
            }
        finally:
            await daemon.stop()


async def storm_intervals(gauge: Gauge, prometheus_url: str, workdir: Path) -> dict[str, Any]:
    job = "bench-storm"
    with SlackFixtureServer() as slack:
        slack.ratelimit(10_000, retry_after_s=20)
        settings = daemon_settings(workdir / "storm", prometheus_url, job, slack=slack, webhook=True,
                                   diagnose_interval_s=1.0, ready_max_age_s=5)
        daemon = Daemon(settings)
        gauge.labels(namespace="shop", service=job, pool="orders").set(0.97)
        await daemon.start()
        times: list[float] = []
        ready: list[int] = []
        try:
            last = daemon.runs
            end = time.monotonic() + 25
            async with aiohttp.ClientSession() as http:
                while time.monotonic() < end:
                    if daemon.runs != last:
                        last = daemon.runs
                        times.append(time.monotonic())
                    async with http.get(f"http://127.0.0.1:{daemon.http_port}/readyz") as response:
                        ready.append(response.status)
                    await asyncio.sleep(0.05)
        finally:
            await daemon.stop()
            gauge.labels(namespace="shop", service=job, pool="orders").set(0.1)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return {
            "diagnose_interval_s": 1.0,
            "diagnoses_in_25s": len(times),
            "max_gap_s": round(max(gaps), 2) if gaps else None,
            "requests_to_slack": len(slack.requests),
            "readyz_non_200": sum(1 for s in ready if s != 200),
        }


async def webhook_storm(gauge: Gauge, prometheus_url: str, workdir: Path) -> dict[str, Any]:
    job = "bench-am"
    with SlackFixtureServer() as slack:
        token = "bench-am-token"
        settings = daemon_settings(workdir / "am", prometheus_url, job, slack=slack, alertmanager_token=token)
        daemon = Daemon(settings)
        gauge.labels(namespace="shop", service=job, pool="orders").set(0.97)
        await daemon.start()
        try:
            await _until(lambda: len(slack.messages) >= 1, 30)
            body = json.dumps({
                "version": "4", "groupKey": '{}:{alertname="OrdersSlow"}', "status": "firing",
                "receiver": "d",
                "groupLabels": {"alertname": "OrdersSlow"}, "commonLabels": {"alertname": "OrdersSlow"},
                "alerts": [{"status": "firing", "labels": {"alertname": "OrdersSlow", "service": job}}],
            }).encode()
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            started = time.monotonic()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as http:

                async def post() -> int:
                    async with http.post(f"http://127.0.0.1:{daemon.http_port}/alertmanager", data=body,
                                         headers=headers) as response:
                        return response.status

                statuses = await asyncio.gather(*(post() for _ in range(500)))
            answered_s = time.monotonic() - started
            await asyncio.sleep(5)
            reports = [m for m in slack.messages if m.text.startswith("Diagnosis for")]
            return {
                "webhooks": 500,
                "statuses": dict(Counter(statuses)),
                "all_answered_in_s": round(answered_s, 2),
                "report_posts": len(reports),
                "in_incident_thread": all(m.thread_ts == slack.messages[0].ts for m in reports),
            }
        finally:
            await daemon.stop()
            gauge.labels(namespace="shop", service=job, pool="orders").set(0.1)


def sigkill_late_answer(prometheus_url: str, gauge: Gauge, workdir: Path) -> dict[str, Any]:
    job = "bench-kill"
    rules = write_rule(workdir / "kill-rules", job)
    with SlackFixtureServer() as slack:
        config = {
            "prometheus": {"url": prometheus_url},
            "rule_dirs": [str(rules)],
            "disable_builtin_rules": True,
            "slack": {"token": slack.token, "channel": "#oncall", "base_url": slack.api_url, "timeout_s": 30,
                      "in_doubt_settle_s": 5, "allowed_addresses": ["127.0.0.1"]},
            "daemon": {"diagnose_interval_s": 0.5, "pending_for_s": 0, "resolve_after_s": 0, "jitter_s": 0,
                       "listen": "127.0.0.1:0",
                       "state_path": str(workdir / "kill-state.sqlite3"), "outbox_retry_s": 0.3},
        }
        path = workdir / "kill.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
        argv = [sys.executable, "-m", "diagnoser", "serve", "--config", str(path)]
        slack.slow(20.0, times=1)
        gauge.labels(namespace="shop", service=job, pool="orders").set(0.97)
        log = (workdir / "kill.log").open("wb")
        first = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + 30
        while not slack.messages and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        time.sleep(10)
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=15)
        gauge.labels(namespace="shop", service=job, pool="orders").set(0.1)
        return {"posts": len(slack.messages), "duplicates": _duplicates(slack)}


async def outage_drain(gauge: Gauge, prometheus_url: str, workdir: Path, outage_s: float) -> dict[str, Any]:
    """Ten incidents open while Slack is down for ``outage_s``; the time to drain once it is back."""
    job = "bench-outage"
    pools = [f"pool-{n:02d}" for n in range(10)]
    with SlackFixtureServer() as slack:
        slack.down()
        # The shipped retry and rate settings (2 s doubling to 30 s; one message a second).
        defaults = {"retry_base_s": 2.0, "retry_max_s": 30.0, "timeout_s": 2, "messages_per_s": 1.0,
                    "message_burst": 2}
        settings = daemon_settings(workdir / "outage", prometheus_url, job, slack=slack,
                                   slack_settings=defaults, diagnose_interval_s=1.0, outbox_retry_s=5.0)
        daemon = Daemon(settings)
        await daemon.start()
        try:
            for pool in pools:
                gauge.labels(namespace="shop", service=job, pool=pool).set(0.97)
            assert daemon.state is not None
            state = daemon.state
            await _until(lambda: state.pending_count() >= len(pools), 30)
            await asyncio.sleep(outage_s)
            counter = daemon.metrics.notifications_failed
            failed = sum(counter.labels(kind)._value.get() for kind in ("new", "digest"))
            queued = [e.finding.labels["pool"] for e in state.pending() if e.finding is not None]
            slack.set_ok()
            back = time.monotonic()
            first = await _until(lambda: len(slack.messages) >= 1, 600)
            first_s = time.monotonic() - back if first else None
            await _until(lambda: len(slack.messages) >= len(pools) and state.pending_count() == 0, 600)
            drained_s = time.monotonic() - back
            posted = [m.text.split("Pool ")[1].split(" ")[0] for m in slack.messages if "Pool " in m.text]
            return {
                "outage_s": outage_s,
                "queued": len(pools),
                "tries_during_outage": int(failed),
                "first_post_after_up_s": round(first_s, 1) if first_s is not None else None,
                "drained_after_up_s": round(drained_s, 1),
                "posts": len(slack.messages),
                "duplicates": _duplicates(slack),
                "in_queue_order": posted == queued,
            }
        finally:
            await daemon.stop()
            for pool in pools:
                gauge.labels(namespace="shop", service=job, pool=pool).set(0.1)


async def campaign(
    prometheus_url: str, gauge: Gauge, workdir: Path, outage_s: float, only_outage: bool
) -> None:
    if only_outage:
        print(json.dumps({"fault": "Slack down, then back", **await outage_drain(
            gauge, prometheus_url, workdir, outage_s)}), flush=True)
        return
    for name in ("500", "429", "hang", "slow", "down"):
        print(json.dumps(await one_fault(name, gauge, prometheus_url, workdir)), flush=True)
    killed = await asyncio.to_thread(sigkill_late_answer, prometheus_url, gauge, workdir)
    print(json.dumps({"fault": "sigkill during a late answer", **killed}), flush=True)
    storm = await storm_intervals(gauge, prometheus_url, workdir)
    print(json.dumps({"fault": "429 storm, Retry-After 20", **storm}), flush=True)
    webhooks = await webhook_storm(gauge, prometheus_url, workdir)
    print(json.dumps({"fault": "alertmanager webhooks, one group", **webhooks}), flush=True)
    drained = await outage_drain(gauge, prometheus_url, workdir, outage_s)
    print(json.dumps({"fault": "Slack down, then back", **drained}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--outage-s", type=float, default=240.0, help="how long Slack is down (real seconds)")
    parser.add_argument("--only-outage", action="store_true", help="only the outage-to-drained figure")
    args = parser.parse_args()
    registry = CollectorRegistry()
    gauge = Gauge("shop_pool_used_ratio", "Pool use.", ["namespace", "service", "pool"], registry=registry)
    gauge.labels(namespace="shop", service="warmup", pool="none").set(0.0)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        with LocalPrometheus(scrape_targets=[f"127.0.0.1:{port}"], scrape_interval="1s") as prometheus:
            time.sleep(7)  # target discovery is throttled to 5 s
            with tempfile.TemporaryDirectory() as tmp:
                asyncio.run(campaign(prometheus.url, gauge, Path(tmp), args.outage_s, args.only_outage))
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
