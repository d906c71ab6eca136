"""Benchmark: analyse a 1,000,000-line Elasticsearch search slow log; print wall time and peak RSS.

Generates (into a temporary directory, removed afterwards) a slow log in the ES 8 JSON layout,
rotated the way Elasticsearch rotates it: one live file plus three older files, one of them
gzipped. The entries mix clean queries and the anti-patterns diagnoser flags, with random literal
values so shapes must be normalised to group. The search slow log is written per shard, so by
default each slow search appears on 1 to 5 shards (lines with the same body, different shard,
time and hit count); ``--unique`` makes every line a different search, the worst case. The
analysis runs in a fresh process so its peak RSS is its own, not the generator's::

    .venv/bin/python bench/slowlog.py                 # 1,000,000 lines
    .venv/bin/python bench/slowlog.py --unique        # every line a different body
    .venv/bin/python bench/slowlog.py --lines 200000 --workers 1

Goal (issue 4): under 30 s and under 300 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

WORDS = ["phone", "case", "charger", "cable", "lamp", "shoes", "socks", "desk", "usb", "hdmi", "red", "blue"]
NODES = ["es-node-1", "es-node-2", "es-node-3"]


def _body(rng: random.Random) -> dict[str, object]:
    """One request body; about half clean, the rest spread over the anti-patterns."""
    word = rng.choice(WORDS)
    kind = rng.random()
    filtered = {"_source": {"includes": ["title", "price"], "excludes": []}}
    match = {"match": {"title": {"query": f"{word} {rng.choice(WORDS)}", "operator": "OR", "boost": 1.0}}}
    if kind < 0.5:
        return {
            "size": 10,
            "query": {
                "bool": {
                    "must": [match],
                    "filter": [
                        {"term": {"brand": {"value": f"brand-{rng.randint(1, 500)}", "boost": 1.0}}},
                        {
                            "range": {
                                "price": {"from": None, "to": rng.randint(5, 500), "include_upper": True}
                            }
                        },
                    ],
                    "adjust_pure_negative": True,
                    "boost": 1.0,
                }
            },
            **filtered,
        }
    if kind < 0.65:
        return {
            "size": 20,
            "query": {"query_string": {"query": f"*{word}*", "fields": ["title^1.0"]}},
            **filtered,
        }
    if kind < 0.75:
        return {
            "from": rng.randint(10_000, 50_000),
            "size": 100,
            "query": {"bool": {"filter": [{"term": {"status": {"value": rng.choice(["paid", "shipped"])}}}]}},
            "sort": [{"created_at": {"order": "desc"}}],
            "_source": {"includes": ["id"], "excludes": []},
        }
    if kind < 0.85:
        return {
            "size": 10,
            "query": match,
            "sort": [
                {
                    "_script": {
                        "script": {"source": "doc['price'].value * params.f", "params": {"f": rng.random()}},
                        "type": "number",
                        "order": "asc",
                    }
                }
            ],
            "_source": False,
        }
    if kind < 0.95:
        return {
            "size": 50,
            "track_total_hits": True,
            "query": {"regexp": {"host": {"value": f"web-{word}.*"}}},
        }
    return {
        "size": 10,
        "query": {"term": {"sku": f"SKU-{rng.randint(1, 99_999)}"}},
        "highlight": {"fields": {"title": {}}},
    }


def _search(rng: random.Random) -> tuple[str, str]:
    """A search: its index and its body as the layout writes it (escaped a second time)."""
    body = json.dumps(_body(rng), separators=(",", ":")).replace('"', '\\"')
    return rng.choice(["products", "orders-2026.11", "logs-app"]), body


def _line(rng: random.Random, second: int, search: tuple[str, str]) -> str:
    index, body = search
    took = rng.randint(500, 6_000)
    node = rng.choice(NODES)
    clock = f"{(second // 3600) % 24:02d}:{(second // 60) % 60:02d}:{second % 60:02d}"
    stamp = f"2026-11-29T{clock}.{rng.randint(0, 999):03d}Z"
    hits = rng.randint(0, 900_000)
    return (
        f'{{"@timestamp":"{stamp}", "log.level": "WARN", "elasticsearch.slowlog.id":null,'
        f'"elasticsearch.slowlog.message":"[{index}][{rng.randint(0, 4)}]",'
        f'"elasticsearch.slowlog.search_type":"QUERY_THEN_FETCH","elasticsearch.slowlog.source":{json.dumps(body)},'
        f'"elasticsearch.slowlog.stats":"[]","elasticsearch.slowlog.took":"{took}ms",'
        f'"elasticsearch.slowlog.took_millis":{took},"elasticsearch.slowlog.total_hits":"{hits} hits",'
        f'"elasticsearch.slowlog.total_shards":5 , "ecs.version": "1.2.0","service.name":"ES_ECS",'
        f'"event.dataset":"elasticsearch.index_search_slowlog",'
        f'"process.thread.name":"elasticsearch[{node}][search][T#3]",'
        f'"log.logger":"index.search.slowlog.query","elasticsearch.cluster.uuid":"k1Y2z3X4w5V6u7T8s9R0qA",'
        f'"elasticsearch.node.id":"nQ3aVt7kS0qzA1b2C3d4Eg","elasticsearch.node.name":"{node}",'
        f'"elasticsearch.cluster.name":"prod-search"}}\n'
    )


def generate(directory: Path, lines: int, *, unique: bool = False, seed: int = 4) -> int:
    """Write ``lines`` slow log lines over four rotated files; return the bytes written."""
    rng = random.Random(seed)
    search, shards_left = _search(rng), 0
    names = [
        "prod-search_index_search_slowlog-2026-11-27-1.json.gz",
        "prod-search_index_search_slowlog-2026-11-28-1.json",
        "prod-search_index_search_slowlog-2026-11-28-2.json",
        "prod-search_index_search_slowlog.json",
    ]
    per_file = lines // len(names)
    written = 0
    for number, name in enumerate(names):
        count = per_file if number < len(names) - 1 else lines - per_file * (len(names) - 1)
        path = directory / name
        with gzip.open(path, "wt", compresslevel=1) if name.endswith(".gz") else path.open("w") as handle:
            chunk: list[str] = []
            for i in range(count):
                if shards_left == 0:
                    search, shards_left = _search(rng), 1 if unique else rng.randint(1, 5)
                shards_left -= 1
                chunk.append(_line(rng, number * 86_400 + i, search))
                if len(chunk) == 10_000:
                    handle.write("".join(chunk))
                    chunk.clear()
            handle.write("".join(chunk))
        written += path.stat().st_size
    return written


def analyse(directory: Path, workers: int | None) -> None:
    """Run in a fresh process: analyse ``directory`` and print one JSON line of figures."""
    # The path a diagnosis takes: planned in a thread, big logs spread over worker processes.
    from diagnoser.sources.elasticsearch.slowlog_reading import read_slowlog_files

    started = time.perf_counter()
    summary = asyncio.run(read_slowlog_files([directory], workers=workers))
    seconds = time.perf_counter() - started
    # Linux reports KiB. Worker processes (if any) are counted by their largest one; the sum of
    # this process and every worker at its peak is the upper bound printed.
    own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    used = workers if workers is not None else min(4, os.cpu_count() or 1)
    peak_mb = own_mb + (worker_mb * used if worker_mb else 0.0)
    top = summary.slowest(5, with_anti_patterns=True)
    print(
        json.dumps(
            {
                "lines": summary.lines,
                "entries": summary.entries,
                "unparsed": summary.unparsed_lines,
                "shapes": len(summary.shapes),
                "files": len(summary.files),
                "seconds": round(seconds, 2),
                "lines_per_second": round(summary.lines / seconds),
                "peak_rss_mb": round(peak_mb, 1),
                "own_rss_mb": round(own_mb, 1),
                "worker_rss_mb": round(worker_mb, 1),
                "top": [
                    {
                        "index": s.index,
                        "anti_patterns": sorted(s.anti_patterns),
                        "count": s.count,
                        "total_s": round(s.total_ms / 1000, 1),
                    }
                    for s in top
                ],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--unique", action="store_true", help="every line a different search body")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: one per CPU, max 4)")
    parser.add_argument("--analyse", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.analyse:
        analyse(args.analyse, args.workers)
        return
    directory = Path(tempfile.mkdtemp(prefix="diagnoser-slowlog-bench-"))
    try:
        started = time.perf_counter()
        size = generate(directory, args.lines, unique=args.unique)
        print(
            f"generated {args.lines:,} lines ({size / 1024**2:,.0f} MB on disk, 1 of 4 files gzipped, "
            f"{'every line a different search' if args.unique else 'each search on 1-5 shards'}) "
            f"in {time.perf_counter() - started:.1f} s"
        )
        command = [sys.executable, __file__, "--analyse", str(directory)]
        if args.workers is not None:
            command += ["--workers", str(args.workers)]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        figures = json.loads(result.stdout)
        print(
            f"analysed {figures['lines']:,} lines in {figures['seconds']:.1f} s "
            f"({figures['lines_per_second']:,} lines/s), peak RSS {figures['peak_rss_mb']:.0f} MB "
            f"(main {figures['own_rss_mb']:.0f} MB, largest worker {figures['worker_rss_mb']:.0f} MB), "
            f"{figures['shapes']:,} shapes, {figures['unparsed']} unparsed"
        )
        for shape in figures["top"]:
            print(
                f"  {shape['index']:<16} {','.join(shape['anti_patterns']):<40} "
                f"{shape['count']:>8,} entries {shape['total_s']:>10,.1f} s"
            )
        goal = figures["seconds"] < 30 and figures["peak_rss_mb"] < 300
        print(f"goal (< 30 s, < 300 MB): {'met' if goal else 'NOT met'}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
