"""Property test: the hot threads parser never raises, whatever text it is given.

Three kinds of input: arbitrary Unicode, lines assembled from the grammar's own fragments
(headers, usage lines, stack blocks) with random values, and real samples with random text spliced
in. 2,000 examples in the suite; ``FUZZ_EXAMPLES=100000 pytest tests/elasticsearch`` searches longer.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnoser.sources.elasticsearch.hot_threads import HotThreadsNode, parse_hot_threads, pool_shares

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "2000"))
_SAMPLES = [
    p.read_text(encoding="utf-8")
    for p in sorted((Path(__file__).resolve().parents[1] / "fixtures" / "es" / "hot_threads").glob("*.txt"))
]
_number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.integers(-(10**20), 10**20).map(str),
    st.text("0123456789.-e%", max_size=8),
)
_fragment = st.one_of(
    st.builds(
        lambda a, b, c: f"::: {{{a}}}{{{b}}}{{{c}}}",
        st.text(max_size=12),
        st.text(max_size=12),
        st.text(max_size=30),
    ),
    st.builds(
        lambda at, iv, n: (
            f"   Hot threads at {at}, interval={iv}, busiestThreads={n}, ignoreIdleThreads=true:"
        ),
        st.text(max_size=20),
        st.text(max_size=8),
        st.integers(-5, 10**30),
    ),
    st.builds(
        lambda p, c, o, u, t, k, name: (
            f"   {p}% [cpu={c}%, other={o}%] ({u} out of {t}) {k} usage by thread '{name}'"
        ),
        _number,
        _number,
        _number,
        st.text(max_size=10),
        st.text(max_size=10),
        st.sampled_from(["cpu", "wait", "block", "x"]),
        st.text(max_size=60),
    ),
    st.builds(
        lambda p, u, name: f"{p}% ({u}ms out of 500ms) cpu usage by thread '{name}'",
        _number,
        _number,
        st.text(max_size=40),
    ),
    st.builds(
        lambda a, b, c: f"     {a}/{b} snapshots sharing following {c} elements",
        st.integers(-3, 10**25),
        st.integers(-3, 10**25),
        st.integers(0, 99),
    ),
    st.just("     unique snapshot"),
    st.text(max_size=80),
    st.just(""),
)
_assembled = st.lists(_fragment, max_size=12).map("\n".join)
_spliced = st.builds(
    lambda sample, at, junk: sample[: at % (len(sample) + 1)] + junk + sample[at % (len(sample) + 1) :],
    st.sampled_from(_SAMPLES),
    st.integers(0, 10**6),
    st.text(max_size=60),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.one_of(st.text(max_size=300), _assembled, _spliced))
def test_parser_never_raises(text: str) -> None:
    nodes = parse_hot_threads(text)
    assert isinstance(nodes, list)
    assert all(isinstance(n, HotThreadsNode) for n in nodes)
    for share in pool_shares(nodes):
        assert share.group
        # Shares are fractions of the node's listed CPU (NaN/inf percents come from garbage numbers).
        assert share.share >= 0 or share.share != share.share
