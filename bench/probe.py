"""Benchmark: the probe against the server's own clock and against native load tools.

Runs the delay server (tests/probe/delay_server.py) pinned to CPU 0, and on CPU 1, one tool at
a time: the probe (on uvloop, through ``run_event_loop`` as every command runs it, and on the
default asyncio loop, as it runs where uvloop is not installed), a plain open loop on aiohttp's client
(uvloop, the same timer, no validation, no phases: the usual way to write this in Python, for
comparison), Debian's ``wrk`` (closed-loop, paced with a Lua ``delay``) and ``hey -q`` (rate-limited
workers). For each rate it prints achieved rate, p50 and p99 of every tool beside the server's
own service time (the physical reference: nothing can measure less), and for the probe its
schedule lag and CPU use, as medians of ``--repeat`` runs (single runs on a VM move with the
host's scheduling). The sweep climbs until the probe saturates (median lag over 2 ms or the rate
not met, twice in a row); lag p99 is the goals' measure (under 2 ms: it kept its schedule). A
second table repeats a 1 s server stall at 100 req/s and adds a closed-loop client (one
connection, back to back), whose p99 hides it.

    .venv/bin/python bench/probe.py                       # the full sweep (several minutes)
    .venv/bin/python bench/probe.py --rates 100,1000 --duration 5 --repeat 1 --skip-stall
    .venv/bin/python bench/probe.py --spin-us 0           # without the probe's timer spin (config)
    .venv/bin/python bench/probe.py --scale               # 1 and N workers against nginx (probe_scale.py)
    .venv/bin/python bench/probe.py --grpc --rates 200    # the gRPC client (bench/probe_grpc.py)

All traffic goes to 127.0.0.1, each run is bounded by its duration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "tests" / "probe" / "delay_server.py"
sys.path.insert(0, str(REPO))

LAG_LIMIT_MS = 2.0


# -- the server ---------------------------------------------------------------------------------


class Server:
    def __init__(self, cpu: int) -> None:
        command = [sys.executable, str(SERVER), "--port", "0", "--uvloop"]
        if shutil.which("taskset"):
            command = ["taskset", "-c", str(cpu), *command]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(
            self.url + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def reset(self) -> None:
        self.call("POST", "/stats/reset")
        self.call("POST", "/control/stall?ms=0&after_s=0")

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", "/stats")
        return result

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=5)


# -- children: the probe and the closed-loop client, each in its own pinned process -------------


def child_probe(url: str, rate: float, duration: float, loop: str) -> None:
    from diagnoser.config import PROBE_MAX_DURATION_CEILING_S, PROBE_MAX_RATE_CEILING, ProbeSettings
    from diagnoser.probe import ProbeRun, run_event_loop, spec_from_url

    spec = spec_from_url(url, rate=rate, duration_s=duration)
    # The highest caps the config accepts; the run itself is not capped (enforce_safety is not
    # called), so the sweep may go past the production ceiling to find where the probe saturates.
    settings = ProbeSettings(
        max_rate=PROBE_MAX_RATE_CEILING, max_duration_s=PROBE_MAX_DURATION_CEILING_S, abort_error_ratio=1.0
    )
    if "BENCH_SPIN_US" in os.environ:
        settings = settings.model_copy(update={"timer_spin_us": float(os.environ["BENCH_SPIN_US"])})
    run = ProbeRun(spec, settings)

    async def main() -> dict[str, Any]:
        cpu_before = time.process_time()
        wall_before = time.monotonic()
        result = await run.run()
        cpu = time.process_time() - cpu_before
        wall = time.monotonic() - wall_before
        return {"result": result.model_dump(mode="json", exclude={"histogram"}), "cpu_s": cpu, "wall_s": wall}

    # "uvloop" is the probe's own event-loop policy; "asyncio" is the fallback without uvloop.
    out = run_event_loop(main()) if loop == "uvloop" else asyncio.run(main())
    print(json.dumps(out))


def child_bare(url: str, rate: float, duration: float) -> None:
    """A plain open loop on aiohttp's client + uvloop with the probe's timer: no validation, no
    phases. Not a product: the usual way to write this in Python, to compare the probe with."""
    import aiohttp
    import uvloop
    from hdrh.histogram import HdrHistogram

    from diagnoser.probe.timer import make_timer

    async def main() -> dict[str, Any]:
        latency = HdrHistogram(1, 60_000_000, 3)
        lag = HdrHistogram(1, 60_000_000, 3)
        in_flight: set[asyncio.Task[None]] = set()
        count = int(rate * duration)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=10000)) as session:

            async def one(intended: float) -> None:
                lag.record_value(max(1, int((time.monotonic() - intended) * 1e6)))
                async with session.get(url) as response:
                    await response.read()
                latency.record_value(max(1, int((time.monotonic() - intended) * 1e6)))

            timer = make_timer()
            loop = asyncio.get_running_loop()

            async def wait_until(deadline: float) -> None:
                due: asyncio.Future[None] = loop.create_future()
                timer.call_at(deadline, lambda: due.set_result(None))
                await due

            cpu_before = time.process_time()
            start = time.monotonic() + 0.02
            for i in range(count):
                intended = start + i / rate
                if intended > time.monotonic():
                    await wait_until(intended)
                task = loop.create_task(one(intended))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            sent_by = time.monotonic()
            await asyncio.gather(*in_flight)
            cpu = time.process_time() - cpu_before
            timer.close()
        elapsed = max(duration, sent_by - start)
        return {
            "rate": count / elapsed,
            "p50": latency.get_value_at_percentile(50) / 1000,
            "p99": latency.get_value_at_percentile(99) / 1000,
            "lag50": lag.get_value_at_percentile(50) / 1000,
            "lag99": lag.get_value_at_percentile(99) / 1000,
            "cpu_pct": 100 * cpu / elapsed,
        }

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        print(json.dumps(runner.run(main())))


def child_closed_loop(url: str, duration: float) -> None:
    import aiohttp
    from hdrh.histogram import HdrHistogram

    async def main() -> dict[str, Any]:
        histogram = HdrHistogram(1, 60_000_000, 3)
        count = 0
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            end = time.monotonic() + duration
            while time.monotonic() < end:
                started = time.monotonic()
                async with session.get(url) as response:
                    await response.read()
                histogram.record_value(max(1, int((time.monotonic() - started) * 1e6)))
                count += 1
        return {
            "rate": count / duration,
            "p50": histogram.get_value_at_percentile(50) / 1000,
            "p99": histogram.get_value_at_percentile(99) / 1000,
            "max": histogram.get_max_value() / 1000,
        }

    print(json.dumps(asyncio.run(main())))


def run_child(cpu: int, *args: str, timeout: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", *args]
    if shutil.which("taskset"):
        command = ["taskset", "-c", str(cpu), *command]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed: {completed.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


# -- native tools ---------------------------------------------------------------------------------


def _seconds(value: str, unit: str) -> float:
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]


def run_wrk(cpu: int, url: str, rate: float, duration: float, latency_ms: float) -> dict[str, Any] | None:
    if not shutil.which("wrk"):
        return None
    # wrk is closed-loop: each connection waits ``delay`` ms after each answer. Enough
    # connections at that pace approximate the rate; the achieved rate is printed beside it.
    pause_ms = 10
    connections = max(1, math.ceil(rate * (latency_ms + pause_ms) / 1000))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f"function delay()\n  return {pause_ms}\nend\n")
    command = ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency", "-s", script.name, url]
    if shutil.which("taskset"):
        command = ["taskset", "-c", str(cpu), *command]
    try:
        out = subprocess.run(
            command, capture_output=True, text=True, timeout=duration + 30, check=False
        ).stdout
    finally:
        os.unlink(script.name)
    matches = re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s|m)\s*$", out, flags=re.M)
    found = {p: _seconds(v, u) * 1000 for p, v, u in matches}
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not found or not rps:
        return None
    return {"rate": float(rps.group(1)), "p50": found["50"], "p99": found["99"]}


def run_hey(cpu: int, url: str, rate: float, duration: float, latency_ms: float) -> dict[str, Any] | None:
    if not shutil.which("hey"):
        return None
    # hey's -q paces each worker; a worker is closed-loop, so give it room: at most half its
    # back-to-back rate each.
    per_worker_max = 1000 / max(latency_ms, 0.1) / 2
    workers = max(1, math.ceil(rate / per_worker_max))
    command = ["hey", "-z", f"{duration:g}s", "-c", str(workers), "-q", f"{rate / workers:g}", url]
    if shutil.which("taskset"):
        command = ["taskset", "-c", str(cpu), *command]
    out = subprocess.run(command, capture_output=True, text=True, timeout=duration + 30, check=False).stdout
    percent = {p: float(v) * 1000 for p, v in re.findall(r"^\s+(50|99)% in ([\d.]+) secs", out, flags=re.M)}
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if "50" not in percent or "99" not in percent or not rps:
        return None
    return {"rate": float(rps.group(1)), "p50": percent["50"], "p99": percent["99"]}


# -- the tables -----------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _median(values: list[float | None]) -> float | None:
    present = sorted(v for v in values if v is not None)
    return present[len(present) // 2] if present else None


def _probe_figures(out: dict[str, Any], own: dict[str, Any]) -> dict[str, float | None]:
    result = out["result"]
    p50 = result["latency_ms"]["p50"]
    return {
        "rate": result["achieved_rate"],
        "p50": p50,
        "p99": result["latency_ms"]["p99"],
        "lag50": result["schedule_lag_ms"]["p50"],
        "lag99": result["schedule_lag_ms"]["p99"],
        "cpu_pct": 100 * out["cpu_s"] / out["wall_s"],
        "server_p50": own["p50_ms"],
        "server_p99": own["p99_ms"],
        "p50_gap": p50 - own["p50_ms"] if p50 is not None and own["p50_ms"] is not None else None,
    }


def sweep(
    server: Server,
    rates: list[float],
    duration: float,
    delay_ms: float,
    loops: list[str],
    cpu: int,
    repeat: int,
) -> None:
    url = f"{server.url}/delay?ms={delay_ms:g}"
    header = (
        f"{'rate':>6} | {'server p50':>10} {'p99':>7} | "
        + " | ".join(
            f"{'probe/' + loop:>16} {'rate':>7} {'p50':>7} {'p99':>7} {'lag50':>6} {'lag99':>6} {'cpu%':>5}"
            for loop in loops
        )
        + f" | {'aiohttp':>9} {'p50':>7} {'lag99':>6} {'cpu%':>5}"
        + f" | {'wrk rate':>8} {'p50':>7} {'p99':>7} | {'hey rate':>8} {'p50':>7} {'p99':>7}"
    )  # fmt: skip
    from diagnoser.config import ProbeSettings

    spin = os.environ.get("BENCH_SPIN_US", f"{ProbeSettings().timer_spin_us:g}")
    print(
        f"\nOpen-loop sweep: server delays {delay_ms:g} ms; latencies in ms; probe on CPU {cpu}, one core; "
        f"probe figures are medians of {repeat} runs; timer spin {spin} us\n"
    )
    print(header)
    print("-" * len(header))
    # A loop stops after two saturated rates in a row (one can be a noisy neighbour's doing).
    misses = dict.fromkeys(loops, 0)
    bare_misses = 0
    for rate in rates:
        cells = []
        server_cells = None
        for loop in loops:
            if misses[loop] >= 2:
                cells.append(f"{'(saturated)':>16} {'':>7} {'':>7} {'':>7} {'':>6} {'':>6} {'':>5}")
                continue
            runs = []
            for _ in range(repeat):
                server.reset()
                out = run_child(cpu, "probe", url, str(rate), str(duration), loop, timeout=duration + 60)
                runs.append(_probe_figures(out, server.stats()))
            # Each figure is the median over the repeats: a VM's scheduling noise moves single runs.
            fig = {key: _median([run[key] for run in runs]) for key in runs[0]}
            if server_cells is None:
                server_cells = f"{_f(fig['server_p50']):>10} {_f(fig['server_p99']):>7}"
            cells.append(
                f"{'p50 +' + _f(fig['p50_gap']) + ' ms':>16} {fig['rate']:>7.0f} "
                f"{_f(fig['p50']):>7} {_f(fig['p99']):>7} "
                f"{_f(fig['lag50']):>6} {_f(fig['lag99']):>6} {fig['cpu_pct']:>5.0f}"
            )
            # Saturation, not a noisy neighbour: the median request leaves late or the rate is not met.
            lag50 = fig["lag50"]
            saturated = lag50 is None or lag50 > LAG_LIMIT_MS or fig["rate"] < 0.95 * rate
            misses[loop] = misses[loop] + 1 if saturated else 0
        bare_cells = f"{'(saturated)':>30}"
        if bare_misses < 2:
            server.reset()
            bare = run_child(cpu, "bare", url, str(rate), str(duration), timeout=duration + 60)
            bare_cells = (
                f"{bare['rate']:>9.0f} {_f(bare['p50']):>7} {_f(bare['lag99']):>6} {bare['cpu_pct']:>5.0f}"
            )
            saturated = bare["lag50"] > LAG_LIMIT_MS or bare["rate"] < 0.95 * rate
            bare_misses = bare_misses + 1 if saturated else 0
        server.reset()
        wrk = run_wrk(cpu, url, rate, duration, delay_ms)
        server.reset()
        hey = run_hey(cpu, url, rate, duration, delay_ms)
        wrk_cells = (
            f"{_f(wrk['rate'], 0):>8} {_f(wrk['p50']):>7} {_f(wrk['p99']):>7}" if wrk else f"{'n/a':>24}"
        )
        hey_cells = (
            f"{_f(hey['rate'], 0):>8} {_f(hey['p50']):>7} {_f(hey['p99']):>7}" if hey else f"{'n/a':>24}"
        )
        print(
            f"{rate:>6.0f} | {server_cells or '':>18} | "
            + " | ".join(cells)
            + f" | {bare_cells} | {wrk_cells} | {hey_cells}",
            flush=True,
        )
        if all(m >= 2 for m in misses.values()) and bare_misses >= 2:
            break


def stall(server: Server, duration: float, delay_ms: float, cpu: int) -> None:
    url = f"{server.url}/delay?ms={delay_ms:g}"
    rate = 100.0
    stall_at = duration * 0.4
    print(f"\nCoordinated omission: {rate:g} req/s for {duration:g} s, the server stalls once for 1 s\n")
    print(f"{'client':<34} {'rate':>7} {'p50':>8} {'p99':>8} {'max':>8}   server's own p50 / p99 / max")
    rows: list[tuple[str, dict[str, Any] | None]] = []

    def arm() -> None:
        server.reset()
        server.call("POST", f"/control/stall?ms=1000&after_s={stall_at:g}")

    arm()
    out = run_child(cpu, "probe", url, str(rate), str(duration), "uvloop", timeout=duration + 60)
    result = out["result"]
    rows.append(
        (
            "probe (open loop, intended time)",
            {"rate": result["achieved_rate"], "p50": result["latency_ms"]["p50"],
             "p99": result["latency_ms"]["p99"], "max": result["latency_ms"]["max"], "own": server.stats()},
        )
    )  # fmt: skip
    arm()
    wrk = run_wrk(cpu, url, rate, duration, delay_ms)
    rows.append(("wrk (paced, CO-corrected)", {**wrk, "max": None, "own": server.stats()} if wrk else None))
    arm()
    hey = run_hey(cpu, url, rate, duration, delay_ms)
    rows.append(("hey -q (paced workers)", {**hey, "max": None, "own": server.stats()} if hey else None))
    arm()
    closed = run_child(cpu, "closed", url, str(duration), timeout=duration + 60)
    rows.append(("closed loop, 1 connection", {**closed, "own": server.stats()}))
    for name, row in rows:
        if row is None:
            print(f"{name:<34} {'n/a':>7}")
            continue
        own = row["own"]
        print(
            f"{name:<34} {row['rate']:>7.0f} {_f(row['p50']):>8} {_f(row['p99']):>8} {_f(row['max']):>8}   "
            f"{_f(own['p50_ms'])} / {_f(own['p99_ms'])} / {_f(own['max_ms'])}"
        )


def main() -> None:
    if "--scale" in sys.argv:  # rate per core with 1 and N workers against nginx, beside wrk and hey
        sys.path.insert(0, str(REPO / "bench"))
        import probe_scale

        probe_scale.main([a for a in sys.argv[1:] if a != "--scale"])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--grpc":
        import probe_grpc  # beside this script: the same comparison for grpc:// targets

        sys.argv = [probe_grpc.__file__, *sys.argv[2:]]
        probe_grpc.main()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, *rest = sys.argv[2:]
        if kind == "probe":
            child_probe(rest[0], float(rest[1]), float(rest[2]), rest[3])
        elif kind == "bare":
            child_bare(rest[0], float(rest[1]), float(rest[2]))
        else:
            child_closed_loop(rest[0], float(rest[1]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="100,500,1000,1500,2000,2500,3000,3500,4000")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--delay-ms", type=float, default=10.0)
    parser.add_argument("--loops", default="uvloop,asyncio", help="event loops to run the probe on")
    parser.add_argument("--repeat", type=int, default=3, help="probe runs per rate (medians are shown)")
    parser.add_argument(
        "--spin-us", type=float, default=None, help="the probe's timer_spin_us (default: the config's)"
    )
    parser.add_argument("--skip-stall", action="store_true")
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args()
    server_cpu, client_cpu = (0, 1) if (os.cpu_count() or 1) >= 2 else (0, 0)
    server = Server(server_cpu)
    try:
        print(f"cpus: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.2f}")
        if not args.skip_sweep:
            rates = [float(r) for r in args.rates.split(",")]
            if args.spin_us is not None:
                os.environ["BENCH_SPIN_US"] = f"{args.spin_us:g}"
            loops = args.loops.split(",")
            sweep(server, rates, args.duration, args.delay_ms, loops, client_cpu, max(1, args.repeat))
        if not args.skip_stall:
            stall(server, 10.0, 20.0, client_cpu)
        print(f"\nload average after: {os.getloadavg()[0]:.2f}; max RSS of this script "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")  # fmt: skip
    finally:
        server.close()


if __name__ == "__main__":
    main()
