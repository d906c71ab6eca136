"""Judge a checkout on the unseen beds replayed under the variation harness's variations.

    python bench/unseen_variations.py [--beds-dir DIR ...] [--beds a,b] [--variations v,w]
                                      [--parallel 2] [--out result.json]

The beds of ``tests/fixtures/unseen*`` were recorded live by someone who did not write the rules;
``bench/unseen_beds.py`` judges them as recorded. A rule that names the cause as recorded and not
under an ordinary difference of the same data is fitted to the recording, so each bed is also
replayed, one variation per Prometheus, under:

- ``2h-incident``: the fault's scrapes (onset to fix) repeated for two hours, counters going on
  growing at their rate; judged at the same point of the last cycle as the last incident instant;
- ``30s-scrapes``, ``60s-scrapes``: only the scrapes on that grid, each phase of the grid a case of
  its own (``+15s``: the grid starts at the second recorded scrape), as a coarser scrape catches
  one recorded scrape in two or four by chance;
- ``counter-reset``: every process restarted 2 minutes before the last healthy and again before
  the last incident instant (its own counters from zero; ``up`` and gauges as they were);
- ``1-in-5-scrapes-missing``: one scrape in five of the saturated targets (``saturated_jobs``, or
  the service itself when none is) failed: ``up`` 0 and no other series at it.

Every bed has only the history it was recorded with (8-10 minutes before its fault): that is the
10-minute-history variation already. A backfill has no metadata, so each is without it too.

Each case is judged with ``bench/unseen_beds.py``'s verdicts (the expected cause at warning or
above, naming the subject, a number in range; healthy: nothing at warning or above) at the bed's
last healthy instant (not for ``2h-incident``, whose history is the recording's) and its last
incident instant. A case whose variation removes the evidence itself (``EVIDENCE_GONE``, each
with the raw readings that show it) prints ``GONE`` and is counted apart. Prints a table and the
totals per variation; exit 1 if any other case fails.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import unseen_beds  # noqa: E402  (bench/unseen_beds.py, the verdicts and the replay)

from diagnoser.testing.series import SeriesSpec, parse_series, to_openmetrics  # noqa: E402
from tests.fixtures.expositions.timeline import Timeline  # noqa: E402
from tests.fixtures.variations import counter_reset, downsampled, long_incident  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
#: Every round of recorded beds: ``unseen``, ``unseen2``, ...
DEFAULT_DIRS = sorted(p for p in FIXTURES.glob("unseen*") if p.is_dir())
RESTART_BEFORE_S = 120
DAY_S = 86400
Sample = tuple[SeriesSpec, float, float]
#: The parts of a histogram or summary family whose samples count up.
PARTS = ("_bucket", "_count", "_sum")


@dataclass(frozen=True)
class Bed:
    path: Path
    info: dict[str, Any]
    timeline: Timeline

    @property
    def name(self) -> str:
        return self.path.name


def load_bed(path: Path) -> Bed:
    info = yaml.safe_load((path / "bed.yaml").read_text(encoding="utf-8"))
    specs: dict[str, SeriesSpec] = {}
    samples: list[Sample] = []
    with gzip.open(path / "series.om.gz", "rt", encoding="utf-8") as lines:
        for line in lines:
            if not line.strip() or line.startswith("#"):
                continue
            series, value, stamp = line.rstrip("\n").rsplit(" ", 2)
            spec = specs.get(series)
            if spec is None:
                spec = specs[series] = parse_series(series)
            samples.append((spec, float(stamp), float(value)))
    cumulative = _cumulative(samples, set(specs.values()))
    timeline = Timeline(
        samples=tuple(samples),
        cumulative=cumulative,
        start_s=float(info["start_s"]),
        incident_start_s=float(info["onset_s"]),
        end_s=max(at for _, at, _ in samples),
        interval_s=float(info.get("scrape_interval_s", 15)),
    )
    return Bed(path, info, timeline)


def _cumulative(samples: list[Sample], specs: set[SeriesSpec]) -> frozenset[SeriesSpec]:
    """The series that only ever grow: a counter's name (``_total``; ``_bucket``, ``_count`` and ``_sum``
    beside a family's other parts) and never a fall in the recording. The name alone would take
    gauges for counters: postgres_exporter's ``pg_stat_activity_count`` is the connection count, and
    prom-client's ``nodejs_active_handles_total`` a gauge."""
    names = {s.name for s in specs}
    fell: set[SeriesSpec] = set()
    last: dict[SeriesSpec, float] = {}
    for spec, _, value in sorted(samples, key=lambda s: s[1]):
        if spec in last and value < last[spec]:
            fell.add(spec)
        last[spec] = value

    def counted(name: str) -> bool:
        if name.endswith("_total"):
            return True
        for suffix in PARTS:
            if name.endswith(suffix):
                base = name.removesuffix(suffix)
                return any(f"{base}{other}" in names for other in PARTS if other != suffix)
        return False

    return frozenset(s for s in specs if s not in fell and counted(s.name))


@dataclass(frozen=True)
class Case:
    """A bed's timeline under one variation, and where to judge it."""

    timeline: Timeline
    healthy_at: int | None
    incident_at: int


def _at_last_instants(bed: Bed, timeline: Timeline) -> Case:
    return Case(timeline, bed.info["healthy_at"][-1], bed.info["incident_at"][-1])


def _until_fix(bed: Bed) -> Timeline:
    fix = float(bed.info.get("fix_s", bed.timeline.end_s + 1))
    kept = tuple(s for s in bed.timeline.samples if s[1] < fix)
    return replace(bed.timeline, samples=kept, end_s=max(at for _, at, _ in kept))


def _two_hours(bed: Bed) -> Case:
    fault = _until_fix(bed)
    longer = long_incident(fault)
    # A bed recorded less than two hours ago would end in the future: moved back by whole days
    # (the time of day stays the recording's).
    ahead = longer.end_s - (time.time() - 600)
    if ahead > 0:
        longer = longer.shifted(-DAY_S * math.ceil(ahead / DAY_S))
    before_end = fault.end_s - bed.info["incident_at"][-1]
    return Case(longer, None, int(longer.end_s - before_end))


def _grid(seconds: int, phase: int = 0) -> Callable[[Bed], Case]:
    """Scrapes every ``seconds``, the grid starting ``phase`` recorded scrapes after the first: which
    of the recorded scrapes a coarser one would have caught is chance, so every phase is a case."""
    def varied(bed: Bed) -> Case:
        start = bed.timeline.start_s + phase * bed.timeline.interval_s
        return _at_last_instants(bed, downsampled(replace(bed.timeline, start_s=start), seconds))

    return varied


def _restarted(bed: Bed) -> Case:
    healthy, incident = bed.info["healthy_at"][-1], bed.info["incident_at"][-1]
    timeline = counter_reset(bed.timeline, healthy - RESTART_BEFORE_S)
    return Case(counter_reset(timeline, incident - RESTART_BEFORE_S), healthy, incident)


def _scrapes_missing(bed: Bed, every: int = 5) -> Case:
    jobs = set(bed.info.get("saturated_jobs") or [bed.info["service_job"]])
    timeline = bed.timeline

    def failed(spec: SeriesSpec, at: float) -> bool:
        index = round((at - timeline.start_s) / timeline.interval_s)
        return index % every == every - 1 and dict(spec.labels).get("job") in jobs

    samples = tuple(
        (spec, at, 0.0) if spec.name == "up" and failed(spec, at) else (spec, at, value)
        for spec, at, value in timeline.samples
        if spec.name == "up" or not failed(spec, at)
    )
    return _at_last_instants(bed, replace(timeline, samples=samples))


VARIATIONS: dict[str, Callable[[Bed], Case]] = {
    "recorded": lambda b: _at_last_instants(b, b.timeline),
    "2h-incident": _two_hours,
    "30s-scrapes": _grid(30),
    "30s-scrapes+15s": _grid(30, 1),
    "60s-scrapes": _grid(60),
    "60s-scrapes+15s": _grid(60, 1),
    "60s-scrapes+30s": _grid(60, 2),
    "60s-scrapes+45s": _grid(60, 3),
    "counter-reset": _restarted,
    "1-in-5-scrapes-missing": _scrapes_missing,
}


#: Cases whose variation removes the evidence itself, shown from the bed's raw series (the
#: recorded scrapes on that grid in the 5 minutes before the instant): judged and printed as
#: ``GONE`` with the reason when they miss, counted apart from the failures. A case is added here
#: only with the readings that show it, never because a rule misses it.
EVIDENCE_GONE: dict[tuple[str, str, str], str] = {
    **{
        ("node-open-fds-limit", variation, "incident"): (
            "every scrape of items-api on this grid failed from the onset to the instant (up 0): "
            "no reading of process_open_fds after the onset, only the target down"
        )
        for variation in ("30s-scrapes+15s", "60s-scrapes+15s", "60s-scrapes+45s")
    },
    ("node-open-fds-limit", "60s-scrapes", "incident"): (
        "4 of the 5 scrapes in 5 minutes failed; the one that landed read 83 of 128 descriptors (65%), "
        "under the 75% at which failed scrapes count as at the limit (a hung or restarting process)"
    ),
    ("apache-max-request-workers", "60s-scrapes", "incident"): (
        "every scrape of apache on this grid failed from the onset to the instant; the last that landed, "
        "before the onset, read 1 busy of 10 workers"
    ),
    ("apache-prefork-max-request-workers", "60s-scrapes", "incident"): (
        "every scrape of apache on this grid failed from the onset to the instant; the last that landed, "
        "before the onset, read 3 busy of 12 workers"
    ),
    ("pgbouncer-max-client-conn", "60s-scrapes+15s", "incident"): (
        "the grid's scrapes in 5 minutes read 22, 11, 21, 26, 13 client connections of max_client_conn 40 "
        "(PgBouncer counts no refusals): the recorded scrapes at 40 and 41 fall between them"
    ),
    **{
        ("node-pg-client-max-connections", variation, "incident"): (
            f"the grid's scrapes in 5 minutes read at most {peak} of the 25 usable connections "
            "(pg_stat_activity_count; PostgreSQL's exporter counts no refusals): the recorded "
            "scrape at 24 falls between them"
        )
        for variation, peak in (
            ("30s-scrapes+15s", 22),
            ("60s-scrapes+15s", 22),
            ("60s-scrapes+30s", 20),
            ("60s-scrapes+45s", 20),
        )
    },
    ("apache-max-request-workers-near", "30s-scrapes", "incident"): (
        "the grid's scrapes in 5 minutes read 4, 6, 5, 4, 7, 7, 10, 5, 9, 4 busy of 10 workers (Apache "
        "counts no refusals): one at the limit in ten, what a server touching its maximum once shows; "
        "the 15 s recording had 7 of 20 there"
    ),
    ("apache-max-request-workers-near", "60s-scrapes", "incident"): (
        "the grid's scrapes in 5 minutes read 4, 5, 7, 10, 9 busy of 10 workers (Apache counts no "
        "refusals): one at the limit in five, under the quarter that tells saturation from a burst"
    ),
    ("apache-max-request-workers-near", "60s-scrapes+30s", "incident"): (
        "the grid's scrapes in 5 minutes read 6, 4, 7, 5, 4 busy of 10 workers: the recorded scrapes at "
        "10 all fall between them"
    ),
}


@dataclass(frozen=True)
class Row:
    bed: str
    variation: str
    kind: str
    instant: int
    verdict: str
    found: str


def _judged(repo: Path, bed: Bed, variation: str) -> Iterator[Row]:
    case = VARIATIONS[variation](bed)
    with tempfile.TemporaryDirectory(prefix="unseen-variation-") as tmp:
        copy = Path(tmp) / bed.name
        copy.mkdir()
        with gzip.open(copy / "series.om.gz", "wt", encoding="utf-8") as out:
            out.write(to_openmetrics(case.timeline.samples))
        config = Path(tmp) / "diagnoser.yaml"
        config.write_text(yaml.safe_dump({**bed.info.get("config", {}), "deadline_s": 90}), encoding="utf-8")
        try:
            replay = unseen_beds.Replay(repo, copy)
        except RuntimeError as error:
            yield Row(bed.name, variation, "-", 0, "ERROR", str(error))
            return
        try:
            instants = [("healthy", case.healthy_at)] if case.healthy_at is not None else []
            for kind, at in [*instants, ("incident", case.incident_at)]:
                assert at is not None
                report, error = unseen_beds.diagnose(repo, replay.url, at, config)
                if report is None:
                    yield Row(bed.name, variation, kind, at, "ERROR", error)
                    continue
                if kind == "healthy":
                    ok, text = unseen_beds.judge_healthy(report)
                else:
                    ok, text, _ = unseen_beds.judge_incident(report, bed.info["expect"])
                gone = EVIDENCE_GONE.get((bed.name, variation, kind))
                if not ok and gone is not None:
                    yield Row(bed.name, variation, kind, at, "GONE", f"{gone} (found: {text})")
                    continue
                yield Row(bed.name, variation, kind, at, "PASS" if ok else "FAIL", text)
        finally:
            replay.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to judge (default: this one)")
    parser.add_argument("--beds-dir", type=Path, action="append", help="default: tests/fixtures/unseen*")
    parser.add_argument("--beds", help="comma-separated bed names (default: every bed of the directories)")
    parser.add_argument("--variations", help=f"comma-separated, of: {', '.join(VARIATIONS)} (default: all)")
    parser.add_argument("--parallel", type=int, default=2, help="cases replayed at once")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    repo = args.repo.resolve()
    if not (repo / ".venv" / "bin" / "diagnose").exists():
        parser.error(f"{repo}/.venv/bin/diagnose not found (run make setup in the checkout)")
    dirs = [d.resolve() for d in (args.beds_dir or DEFAULT_DIRS)]
    wanted = set(args.beds.split(",")) if args.beds else None
    paths = sorted(
        (p for d in dirs for p in d.iterdir() if (p / "bed.yaml").exists()
         and (wanted is None or p.name in wanted)),
        key=lambda p: p.name,
    )
    if not paths:
        parser.error("no bed found")
    variations = args.variations.split(",") if args.variations else list(VARIATIONS)
    unknown = sorted(set(variations) - set(VARIATIONS))
    if unknown:
        parser.error(f"unknown variation: {', '.join(unknown)}")
    started = time.monotonic()
    beds = [load_bed(p) for p in paths]
    cases = [(b, v) for b in beds for v in variations]

    def run(case: tuple[Bed, str]) -> list[Row]:
        rows = list(_judged(repo, *case))
        print(f"{case[0].name} {case[1]}: {' '.join(r.verdict for r in rows)}", file=sys.stderr, flush=True)
        return rows

    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        rows = [row for result in pool.map(run, cases) for row in result]
    width = max(len(r.bed) for r in rows)
    print(f"\n{'bed':<{width}}  {'variation':<24} {'kind':<8} verdict  found")
    for r in rows:
        print(f"{r.bed:<{width}}  {r.variation:<24} {r.kind:<8} {r.verdict:<7}  {r.found[:160]}")
    print()
    for variation in variations:
        mine = [r for r in rows if r.variation == variation]
        passed = sum(r.verdict == "PASS" for r in mine)
        gone = sum(r.verdict == "GONE" for r in mine)
        without = f", {gone} without evidence" if gone else ""
        print(f"{variation:<24} {passed:>3} of {len(mine):>3} instants pass{without}")
    passed = sum(r.verdict == "PASS" for r in rows)
    judged = sum(r.verdict != "GONE" for r in rows)
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"{'all':<24} {passed:>3} of {len(rows):>3} ({len(beds)} beds, {repo} at {commit or '?'}, "
          f"{time.monotonic() - started:.0f} s)")
    if args.out:
        args.out.write_text(json.dumps([r.__dict__ for r in rows], indent=2) + "\n", encoding="utf-8")
    return 0 if passed == judged else 1


if __name__ == "__main__":
    sys.exit(main())
