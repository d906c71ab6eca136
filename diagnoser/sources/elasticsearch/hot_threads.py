"""Parser for the text of ``GET _nodes/hot_threads`` and CPU attribution by thread pool.

The API answers plain text, one block per node, in shapes that changed over the years::

    ::: {node-1}{nQ3a...}{kX9...}{host-1}{10.0.0.1}{10.0.0.1:9300}{cdhilmrstw}{8.11.1}{...}
       Hot threads at 2024-03-01T10:00:00.000Z, interval=500ms, busiestThreads=3, ignoreIdleThreads=true:

       89.3% [cpu=88.1%, other=1.2%] (446.5ms out of 500ms) cpu usage by thread 'elasticsearch[n1][search]...'
         10/10 snapshots sharing following 33 elements
           app/org.apache.lucene.core@9.8.0/org.apache.lucene.search...
         unique snapshot
           ...

Before 8.x the usage line has no ``[cpu=..., other=...]`` part. :func:`parse_hot_threads` reads
all of them and never raises: an unknown line is skipped, so a new server version degrades to
fewer facts rather than a crash. :func:`classify_thread` maps a thread name to the pool group
the runbooks talk about (search, write, merge, refresh, flush, management, gc, generic, other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

__all__ = [
    "POOL_GROUPS",
    "HotThread",
    "HotThreadsNode",
    "PoolShare",
    "StackSample",
    "classify_thread",
    "parse_hot_threads",
    "parse_time_value_ms",
    "pool_shares",
]

POOL_GROUPS: tuple[str, ...] = (
    "search",
    "write",
    "merge",
    "refresh",
    "flush",
    "management",
    "gc",
    "generic",
    "other",
)

_NODE_HEADER = re.compile(r"^\s*:::\s*(?P<rest>.*)$")
_BRACED = re.compile(r"\{([^{}]*)\}")
_ADDRESS = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:.]+\]):\d+$")
_HOT_AT = re.compile(
    r"^\s*Hot threads at (?P<at>[^,]*),\s*interval=(?P<interval>[^,]+),\s*busiestThreads=(?P<busiest>\d+)"
    r"(?:,\s*ignoreIdleThreads=(?P<ignore>\w+))?"
)
_USAGE = re.compile(
    r"^\s*(?P<pct>\d+(?:\.\d+)?)%\s*"
    r"(?:\[cpu=(?P<cpu>\d+(?:\.\d+)?)%,\s*other=(?P<other>\d+(?:\.\d+)?)%\]\s*)?"
    r"\((?P<used>[^\s()]+)\s+out of\s+(?P<total>[^\s()]+)\)\s+"
    r"(?P<kind>\w+) usage by thread '(?P<name>.*)'\s*$"
)
_SHARING = re.compile(
    r"^\s*(?P<count>\d+)/(?P<total>\d+) snapshots sharing following (?P<elements>\d+) elements"
)
_UNIQUE = re.compile(r"^\s*unique snapshot\s*$")
_TIME_VALUE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>nanos|micros|ms|s|m|h|d)$")
_TIME_UNIT_MS = {"nanos": 1e-6, "micros": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6, "d": 8.64e7}

# Thread name ``elasticsearch[<node>][<pool>][T#n]``;
# merge threads nest ``[[index][shard]: Lucene Merge Thread #n]``.
_ES_THREAD = re.compile(r"^elasticsearch\[(?P<node>[^\]]*)\]\[(?P<pool>[^\[\]]+)\]")
_POOL_TO_GROUP = {
    "search": "search",
    "search_worker": "search",
    "search_throttled": "search",
    "search_coordination": "search",
    "write": "write",
    "bulk": "write",
    "index": "write",
    "system_write": "write",
    "system_critical_write": "write",
    "force_merge": "merge",
    "refresh": "refresh",
    "flush": "flush",
    "management": "management",
    "generic": "generic",
}
# JVM-internal collector threads; the JDK names them, Elasticsearch does not.
_GC_NAME = re.compile(
    r"(GC Thread|^G1 |^VM Thread|Concurrent Mark|Gang worker|Parallel GC|ZGC|Shenandoah)", re.I
)

#: Stack frames kept per snapshot: enough to recognise the hot method, bounded on huge dumps.
MAX_FRAMES = 40


def parse_time_value_ms(text: str) -> float | None:
    """``446.5ms`` -> 446.5, ``1s`` -> 1000.0; ``None`` for anything else."""
    match = _TIME_VALUE.match(text.strip())
    if match is None:
        return None
    return float(match.group("num")) * _TIME_UNIT_MS[match.group("unit")]


def classify_thread(name: str) -> tuple[str, str]:
    """Return ``(group, pool)`` for a thread name: the pool group and the raw pool token.

    >>> classify_thread("elasticsearch[node-1][search][T#3]")
    ('search', 'search')
    >>> classify_thread("elasticsearch[node-1][[logs][0]: Lucene Merge Thread #12]")
    ('merge', 'lucene_merge')
    """
    if "Lucene Merge Thread" in name:
        return "merge", "lucene_merge"
    match = _ES_THREAD.match(name)
    if match is not None:
        pool = match.group("pool")
        return _POOL_TO_GROUP.get(pool, "other"), pool
    if _GC_NAME.search(name):
        return "gc", "jvm_gc"
    return "other", ""


@dataclass(frozen=True)
class StackSample:
    """One stack block: ``count`` of ``total`` snapshots shared these frames (1/1 for ``unique``)."""

    count: int
    total: int
    frames: tuple[str, ...]


@dataclass(frozen=True)
class HotThread:
    """One busy thread: its share of the interval, name, pool group and sampled stacks."""

    percent: float
    cpu_percent: float | None
    other_percent: float | None
    used_ms: float | None
    interval_ms: float | None
    usage_kind: str
    name: str
    group: str
    pool: str
    stacks: tuple[StackSample, ...] = ()

    @property
    def top_frame(self) -> str:
        """The innermost frame of the most frequent stack, for evidence."""
        if not self.stacks:
            return ""
        best = max(self.stacks, key=lambda s: s.count)
        return best.frames[0] if best.frames else ""


@dataclass
class HotThreadsNode:
    """The hot threads of one node."""

    name: str
    node_id: str = ""
    host: str = ""
    address: str = ""
    sampled_at: str = ""
    interval_ms: float | None = None
    busiest_threads: int | None = None
    ignore_idle_threads: bool | None = None
    threads: list[HotThread] = field(default_factory=list)


@dataclass(frozen=True)
class PoolShare:
    """How much of a node's hot-thread CPU one pool group took."""

    node: str
    group: str
    percent: float
    share: float
    threads: int
    busiest_thread: str
    top_frame: str


def _node_from_header(rest: str) -> HotThreadsNode:
    parts = _BRACED.findall(rest)
    if not parts:
        return HotThreadsNode(name=rest.strip()[:200] or "unknown")
    name = parts[0].strip() or "unknown"
    node_id = parts[1].strip() if len(parts) > 1 else ""
    address = next((p for p in parts[2:] if _ADDRESS.match(p.strip())), "")
    # DiscoveryNode prints {name}{id}{ephemeralId}{hostName}{hostAddress}{transportAddress}{roles}...
    host = ""
    if address:
        idx = parts.index(address)
        if idx >= 2:
            host = parts[idx - 2].strip()
    return HotThreadsNode(name=name, node_id=node_id, host=host, address=address.strip())


def _thread_from_match(match: re.Match[str]) -> HotThread:
    name = match.group("name")
    group, pool = classify_thread(name)
    cpu, other = match.group("cpu"), match.group("other")
    return HotThread(
        percent=float(match.group("pct")),
        cpu_percent=float(cpu) if cpu is not None else None,
        other_percent=float(other) if other is not None else None,
        used_ms=parse_time_value_ms(match.group("used")),
        interval_ms=parse_time_value_ms(match.group("total")),
        usage_kind=match.group("kind"),
        name=name,
        group=group,
        pool=pool,
    )


def parse_hot_threads(text: str) -> list[HotThreadsNode]:
    """Parse the hot threads text of any number of nodes. Never raises; unknown lines are skipped.

    A block of threads without a ``:::`` header (output of a single node trimmed by a proxy) is
    attributed to a node named ``unknown``.
    """
    reader = _HotThreadsReader()
    for line in text.splitlines():
        reader.read(line)
    reader.close_thread()
    return reader.nodes


class _HotThreadsReader:
    """The state of one pass over the text: the node, thread and stack block being read."""

    def __init__(self) -> None:
        self.nodes: list[HotThreadsNode] = []
        self.node: HotThreadsNode | None = None
        self.thread: HotThread | None = None
        self.stacks: list[StackSample] = []
        self.frames: list[str] = []
        self.block: tuple[int, int] | None = None

    def read(self, line: str) -> None:
        header = _NODE_HEADER.match(line)
        if header is not None:
            self.close_thread()
            self.node = _node_from_header(header.group("rest"))
            self.nodes.append(self.node)
            return
        hot_at = _HOT_AT.match(line)
        if hot_at is not None:
            _read_sampling(self.current_node(), hot_at)
            return
        usage = _USAGE.match(line)
        if usage is not None:
            self.close_thread()
            self.current_node()
            self.thread = _thread_from_match(usage)
            return
        if self.thread is not None:
            self.read_stack_line(line)

    def read_stack_line(self, line: str) -> None:
        sharing = _SHARING.match(line)
        if sharing is not None:
            self.close_block()
            self.block = (int(sharing.group("count")), int(sharing.group("total")))
            return
        if _UNIQUE.match(line):
            self.close_block()
            self.block = (1, 1)
            return
        frame = line.strip()
        if self.block is not None and frame and len(self.frames) < MAX_FRAMES:
            self.frames.append(frame)

    def current_node(self) -> HotThreadsNode:
        if self.node is None:
            self.node = HotThreadsNode(name="unknown")
            self.nodes.append(self.node)
        return self.node

    def close_block(self) -> None:
        if self.block is not None:
            count, total = self.block
            self.stacks.append(StackSample(count=count, total=total, frames=tuple(self.frames)))
        self.block, self.frames = None, []

    def close_thread(self) -> None:
        self.close_block()
        if self.thread is not None and self.node is not None:
            self.node.threads.append(replace(self.thread, stacks=tuple(self.stacks)))
        self.thread, self.stacks = None, []


def _read_sampling(node: HotThreadsNode, hot_at: re.Match[str]) -> None:
    """The ``Hot threads at ..., interval=..., busiestThreads=...`` line of a node."""
    node.sampled_at = hot_at.group("at").strip()
    node.interval_ms = parse_time_value_ms(hot_at.group("interval"))
    node.busiest_threads = int(hot_at.group("busiest"))
    ignore = hot_at.group("ignore")
    node.ignore_idle_threads = None if ignore is None else ignore.lower() == "true"


def pool_shares(nodes: list[HotThreadsNode], *, usage_kind: str = "cpu") -> list[PoolShare]:
    """Per node and pool group: the summed thread percent and its share of the node's hot CPU.

    The share is relative to the busy threads the API listed (``busiestThreads``), so a node whose
    three hottest threads are merges shows merge at 100 %; callers pair the share with the
    absolute ``percent`` (100 = one full core) to ignore idle nodes.
    """
    shares: list[PoolShare] = []
    for node in nodes:
        threads = [t for t in node.threads if t.usage_kind == usage_kind]
        total = sum(t.percent for t in threads)
        if total <= 0:
            continue
        by_group: dict[str, list[HotThread]] = {}
        for thread in threads:
            by_group.setdefault(thread.group, []).append(thread)
        for group, members in by_group.items():
            percent = sum(t.percent for t in members)
            busiest = max(members, key=lambda t: t.percent)
            shares.append(
                PoolShare(
                    node=node.name,
                    group=group,
                    percent=percent,
                    share=percent / total,
                    threads=len(members),
                    busiest_thread=busiest.name,
                    top_frame=busiest.top_frame,
                )
            )
    shares.sort(key=lambda s: (-s.share, s.node, s.group))
    return shares
