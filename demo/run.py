"""``make demo``: a live incident lab on 127.0.0.1, from load test to resolved Slack thread.

Starts a small live system, each part on a free port under one temp dir: a real Redis and
``prometheus-redis-exporter``, the feature service (``examples/feature_service``: every request
holds a connection of a real redis-py pool of 10 for 100 ms, OpenTelemetry metrics), a real
Prometheus scraping the service, the exporter and the daemon every second, ``diagnose serve``
(diagnosing every 2 s over a 10 s window, probing the unknown-user path) and a Slack-compatible
sink that prints each message as Slack shows it (``demo/slack_sink.py``). Then it tells the story
an on-call engineer lives through, using only diagnoser's public commands:

1. the daemon's probe finds that unknown users get ``200 {"features": {}}`` (``empty_success_response``);
2. ``diagnose capacity`` steps the load up, finds the knee and names the pool, with its Little's-law size,
   and records the capacity in the daemon's state file;
3. traffic above that knee arrives: the daemon posts ``connection_pool_exhaustion`` with its runbook
   and the service's load against that capacity;
4. the service restarts with the recommended pool under that same traffic: the finding is
   resolved in the same Slack thread, and the daemon's confirm probe at the incident's load
   replies there with the p99 before and after (``verify.enabled``);
5. ``diagnose capacity`` again: the capacity rose (the demo checks by how much).

Every process it started is stopped on exit, Ctrl-C or SIGTERM (each in its own process group);
nothing is written outside the temp dir but the capacity plots (``--out``: before, after, and
both on one picture). ``--quick`` runs
shorter load steps, for the test suite. Exit 0 when every part of the story was seen, else 1
naming what was not. ::

    .venv/bin/python demo/run.py [--quick] [--out DIR] [--replay]
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from demo.plot import write_before_after  # noqa: E402
from demo.slack_sink import SlackSink  # noqa: E402
from diagnoser.capacity.render import render_capacity_table  # noqa: E402
from diagnoser.capacity.report import CapacityReport  # noqa: E402
from diagnoser.testing.processes import free_port, wait_port  # noqa: E402
from diagnoser.testing.prometheus import LocalPrometheus  # noqa: E402
from examples.feature_service.testbed import FeatureTestBed, RedisServer  # noqa: E402
from tests.fixtures.slack_server import PostedMessage  # noqa: E402

POOL_SIZE = 10
HOLD_MS = 100.0
SLO_P99_MS = 250.0
#: Traffic sent in the incident, as a multiple of the capacity found: beyond the pool's reach.
INCIDENT_LOAD = 1.25
REQUIRED_RISE = 1.5
CHANNEL = "#oncall"


@dataclass(frozen=True)
class Pace:
    """How long each part runs: the full demo, or the test suite's quick run."""

    step_s: float
    incident_s: float
    wait_s: float


# wait_s bounds each wait for a message the demo expects (it returns as soon as the message lands):
# on a busy machine a resolution has taken more than 35 s (a confirmation window, then resolve_after).
FULL = Pace(step_s=5, incident_s=60, wait_s=60)
QUICK = Pace(step_s=3, incident_s=50, wait_s=60)


class Terminal:
    """Narration and Slack messages from two threads, one whole block at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()

    def say(self, text: str = "") -> None:
        with self._lock:
            print(text, flush=True)

    def chapter(self, title: str) -> None:
        elapsed = time.monotonic() - self.started
        self.say(f"\n=== [{elapsed:5.1f} s] {title}")

    def show(self, renderable: object) -> None:
        from rich.console import Console

        with self._lock:
            Console(width=None if sys.stdout.isatty() else 120, highlight=False).print(renderable)


class Processes:
    """Processes the demo started itself, each in its own process group, stopped newest first."""

    def __init__(self) -> None:
        self._running: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with log.open("ab") as out, ENDING_SIGNALS.held():
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=REPO, env=env,
            )  # fmt: skip
            self._running.append(process)
        return process

    def run(self, argv: list[str], log: Path) -> tuple[int, str]:
        """Run to completion (still stopped by :meth:`stop_all` on Ctrl-C); its stdout."""
        out = log.with_suffix(".out")
        with out.open("wb") as stdout, log.open("ab") as stderr:
            with ENDING_SIGNALS.held():
                process = subprocess.Popen(
                    argv, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True,
                    cwd=REPO,
                )  # fmt: skip
                self._running.append(process)
            code = process.wait()
        self._running.remove(process)
        return code, out.read_text(encoding="utf-8")

    @staticmethod
    def stop(process: subprocess.Popen[bytes], signum: int = signal.SIGTERM) -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def stop_all(self) -> None:
        while self._running:
            self.stop(self._running.pop())


class EndingSignals:
    """Ctrl-C, SIGTERM and SIGHUP end the demo through its ``finally``; held back for a moment
    while a child process is started and recorded, so that none starts unrecorded (and is never
    stopped) because the signal came between the two."""

    def __init__(self) -> None:
        self._holding = False
        self._held: int | None = None

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._arrived)

    def _arrived(self, signum: int, frame: FrameType | None) -> None:
        if self._holding:
            self._held = signum
            return
        self._end(signum)

    @staticmethod
    def _end(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    @contextlib.contextmanager
    def held(self, deliver: bool = True) -> Iterator[None]:
        """Hold ending signals within; then act on one that came, unless ``deliver`` is false
        (during the clean-up, which is what the signal asks for anyway)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            signum, self._held = self._held, None
            if signum is not None and deliver:
                self._end(signum)


ENDING_SIGNALS = EndingSignals()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return bytes(reply.read())


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, urllib.error.URLError):
            if check():
                return
        time.sleep(0.25)
    raise RuntimeError(f"{what}: not after {timeout_s:g} s")


def pool_size_recommended(recommendation: str) -> int | None:
    """The size in a pool rule's recommendation ("Raise the pool from 10 to 32 connections ...", or
    "from 10 (inferred: ...) to 32 connections" when the size is inferred); the JSON contract
    carries the recommendation as its text."""
    found = re.search(r"from (\d+)(?: \([^)]*\))? to (\d+) connections", recommendation)
    return int(found.group(2)) if found else None


def load_line_of(message: PostedMessage) -> str | None:
    """The line of an incident's message that says its load against the capacity on record."""
    texts = [b["text"]["text"] for b in message.blocks if b.get("type") == "section"]
    lines = [line.strip("*") for text in texts for line in text.splitlines()]
    found = next((line for line in lines if "req/s now" in line), None)
    return html.unescape(found) if found is not None else None


def cause_of(message: PostedMessage) -> str:
    """The finding's cause, from the message's first line (``CRITICAL: <cause>: ...``)."""
    found = re.search(r"(?:CRITICAL|WARNING|INFO): (\w+)", message.text)
    return found.group(1) if found else ""


class Lab:
    """Everything the demo runs, started in order and stopped whatever happens."""

    def __init__(self, workdir: Path, out: Path, pace: Pace, terminal: Terminal) -> None:
        self.workdir = workdir
        self.out = out
        self.pace = pace
        self.terminal = terminal
        self.processes = Processes()
        self.exit = contextlib.ExitStack()
        self.missing: list[str] = []
        self.service_port = free_port()
        self.daemon_port = free_port()
        self.exporter_port = free_port()
        self.service: FeatureTestBed | None = None
        #: The channel's last screen and ``(top-level, replies, edits)``, kept when the sink closes.
        self.channel = ""
        self.slack_counts = (0, 0, 0)
        #: What the pool incident said of its load against the first capacity run's, once seen.
        self.load_line: str | None = None
        #: The confirm probe's verdict in the pool incident's thread, once seen.
        self.confirm_line: str | None = None

    @property
    def known_user(self) -> str:
        return f"http://127.0.0.1:{self.service_port}/v1/features?user=42"

    @property
    def unknown_user(self) -> str:
        return f"http://127.0.0.1:{self.service_port}/v1/features?user=no-such-user"

    def python(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "diagnoser", *args]

    # --- start ---------------------------------------------------------------------------

    def start(self) -> None:
        say = self.terminal.say
        self.sink = self.exit.enter_context(SlackSink(print_message=say))
        # Each server is recorded for the clean-up before an ending signal can act.
        with ENDING_SIGNALS.held():
            redis = self.exit.enter_context(RedisServer())
        self.processes.start(
            ["prometheus-redis-exporter", "-redis.addr", f"redis://127.0.0.1:{redis.port}",
             "-web.listen-address", f"127.0.0.1:{self.exporter_port}"],
            self.workdir / "redis-exporter.log",
        )  # fmt: skip
        self.redis_port = redis.port
        self.start_service(POOL_SIZE)
        self.prometheus = LocalPrometheus(
            scrape_jobs={
                "feature-service": [f"127.0.0.1:{self.service_port}"],
                "redis": [f"127.0.0.1:{self.exporter_port}"],
                "diagnoser": [f"127.0.0.1:{self.daemon_port}"],
            },
            scrape_interval="1s",
            workdir=self.workdir / "prometheus",
        )
        self.exit.callback(self.prometheus.stop)
        with ENDING_SIGNALS.held():
            self.prometheus.start()
        # The daemon starts once Prometheus holds the service's first samples (about 5.5 s:
        # target discovery is throttled to 5 s); earlier, its first diagnosis would find no data.
        query = urllib.parse.urlencode({"query": "db_client_connection_max"})
        wait_until(lambda: b'"result":[]' not in _get(f"{self.prometheus.url}/api/v1/query?{query}"),
                   30, "Prometheus has no sample of the service")  # fmt: skip
        self.config = self.write_config()
        self.daemon = self.processes.start(
            self.python("serve", "--config", str(self.config)), self.workdir / "daemon.log"
        )
        wait_port(self.daemon_port, timeout=30)
        parts = [
            ("Redis 7", f"127.0.0.1:{redis.port}", f"redis_exporter on :{self.exporter_port}"),
            ("feature service", self.known_user, f"redis-py pool of {POOL_SIZE}, {HOLD_MS:g} ms per use"),
            ("Prometheus", self.prometheus.url, "scrapes the service, the exporter and the daemon every 1 s"),
            ("diagnose serve", f"127.0.0.1:{self.daemon_port}", "diagnoses every 2 s over a 10 s window"),
            ("  its probe", self.unknown_user, "10 req/s for 2 s, every 3 s"),
            ("Slack sink", self.sink.api_url, f"channel {CHANNEL}"
             + (", forwarded to SLACK_WEBHOOK_URL" if self.sink.forward_url else "")),
        ]  # fmt: skip
        for name, where, what in parts:
            say(f"  {name:<17} {where}\n  {'':<17} ({what})")
        say(f"  {'logs and state':<17} {self.workdir}")

    def start_service(self, pool_size: int) -> None:
        bed = FeatureTestBed(pool_size=pool_size, hold_ms=HOLD_MS, prometheus=False,
                             redis_port=self.redis_port, port=self.service_port)  # fmt: skip
        self.service = bed
        with ENDING_SIGNALS.held():
            bed.start()

    def stop_service(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None

    def write_config(self) -> Path:
        probe = self.workdir / "unknown-user.yaml"
        probe.write_text(yaml.safe_dump({
            "target": self.unknown_user,
            "schedule": {"kind": "constant", "rate": 10, "duration_s": 2},
            "expect": {"status": [200], "json_path": "$.features"},
            "timeout_s": 2,
        }), encoding="utf-8")  # fmt: skip
        config = {
            "prometheus": {"url": self.prometheus.url},
            # Short enough that a finding appears and clears within the demo's minutes.
            "window": "10s",
            "slo": {"p99_ms": SLO_P99_MS, "error_ratio": 0.01},
            # Size pools for twice the peak: in two zones, each must carry the whole load if the
            # other fails. It also keeps the rise the demo checks clear of the search's precision.
            "rule_params": {"pools/pool-exhaustion": {"headroom": 2}},
            # The demo's own service on loopback; the incident traffic must outlive a restart.
            "probe": {"allowed_hosts": ["127.0.0.1"], "abort_error_ratio": 1.0},
            # Prometheus scrapes the daemon too, and cannot before the daemon listens: its
            # first diagnosis would report its own target down.
            "silences": [
                {
                    "matchers": {"cause": "source_unavailable", "job": "diagnoser"},
                    "until": (datetime.now(UTC) + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "comment": "the daemon's own scrape target comes up with it",
                }
            ],
            "slack": {
                "token": self.sink.token,
                "channel": CHANNEL,
                "base_url": self.sink.api_url,
                "allowed_addresses": ["127.0.0.1"],  # the sink is on the loopback
                "retry_base_s": 1,
                "in_doubt_settle_s": 5,
            },
            "daemon": {
                "diagnose_interval_s": 2,
                "probe_interval_s": 3,
                "jitter_s": 0,
                "outbox_retry_s": 1,
                "cooldown_s": 3600,
                # An incident is posted once it held 4 s, resolved once clear for 8 s, and one
                # back within 10 minutes reopens its thread (the demo's pace; see docs/daemon.md).
                "pending_for_s": 4,
                "resolve_after_s": 8,
                "reopen_within_s": 600,
                "listen": f"127.0.0.1:{self.daemon_port}",
                "state_path": str(self.workdir / "state.sqlite3"),
                "probe_files": [str(probe)],
            },
            # Once the pool incident resolves, the daemon probes the service at the incident's
            # load (its capacity on record names the target): 3 s after the resolution, so that
            # the incident's own traffic has stopped and does not add to it.
            "verify": {"enabled": True, "duration_s": 3, "delay_s": 3},
        }
        path = self.workdir / "diagnoser.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return path

    def stop(self) -> None:
        self.processes.stop_all()
        self.stop_service()
        sink: SlackSink | None = getattr(self, "sink", None)  # None when start() failed before it
        if sink is not None:
            # What the channel shows, kept for the last screen once the sink is closed.
            self.channel = sink.channel_view()
            self.slack_counts = sink.counts()
        self.exit.close()

    # --- the story -----------------------------------------------------------------------

    def expect(self, found: PostedMessage | None, what: str) -> PostedMessage | None:
        if found is None:
            self.missing.append(what)
            self.terminal.say(f"  !! not seen in time: {what}")
        return found

    def capacity(self, name: str, start_rate: float, max_rate: float) -> CapacityReport | None:
        plot = self.out / f"capacity-{name}.svg"
        argv = self.python(
            "capacity", self.known_user, "--slo-p99-ms", f"{SLO_P99_MS:g}",
            "--step-s", f"{self.pace.step_s:g}", "--start-rate", f"{start_rate:g}",
            "--max-rate", f"{max_rate:g}", "--warmup-s", "1", "--service", "feature-service",
            "--config", str(self.config), "--format", "json", "--plot", str(plot),
        )  # fmt: skip
        self.terminal.say("$ diagnose capacity " + " ".join(argv[4:]).replace(str(self.workdir), "$DEMO"))
        code, stdout = self.processes.run(argv, self.workdir / f"capacity-{name}.log")
        if code not in (0, 1):
            log = (self.workdir / f"capacity-{name}.log").read_text(errors="replace")[-1500:]
            self.missing.append(f"capacity search ({name}) failed with exit {code}")
            self.terminal.say(f"  !! diagnose capacity exited {code}:\n{log}")
            return None
        report = CapacityReport.model_validate_json(stdout)
        self.terminal.show(render_capacity_table(report))
        self.terminal.say(f"plot: {plot}")
        return report

    def story(self) -> tuple[float | None, float | None]:
        t = self.terminal
        sink = self.sink

        t.chapter("The daemon's probe asks for an unknown user's features")
        empty = sink.wait_for(lambda m: cause_of(m) == "empty_success_response", self.pace.wait_s)
        if self.expect(empty, "empty_success_response in Slack") is not None:
            t.say('The service answers 200 {"features": {}}: dashboards count these as successes.')

        t.chapter(f"Stepping the load up until p99 passes the {SLO_P99_MS:g} ms SLO")
        before = self.capacity("before", start_rate=25, max_rate=400)
        if before is None or before.capacity_rps is None or before.bottleneck is None:
            self.missing.append("a knee and a bottleneck in the first capacity search")
            return (before.capacity_rps if before else None), None
        bottleneck = before.bottleneck
        pool = pool_size_recommended(bottleneck.recommendation)
        t.say(f"\nknee: {before.capacity_rps:g} req/s holds the SLO; what gave way first: {bottleneck.cause}"
              + (f";\nLittle's law sizes the pool at {pool} connections" if pool else ""))  # fmt: skip
        if pool is None or pool <= POOL_SIZE:
            self.missing.append("a recommended pool size above the current one")
            return before.capacity_rps, None

        rate = round(INCIDENT_LOAD * before.capacity_rps)
        t.chapter(f"Traffic grows to {rate} req/s, past the knee; the daemon is watching")
        traffic = self.processes.start(
            self.python("probe", self.known_user, "--rate", str(rate), "--format", "json",
                        "--duration", f"{self.pace.incident_s:g}", "--config", str(self.config)),
            self.workdir / "incident-traffic.log",
        )  # fmt: skip
        thread: str | None = None
        resolved: PostedMessage | None = None
        try:
            new = self.pool_incident(since=time.monotonic())
            if new is not None:
                self.load_line = self.capacity_line(new)
                t.say("The daemon names the same cause under live traffic, its size from Little's law on the"
                      " demand it\nmeasures (served, timed out, and the growth of the queue).")  # fmt: skip
                t.chapter(f"Restarting the service with the recommended pool of {pool}, traffic still coming")
                self.stop_service()
                self.start_service(pool)
                t.say(f"  feature service back on {self.known_user} with a pool of {pool}")
                thread = new.ts
                restarted = time.monotonic()
                resolved = sink.wait_for(
                    lambda m: m.thread_ts == thread and m.text.startswith("Resolved") and m.at >= restarted,
                    self.pace.wait_s,
                )
                self.expect(resolved, "connection_pool_exhaustion resolved in its thread")
        finally:
            self.processes.stop(traffic, signal.SIGINT)
        if thread is not None and resolved is not None:
            self.confirm(thread, since=resolved.at)

        t.chapter("Stepping the load up again, from the old knee")
        after = self.capacity("after", start_rate=before.capacity_rps, max_rate=4 * before.capacity_rps)
        if after is None:
            return before.capacity_rps, None
        write_before_after([(f"pool of {POOL_SIZE}", before), (f"pool of {pool}", after)], self.both_plot)
        return before.capacity_rps, after.capacity_rps

    def confirm(self, thread: str, *, since: float) -> None:
        """The confirm probe's verdict in the pool incident's thread, before and after p99, after
        the resolution the restart brought (an earlier one, after the load test, has its own):
        waited for, so that the next load test does not run beside it."""
        self.terminal.chapter("The daemon probes the fixed service at the incident's load")
        verdicts = ("p99 at", "not confirmed")
        reply = self.sink.wait_for(
            lambda m: m.thread_ts == thread and m.text.startswith(verdicts) and m.at >= since,
            self.pace.wait_s,
        )
        if self.expect(reply, "the confirm probe's verdict in the incident's thread") is None:
            return
        assert reply is not None
        self.confirm_line = html.unescape(reply.text).split(": RESOLVED")[0]
        # Confirmed or not is the probe's measurement on this machine (a busy one can push the p99
        # of a just-restarted Python service over the SLO): the demo shows it, and needs only that
        # it names the p99 before and after.
        if "->" not in self.confirm_line and " before" not in self.confirm_line:
            self.missing.append(f"the p99 before and after in the confirm probe's line ({self.confirm_line})")
        self.terminal.say(f"In the incident's thread:\n  {self.confirm_line}")

    def pool_incident(self, since: float) -> PostedMessage | None:
        """The top-level message of the pool's incident: posted now, or the one the load test
        opened, edited or reopened in its thread."""
        seen = self.expect(self.sink.wait_for(
            lambda m: cause_of(m) == "connection_pool_exhaustion" and m.at >= since,
            self.pace.wait_s, edits=True,
        ), "connection_pool_exhaustion in Slack")  # fmt: skip
        if seen is None:
            return None
        thread_ts = seen.thread_ts or seen.ts
        return next((m for m in self.sink.top_level() if m.ts == thread_ts), None)

    def capacity_line(self, incident: PostedMessage) -> str | None:
        """The pool incident's load against the capacity the first run recorded, as its message
        (or an edit of it) says it; the incident may have opened during that run, before it was
        recorded, and say it from its next edit."""
        said = self.sink.wait_for(
            lambda m: m.ts == incident.ts and load_line_of(m) is not None, self.pace.wait_s, edits=True
        )
        line = load_line_of(said) if said is not None else None
        if line is None:
            self.missing.append("the pool incident's load against the capacity on record")
        else:
            self.terminal.say(f"The incident says the load against the first run's capacity:\n  {line}")
        return line

    @property
    def both_plot(self) -> Path:
        return self.out / "capacity-before-after.png"


def replay() -> int:
    """The bundled, backfilled incident (no live system): the old demo, kept for a quick look."""
    from diagnoser.testing.demo import main as replay_main

    code = replay_main([])
    return 0 if code in (0, 1) else code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter load steps (for tests)")
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="where the plots go")
    parser.add_argument("--replay", action="store_true", help="the bundled backfilled incident instead")
    args = parser.parse_args(argv)
    if args.replay:
        return replay()
    ENDING_SIGNALS.install()
    terminal = Terminal()
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="diagnoser-demo-"))
    # Every helper's temp dir (Redis's, Prometheus's) lands inside the demo's own.
    tempfile.tempdir = str(workdir)
    lab = Lab(workdir, args.out.resolve(), QUICK if args.quick else FULL, terminal)
    try:
        terminal.chapter("Starting a small live system on 127.0.0.1")
        lab.start()
        before, after = lab.story()
    except KeyboardInterrupt:
        terminal.say("\ninterrupted: stopping everything the demo started")
        return 130
    except RuntimeError as exc:
        terminal.say(f"\nthe demo could not go on: {exc}")
        return 1
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave servers behind.
        with ENDING_SIGNALS.held(deliver=False):
            lab.stop()
        tempfile.tempdir = None
        shutil.rmtree(workdir, ignore_errors=True)
    terminal.chapter("The #oncall channel, as the on-call engineer sees it")
    terminal.say(lab.channel)
    terminal.chapter("What happened")
    return summarize(terminal, lab, before, after)


def summarize(terminal: Terminal, lab: Lab, before: float | None, after: float | None) -> int:
    say = terminal.say
    if before is not None and after is not None:
        rise = after / before
        say(f"capacity: {before:g} req/s before, {after:g} req/s after the fix ({rise:.2f}x)")
        if rise < REQUIRED_RISE:
            lab.missing.append(f"a capacity rise of at least {REQUIRED_RISE:g}x (measured {rise:.2f}x)")
    else:
        lab.missing.append("capacity before and after")
    if lab.load_line is not None:
        say(f"pool incident: {lab.load_line}")
    if lab.confirm_line is not None:
        say(f"confirm probe after the fix: {lab.confirm_line}")
    top, replies, edits = lab.slack_counts
    say(f"slack: {top} top-level messages, {replies} thread replies, {edits} edits in place")
    plots = [lab.out / f"capacity-{name}.svg" for name in ("before", "after")] + [lab.both_plot]
    say("plots: " + "  ".join(str(p) for p in plots if p.exists()))
    say(f"demo took {time.monotonic() - terminal.started:.0f} s; every process it started is stopped")
    for what in lab.missing:
        say(f"missing: {what}")
    return 1 if lab.missing else 0


if __name__ == "__main__":
    sys.exit(main())
