"""Judge a diagnoser checkout on the beds of ``tests/fixtures/unseen``, through its real CLI.

    python bench/unseen_beds.py [--repo /path/to/checkout] [--beds-dir DIR] [--beds a,b] [--out result.json]
                                [--parallel 2]

The beds were recorded live by someone who did not write the rules, and kept from whoever did
until the rules were done (see that directory's README for the first-time results). ``--beds-dir``
judges another set of beds in the same format (every subdirectory with a ``bed.yaml``). For each bed:
backfill ``series.om.gz`` into a fresh Prometheus 2 with the checkout's own
``diagnoser.testing.prometheus.LocalPrometheus`` (run by the checkout's ``.venv/bin/python``),
then run ``<repo>/.venv/bin/diagnose now --prometheus-url URL --at T --format json --config C`` at
each healthy and incident instant of ``bed.yaml`` (C holds the bed's SLO). Verdicts:

- healthy instant: PASS when no finding is at warning or above.
- incident instant: PASS when a finding of the expected cause (or an acceptable one) is at warning
  or above, names the subject (``expect.subject.names``: any of those words in the finding's
  labels, title or summary), no such finding blames only a healthy peer (``expect.subject.not``),
  and a number of that finding (evidence values; numbers in its text, ``ms`` read as 1/1000 s
  when the unit is seconds) lies in ``expect.number`` [min, max].
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
BEDS = REPO / "tests" / "fixtures" / "unseen"
ACTIONABLE = {"warning", "critical"}
#: One ``diagnose now`` run may take this long (a busy machine) before its instant counts as ERROR.
DIAGNOSE_TIMEOUT_S = 300
HELPER = r"""
import gzip, sys
sys.path.insert(0, sys.argv[1])
from diagnoser.testing.prometheus import LocalPrometheus
text = gzip.open(sys.argv[2], "rt", encoding="utf-8").read()
with LocalPrometheus(major="2", openmetrics=text) as prometheus:
    print(prometheus.url, flush=True)
    sys.stdin.read()
"""
DURATION = re.compile(r"second|duration|latency|_time|mean|p99|quantile", re.I)
NUMBER = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)\s*(ms|s|%)?(?![\w])")


class Replay:
    """The bed backfilled into a Prometheus started by the checkout's own helper."""

    def __init__(self, repo: Path, bed: Path) -> None:
        self.process = subprocess.Popen(
            [str(repo / ".venv" / "bin" / "python"), "-c", HELPER, str(repo), str(bed / "series.om.gz")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http"):
            err = self.process.stderr.read() if self.process.stderr else ""
            raise RuntimeError(f"backfill of {bed.name} failed: {err.strip()[-800:]}")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def diagnose(repo: Path, url: str, at: int, config: Path) -> tuple[dict[str, Any] | None, str]:
    cmd = [
        str(repo / ".venv" / "bin" / "diagnose"),
        "now",
        "--prometheus-url",
        url,
        "--at",
        str(at),
        "--format",
        "json",
        "--config",
        str(config),
    ]
    try:
        result = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=DIAGNOSE_TIMEOUT_S,
            cwd=tempfile.gettempdir(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"diagnose now did not finish in {DIAGNOSE_TIMEOUT_S} s"
    if result.returncode not in (0, 1):
        return None, f"exit {result.returncode}: {(result.stderr or result.stdout).strip()[-400:]}"
    try:
        return json.loads(result.stdout), ""
    except json.JSONDecodeError as error:
        return None, f"not JSON ({error}): {result.stdout[:200]!r}"


def finding_text(f: dict[str, Any]) -> str:
    parts = [f.get("title", ""), f.get("summary", ""), *map(str, f.get("labels", {}).values())]
    return " ".join(parts)


def numbers(f: dict[str, Any], unit: str) -> list[float]:
    """Candidate numbers of a finding, in ``unit``."""
    found: list[float] = [
        e["value"]
        for e in f.get("evidence", [])
        if isinstance(e.get("value"), (int, float))
        # a ratio or share in seconds' range must not pass for a duration
        and (unit != "s" or DURATION.search(f"{e.get('query', '')} {e.get('name', '')}"))
    ]
    texts = [
        f.get("title", ""),
        f.get("summary", ""),
        f.get("recommendation", ""),
        *(e.get("text") or "" for e in f.get("evidence", [])),
        *(e.get("detail") or "" for e in f.get("evidence", [])),
    ]
    for text in texts:
        for value, suffix in NUMBER.findall(text):
            v = float(value)
            if unit == "s":
                if suffix == "ms":
                    found.append(v / 1000)
                elif suffix == "s":
                    found.append(v)
            elif suffix in ("", None):
                found.append(v)
    return found


def short(f: dict[str, Any]) -> str:
    labels = ",".join(f"{k}={v}" for k, v in sorted(f.get("labels", {}).items()) if k not in ("instance",))
    return f"{f['cause']}/{f['severity']}[{f['rule_id']}]{{{labels}}}"


def judge_healthy(report: dict[str, Any]) -> tuple[bool, str]:
    loud = [f for f in report["findings"] if f["severity"] in ACTIONABLE]
    if not loud:
        quiet = [short(f) for f in report["findings"]][:3]
        return True, "quiet" + (f" (info: {'; '.join(quiet)})" if quiet else "")
    return False, "; ".join(short(f) for f in loud)


def judge_incident(report: dict[str, Any], expect: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    causes = {expect["cause"], *expect.get("also_acceptable", [])}
    names = [n.lower() for n in expect["subject"].get("names", [])]
    healthy_peers = [n.lower() for n in expect["subject"].get("not", [])]
    number = expect["number"]
    loud = [f for f in report["findings"] if f["severity"] in ACTIONABLE]
    loud_causes = [f for f in loud if f.get("kind") == "cause"]
    top = loud_causes[0]["cause"] if loud_causes else None
    detail: dict[str, Any] = {"top_cause": top, "actionable": [short(f) for f in loud]}
    matching = [f for f in loud if f["cause"] in causes]
    if not matching:
        symptoms = "; ".join(short(f) for f in loud) or "nothing at warning or above"
        return False, f"no {'/'.join(sorted(causes))}: {symptoms}", detail
    wrong = [
        f
        for f in matching
        if any(p in finding_text(f).lower() for p in healthy_peers)
        and not any(n in finding_text(f).lower() for n in names)
    ]
    named = [f for f in matching if any(n in finding_text(f).lower() for n in names)]
    if not named:
        return False, f"cause found but subject not named: {'; '.join(short(f) for f in matching)}", detail
    in_range = [
        f for f in named if any(number["min"] <= v <= number["max"] for v in numbers(f, number["unit"]))
    ]
    if not in_range:
        got = sorted({round(v, 4) for f in named for v in numbers(f, number["unit"])})[:8]
        return (
            False,
            f"{short(named[0])}: no number in [{number['min']}, {number['max']}] {number['unit']}"
            f" (has {got})",
            detail,
        )
    best = in_range[0]
    detail["summary"] = best.get("summary", "")
    if wrong:
        return (
            False,
            f"{short(best)} right, but also blames healthy peer: {'; '.join(short(f) for f in wrong)}",
            detail,
        )
    rank = "top" if top == best["cause"] else f"top is {top}"
    return True, f"{short(best)} ({rank})", detail


def run_bed(repo: Path, bed: Path) -> list[dict[str, Any]]:
    info = yaml.safe_load((bed / "bed.yaml").read_text(encoding="utf-8"))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="unseen-beds-") as tmp:
        config = Path(tmp) / "diagnoser.yaml"
        config.write_text(yaml.safe_dump({**info.get("config", {}), "deadline_s": 90}), encoding="utf-8")
        started = time.monotonic()
        try:
            replay = Replay(repo, bed)
        except RuntimeError as error:
            return [{"bed": bed.name, "instant": "-", "kind": "-", "verdict": "ERROR", "found": str(error)}]
        try:
            for kind, instants in (("healthy", info["healthy_at"]), ("incident", info["incident_at"])):
                for at in instants:
                    report, error = diagnose(repo, replay.url, at, config)
                    row: dict[str, Any] = {
                        "bed": bed.name,
                        "instant": at,
                        "kind": kind,
                        "offset_from_onset_s": at - info["onset_s"],
                    }
                    if report is None:
                        row.update(verdict="ERROR", found=error)
                    elif kind == "healthy":
                        ok, text = judge_healthy(report)
                        row.update(verdict="PASS" if ok else "FAIL", found=text)
                    else:
                        ok, text, detail = judge_incident(report, info["expect"])
                        row.update(verdict="PASS" if ok else "FAIL", found=text, **detail)
                    if report is not None:
                        row["source_errors"] = [
                            f"{e['source']}: {e['message']}"[:160] for e in report.get("errors", [])
                        ]
                    rows.append(row)
        finally:
            replay.close()
        print(f"{bed.name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to judge (default: this one)")
    parser.add_argument(
        "--beds-dir", type=Path, default=BEDS, help=f"where the beds are (default: {BEDS.relative_to(REPO)})"
    )
    parser.add_argument("--beds", help="comma-separated bed names (default: every directory with a bed.yaml)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--parallel", type=int, default=2, help="beds replayed at once")
    args = parser.parse_args()
    repo = args.repo.resolve()
    if not (repo / ".venv" / "bin" / "diagnose").exists():
        parser.error(f"{repo}/.venv/bin/diagnose not found (run make setup in the checkout)")
    beds_dir = args.beds_dir.resolve()
    if not beds_dir.is_dir():
        parser.error(f"{beds_dir} is not a directory")
    names = (
        args.beds.split(",")
        if args.beds
        else sorted(p.name for p in beds_dir.iterdir() if (p / "bed.yaml").exists())
    )
    if not names:
        parser.error(f"no bed (a directory with a bed.yaml) in {beds_dir}")
    beds = [beds_dir / n for n in names]
    missing = [b.name for b in beds if not (b / "bed.yaml").exists()]
    if missing:
        parser.error(f"no such bed: {', '.join(missing)}")
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        rows = [row for result in pool.map(lambda b: run_bed(repo, b), beds) for row in result]
    width = max(len(r["bed"]) for r in rows)
    print(f"\n{'bed':<{width}}  {'instant':<10} {'kind':<8} {'+onset':>7}  verdict  found")
    for r in rows:
        offset = r.get("offset_from_onset_s", "")
        print(
            f"{r['bed']:<{width}}  {r['instant']!s:<10} {r['kind']:<8} {offset!s:>7}  "
            f"{r['verdict']:<7}  {r['found']}"
        )
    passed = sum(r["verdict"] == "PASS" for r in rows)
    print(f"\n{passed} of {len(rows)} instants pass ({repo} at {commit or '?'})")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"repo": str(repo), "commit": commit, "passed": passed, "total": len(rows), "rows": rows},
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
