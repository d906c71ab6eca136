"""Benchmark: the probe's gRPC client, its cost per call and its latency over the server's own.

Runs the test feature service (tests/probe/grpc_server.py: grpcio's asyncio server, its proto
compiled at start, 10 ms per call) pinned to CPU 0, and on CPU 1 ``diagnose probe``'s open loop
(``ProbeRun`` on a grpc:// spec, through ``run_event_loop`` as every command runs it), once with
the message types from ``--proto`` and once through server reflection, and a bare open loop of
grpc.aio calls (the same timer, nothing else) to tell the probe's cost from grpcio's own.
For each rate it prints
the achieved rate, the probe's p50 and p99 (from the intended send time) beside the server's own
service time (handler entry to answer), the schedule lag p99, the client's CPU per call (every
thread of the process: grpc's own poller and the event loop) and the rate one core would carry
at that cost. The sweep stops when the probe cannot keep the rate twice in a row; a lag p99 over
2 ms is flagged (the probe's own warning).

ghz (the usual gRPC load tool) is compared when it is on the PATH. It is a Go program: there is
no Debian package of it, and the Go module proxy it is installed from is not reachable from these
machines (PyPI, Debian and npm are), so here it is reported as not installed.

    .venv/bin/python bench/probe_grpc.py                        # 200 .. 2000 calls/s, 5 s each
    .venv/bin/python bench/probe_grpc.py --rates 200 --duration 10 --repeat 3

All traffic goes to 127.0.0.1; each run is bounded by its duration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SERVER = REPO / "tests" / "probe" / "grpc_server.py"
PROTO = REPO / "tests" / "probe" / "protos" / "features.proto"
DATA = '{"user_id": "u1"}'
LAG_LIMIT_MS = 2.0


def _pinned(cpu: int, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpu), *command] if shutil.which("taskset") else command


class Server:
    def __init__(self, cpu: int) -> None:
        from tests.probe.grpc_server import compile_features

        self.process = subprocess.Popen(
            _pinned(cpu, [sys.executable, str(SERVER), "--port", "0"]), stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline().split()[1])
        self._out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-grpc-{os.getpid()}"
        self._out.mkdir(exist_ok=True)
        self.pb, self.pb_grpc, self.empty = compile_features(self._out)

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}/features.v1.Features/Get"

    def _control(self) -> Any:
        import grpc

        return self.pb_grpc.ControlStub(grpc.insecure_channel(f"127.0.0.1:{self.port}"))

    def reset(self) -> None:
        self._control().Reset(self.empty.Empty(), timeout=5)

    def stats(self) -> Any:
        return self._control().Stats(self.empty.Empty(), timeout=5)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=5)
        shutil.rmtree(self._out, ignore_errors=True)


def child_probe(url: str, rate: float, duration: float, through: str) -> None:
    """One probe run in this (pinned) process; prints its result and CPU as JSON."""
    from diagnoser.config import PROBE_MAX_DURATION_CEILING_S, PROBE_MAX_RATE_CEILING, ProbeSettings
    from diagnoser.probe import ProbeRun, build_spec, run_event_loop
    from diagnoser.probe.entry import GrpcRequest, resolve_target

    settings = ProbeSettings(
        max_rate=PROBE_MAX_RATE_CEILING, max_duration_s=PROBE_MAX_DURATION_CEILING_S, abort_error_ratio=1.0
    )
    if "BENCH_SPIN_US" in os.environ:
        settings = settings.model_copy(update={"timer_spin_us": float(os.environ["BENCH_SPIN_US"])})
    grpc = GrpcRequest(data=DATA, proto=PROTO if through == "proto" else None)
    spec, explicit = build_spec(url, rate=rate, duration_s=duration, grpc=grpc)
    spec = resolve_target(spec, settings, explicit_target=explicit)
    run = ProbeRun(spec, settings)

    async def main() -> dict[str, Any]:
        cpu_before, wall_before = time.process_time(), time.monotonic()
        result = await run.run()
        cpu, wall = time.process_time() - cpu_before, time.monotonic() - wall_before
        return {"result": result.model_dump(mode="json", exclude={"histogram"}), "cpu_s": cpu, "wall_s": wall}

    print(json.dumps(run_event_loop(main())))


def child_bare(url: str, rate: float, duration: float) -> None:
    """A plain open loop of grpc.aio calls with the probe's timer: no validation, no phases, one
    channel. Not a product: what grpcio itself costs, for the probe to be compared with."""
    import asyncio

    import grpc.aio

    from diagnoser.probe import run_event_loop
    from diagnoser.probe.grpc_target import parse_grpc_target
    from diagnoser.probe.timer import make_timer

    target = parse_grpc_target(url)
    request = b"\x0a\x02u1"  # GetFeaturesRequest{user_id: "u1"}

    async def main() -> dict[str, Any]:
        latency: list[float] = []
        lag: list[float] = []
        loop = asyncio.get_running_loop()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{target.port}")
        call = channel.unary_unary(target.path)
        await channel.channel_ready()
        timer = make_timer()
        in_flight: set[asyncio.Task[None]] = set()

        failed = 0

        async def one(intended: float) -> None:
            nonlocal failed
            lag.append(time.monotonic() - intended)
            try:
                await call(request, timeout=5)
            except grpc.aio.AioRpcError:
                failed += 1
            latency.append(time.monotonic() - intended)

        async def wait_until(deadline: float) -> None:
            due: asyncio.Future[None] = loop.create_future()
            timer.call_at(deadline, lambda: due.set_result(None))
            await due

        cpu_before, count = time.process_time(), int(rate * duration)
        start = time.monotonic() + 0.02
        for i in range(count):
            intended = start + i / rate
            if intended > time.monotonic():
                await wait_until(intended)
            task = loop.create_task(one(intended))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        await asyncio.gather(*in_flight)
        cpu = time.process_time() - cpu_before
        timer.close()
        await channel.close()
        latency.sort()
        lag.sort()

        def at(values: list[float], share: float) -> float:
            return values[min(len(values) - 1, int(share * len(values)))] * 1000

        return {"result": {
            "achieved_rate": count / duration, "sent": count, "status_counts": {"OK": count - failed},
            "latency_ms": {"p50": at(latency, 0.5), "p99": at(latency, 0.99)},
            "schedule_lag_ms": {"p99": at(lag, 0.99)},
        }, "cpu_s": cpu}  # fmt: skip

    print(json.dumps(run_event_loop(main())))


def run_probe(cpu: int, server: Server, rate: float, duration: float, through: str) -> dict[str, Any]:
    server.reset()
    command = [sys.executable, __file__, "--child", server.url, str(rate), str(duration), through]
    done = subprocess.run(
        _pinned(cpu, command), capture_output=True, text=True, timeout=duration + 60, check=True
    )
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    own = server.stats()
    result = out["result"]
    cpu_per_call_us = out["cpu_s"] / max(1, result["sent"]) * 1e6
    return {
        "rate": result["achieved_rate"],
        "p50": result["latency_ms"]["p50"],
        "p99": result["latency_ms"]["p99"],
        "lag99": result["schedule_lag_ms"]["p99"],
        "ok": result["status_counts"].get("OK", 0) == result["sent"],
        "cpu_us": cpu_per_call_us,
        "per_core": 1e6 / cpu_per_call_us if cpu_per_call_us else 0.0,
        "own50": own.p50_ms,
        "own99": own.p99_ms,
    }


_COLUMNS = ("rate", "p50", "p99", "lag99", "cpu_us", "per_core", "own50", "own99")


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def sweep(
    server: Server, rates: list[float], duration: float, repeat: int, cpu: int, throughs: list[str]
) -> None:
    print(
        "\nserver p50/p99: the handler's own time; past about 1,500 calls/s on one core the test server's"
        " own gRPC stack queues the calls before the handler (p50 far over it while the rate holds)"
    )
    print(
        f"{'client':<22} {'rate':>6} {'achieved':>8} {'p50':>7} {'p99':>7} {'server p50/p99':>15}"
        f" {'p50-own':>8} {'lag p99':>8} {'cpu/call':>9} {'calls/s/core':>12}"
    )
    for through in throughs:
        saturated = 0
        for rate in rates:
            rows = [run_probe(cpu, server, rate, duration, through) for _ in range(repeat)]
            m = {k: _median(rows, k) for k in _COLUMNS}
            flag = "" if all(r["ok"] for r in rows) else "  (not every call OK)"
            flag += "  (lag p99 over 2 ms)" if m["lag99"] > LAG_LIMIT_MS else ""
            name = "bare grpc.aio loop" if through == "bare" else f"probe, {through}"
            print(
                f"{name:<22} {rate:>6.0f} {m['rate']:>8.1f} {m['p50']:>7.2f} {m['p99']:>7.2f}"
                f" {m['own50']:>7.2f}/{m['own99']:<7.2f} {m['p50'] - m['own50']:>+8.2f} {m['lag99']:>8.2f}"
                f" {m['cpu_us']:>7.0f}us {m['per_core']:>12.0f}{flag}"
            )
            # The rate not held is saturation; a lag p99 over the limit alone is a busy host here.
            saturated = saturated + 1 if m["rate"] < 0.97 * rate else 0
            if saturated >= 2:
                break
    ghz = shutil.which("ghz")
    if ghz is None:
        print(
            "\nghz: not installed (a Go program: no Debian package, and the Go module proxy is not "
            "reachable here)"
        )
    else:
        print(f"\nghz at {ghz}: run it with --async --rps R --proto {PROTO} --call features.v1.Features.Get")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, rate, duration, through = sys.argv[2:6]
        if through == "bare":
            child_bare(url, float(rate), float(duration))
        else:
            child_probe(url, float(rate), float(duration), through)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="200,500,1000,1500,2000")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per rate (medians are shown)")
    parser.add_argument(
        "--through",
        default="proto,reflection,bare",
        help="where the probe's message types come from; bare: grpc.aio alone, for comparison",
    )
    parser.add_argument(
        "--spin-us", type=float, default=None, help="the probe's timer_spin_us (default: the config's)"
    )
    args = parser.parse_args()
    if args.spin_us is not None:
        os.environ["BENCH_SPIN_US"] = f"{args.spin_us:g}"
    server_cpu, client_cpu = (0, 1) if (os.cpu_count() or 1) >= 2 else (0, 0)
    server = Server(server_cpu)
    try:
        print(f"cpus: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.2f}")
        rates = [float(r) for r in args.rates.split(",")]
        sweep(server, rates, args.duration, max(1, args.repeat), client_cpu, args.through.split(","))
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    finally:
        server.close()


if __name__ == "__main__":
    main()
