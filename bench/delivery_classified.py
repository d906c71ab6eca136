"""The fault table of delivery errors by kind, through the real daemon: lost / duplicated / recovery.

A real Prometheus scrapes a prometheus-client app whose pool gauges the script sets; a fresh
daemon (in this process, 0.4 s diagnoses) posts to the Slack fixture server, which answers each
fault as Slack's API documents it:

* **refused edit**: an incident is posted, then ``chat.update`` answers ``cant_update_message``;
  the incident resolves (an edit) and 8 new critical incidents open: how many of the 8 are posted
  within ``--bound-s``, and how long the last took;
* **429 on chat.update** (``Retry-After: 30``): while an edit waits, a new incident opens: how
  long its ``chat.postMessage`` took;
* **invalid_auth glitch** of ``--glitch-s`` seconds (default 20) from before the first post: how
  long after the glitch's end the incident was posted (a dead letter waits 15 minutes);
* **mentions**: a pool label holding ``<!channel> <@U0123ABCD>``: the mentions Slack would make.

Lost: an expected message not in the channel within ``--bound-s``; duplicated: a message posted
more than once. ``--diagnoser-from DIR`` imports ``diagnoser`` from another checkout (the fixtures
stay this one's), to print the same table before a change::

    git archive main -- . ':!tests' | tar -x -C /tmp/main   # the package with its rules and signals
    python bench/delivery_classified.py --diagnoser-from /tmp/main

Everything runs on 127.0.0.1; about 2 minutes (more before the change, when bounds are reached).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _import_path(diagnoser_from: str | None) -> None:
    sys.path.insert(0, str(ROOT))
    if diagnoser_from:
        sys.path.insert(0, str(Path(diagnoser_from).resolve()))


async def _until(condition: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _duplicates(texts: list[str]) -> int:
    return sum(n - 1 for n in Counter(texts).values() if n > 1)


class Bench:
    def __init__(self, prometheus_url: str, gauge: Any, workdir: Path, bound_s: float) -> None:
        self.prometheus_url = prometheus_url
        self.gauge = gauge
        self.workdir = workdir
        self.bound_s = bound_s

    def set(self, job: str, pool: str, ratio: float) -> None:
        self.gauge.labels(namespace="shop", service=job, pool=pool).set(ratio)

    def daemon(self, job: str, slack: Any, **daemon: Any) -> Any:
        from diagnoser.daemon import Daemon
        from tests.daemon.conftest import daemon_settings

        return Daemon(daemon_settings(self.workdir / job, self.prometheus_url, job, slack=slack, **daemon))

    async def refused_edit(self) -> dict[str, Any]:
        from tests.fixtures.slack_server import SlackFixtureServer

        job, pools = "b-edit", [f"p{i}" for i in range(8)]
        with SlackFixtureServer() as slack:
            self.set(job, "orders", 0.97)
            daemon = self.daemon(job, slack, digest_threshold=50)
            await daemon.start()
            try:
                await _until(lambda: len(slack.messages) == 1, 20)
                slack.lock_edits("cant_update_message")
                self.set(job, "orders", 0.2)
                await _until(lambda: ("/api/chat.update", 200) in slack.requests, 10)
                started = time.monotonic()
                for pool in pools:
                    self.set(job, pool, 0.97)

                def new() -> list[str]:
                    return [m.text for m in slack.top_level() if any(f"pool {p}:" in m.text for p in pools)]

                done = await _until(lambda: len(set(new())) == 8, self.bound_s)
                took = time.monotonic() - started
                resolved = [m for m in slack.messages if m.text.startswith("Resolved")]
                texts = new()
            finally:
                await daemon.stop()
                for pool in ["orders", *pools]:
                    self.set(job, pool, 0.1)
        return {"fault": "refused edit (cant_update_message), 8 new incidents behind it",
                "posted": f"{len(set(texts))} of 8", "lost": 8 - len(set(texts)) + (0 if resolved else 1),
                "duplicated": _duplicates(texts), "recovery_s": round(took, 1) if done else None}

    async def ratelimited_edit(self) -> dict[str, Any]:
        from tests.fixtures.slack_server import SlackFixtureServer

        job = "b-429"
        with SlackFixtureServer() as slack:
            self.set(job, "orders", 0.97)
            daemon = self.daemon(job, slack)
            await daemon.start()
            try:
                await _until(lambda: len(slack.messages) == 1, 20)
                slack.ratelimit(1000, retry_after_s=30, methods=["chat.update"])
                self.set(job, "orders", 0.2)
                await _until(lambda: ("/api/chat.update", 429) in slack.requests, 10)
                started = time.monotonic()
                self.set(job, "payments", 0.97)
                done = await _until(lambda: any("payments" in m.text for m in slack.messages), self.bound_s)
                took = time.monotonic() - started
                texts = [m.text for m in slack.messages]
            finally:
                await daemon.stop()
                self.set(job, "orders", 0.1)
                self.set(job, "payments", 0.1)
        return {"fault": "429 on chat.update (Retry-After 30), a new incident behind it",
                "posted": "1 of 1" if done else "0 of 1", "lost": 0 if done else 1,
                "duplicated": _duplicates(texts), "recovery_s": round(took, 1) if done else None}

    async def auth_glitch(self, glitch_s: float) -> dict[str, Any]:
        from tests.fixtures.slack_server import SlackFixtureServer

        job = "b-auth"
        with SlackFixtureServer() as slack:
            slack.revoke_token_for(glitch_s)
            ends = time.monotonic() + glitch_s
            self.set(job, "orders", 0.97)
            daemon = self.daemon(job, slack)
            await daemon.start()
            try:
                done = await _until(lambda: len(slack.messages) >= 1, glitch_s + self.bound_s)
                after = (slack.messages[0].at - ends) if done else None
                texts = [m.text for m in slack.messages]
            finally:
                await daemon.stop()
                self.set(job, "orders", 0.1)
        return {"fault": f"invalid_auth for {glitch_s:g} s (a token rotated)",
                "posted": "1 of 1" if done else "0 of 1", "lost": 0 if done else 1,
                "duplicated": _duplicates(texts),
                "recovery_s": round(after, 1) if after is not None else None}

    async def mentions(self) -> dict[str, Any]:
        from tests.fixtures.slack_server import SlackFixtureServer

        job, pool = "b-mention", "<!channel> <@U0123ABCD>"
        with SlackFixtureServer() as slack:
            self.set(job, pool, 0.97)
            daemon = self.daemon(job, slack)
            await daemon.start()
            try:
                await _until(lambda: len(slack.messages) == 1, 20)
                made = [m for message in slack.messages for m in message.mentions()]
            finally:
                await daemon.stop()
                self.set(job, pool, 0.1)
        return {"fault": "a label holding <!channel> <@U0123ABCD>", "posted": f"{len(slack.messages)} of 1",
                "lost": 1 - len(slack.messages), "duplicated": 0, "recovery_s": None,
                "mentions": ", ".join(made) or "none"}


async def campaign(args: argparse.Namespace) -> list[dict[str, Any]]:
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from diagnoser.testing.processes import free_port
    from diagnoser.testing.prometheus import LocalPrometheus

    registry = CollectorRegistry()
    gauge = Gauge("shop_pool_used_ratio", "Share of the pool in use.", ["namespace", "service", "pool"],
                  registry=registry)  # fmt: skip
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            LocalPrometheus(scrape_targets=[f"127.0.0.1:{port}"], scrape_interval="1s") as prom,
        ):
            gauge.labels(namespace="shop", service="warmup", pool="none").set(0)
            await asyncio.sleep(6)  # target discovery is throttled to 5 s
            bench = Bench(prom.url, gauge, Path(tmp), args.bound_s)
            return [
                await bench.refused_edit(),
                await bench.ratelimited_edit(),
                await bench.auth_glitch(args.glitch_s),
                await bench.mentions(),
            ]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bound-s", type=float, default=40.0,
                        help="how long to wait for each expected message")
    parser.add_argument("--glitch-s", type=float, default=20.0, help="how long invalid_auth is answered")
    parser.add_argument("--diagnoser-from", help="a checkout without tests/ to import diagnoser from")
    args = parser.parse_args()
    if not (0 < args.bound_s <= 600 and 0 < args.glitch_s <= 300):
        print("error: --bound-s must be in (0, 600] and --glitch-s in (0, 300]", file=sys.stderr)
        raise SystemExit(2)
    _import_path(args.diagnoser_from)
    import diagnoser

    print(f"diagnoser from {Path(diagnoser.__file__).parent}")
    rows = asyncio.run(campaign(args))
    print(f"{'fault':<62} {'posted':>7} {'lost':>5} {'dup':>4} {'recovery_s':>11}  mentions")
    for row in rows:
        recovery = "-" if row["recovery_s"] is None else f"{row['recovery_s']:g}"
        print(f"{row['fault']:<62} {row['posted']:>7} {row['lost']:>5} {row['duplicated']:>4} {recovery:>11}"
              f"  {row.get('mentions', '')}")  # fmt: skip


if __name__ == "__main__":
    main()
