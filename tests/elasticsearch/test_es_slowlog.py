"""Slow log reading (every format, files, rotation, gzip), query anti-patterns and shape grouping."""

from __future__ import annotations

import gzip
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from diagnoser.sources.elasticsearch import slowlog_summary
from diagnoser.sources.elasticsearch.slowlog_entries import parse_slowlog_line, parse_slowlog_record
from diagnoser.sources.elasticsearch.slowlog_files import summarise_slowlog_files, summarise_slowlog_records
from diagnoser.sources.elasticsearch.slowlog_queries import ANTI_PATTERNS, analyse_source


def _slowlogs(es_fixtures: Path) -> Path:
    return es_fixtures / "slowlog"


def test_es8_ecs_search_line(es_fixtures: Path) -> None:
    line = (_slowlogs(es_fixtures) / "prod-search_index_search_slowlog.json").read_text().splitlines()[0]
    entry = parse_slowlog_line(line)
    assert entry is not None
    record = json.loads(line)
    assert entry.kind == "search"
    assert entry.phase == "query"
    assert f"[{entry.index}][{entry.shard}]" == record["elasticsearch.slowlog.message"]
    assert entry.took_ms == record["elasticsearch.slowlog.took_millis"]
    assert entry.total_hits == int(record["elasticsearch.slowlog.total_hits"].split()[0])
    assert entry.node == record["elasticsearch.node.name"]
    assert entry.timestamp == record["@timestamp"]
    # The layout escapes the body twice; the analysis still reads it as JSON.
    assert '\\"' in entry.source
    assert analyse_source(entry.source).parsed


def test_es8_indexing_line(es_fixtures: Path) -> None:
    line = (_slowlogs(es_fixtures) / "prod-search_index_indexing_slowlog.json").read_text().splitlines()[0]
    entry = parse_slowlog_line(line)
    assert entry is not None
    assert (entry.kind, entry.index, entry.shard, entry.phase) == (
        "indexing",
        "orders-2026.11",
        None,
        "index",
    )
    assert entry.took_ms == float(json.loads(line)["elasticsearch.slowlog.took_millis"])


def test_es7_json_and_plain_text_lines(es_fixtures: Path) -> None:
    es7 = [
        parse_slowlog_line(x)
        for x in (_slowlogs(es_fixtures) / "es7_index_search_slowlog.json").read_text().splitlines()
    ]
    assert [(e.kind, e.index, e.shard, e.took_ms, e.total_hits, e.node) for e in es7 if e] == [
        ("search", "logs-2021.03.02", 0, 1804.0, 25400, "es7-data-a"),
        ("search", "logs-2021.03.02", 0, 1502.0, 25400, "es7-data-a"),
    ]
    plain = [
        parse_slowlog_line(x)
        for x in (_slowlogs(es_fixtures) / "plain_index_search_slowlog.log").read_text().splitlines()
    ]
    assert [(e.kind, e.phase, e.index, e.shard, e.took_ms, e.total_hits, e.node) for e in plain if e] == [
        ("search", "query", "logs", 2, 1104.0, 9540, "node-a"),
        ("search", "fetch", "logs", 0, 802.0, 12, "node-a"),
    ]
    assert plain[0] is not None
    assert analyse_source(plain[0].source).anti_patterns == {"leading_wildcard", "unfiltered_source"}


def test_shipper_document_nested_fields(es_fixtures: Path) -> None:
    docs = json.loads((_slowlogs(es_fixtures) / "index_slowlog_docs.json").read_text())
    entry = parse_slowlog_record(docs[-1])
    assert entry is not None
    assert (entry.kind, entry.index, entry.node) == ("search", "logs-app", "es-node-2")
    assert entry.took_ms == 2500 + 2 * 300  # from "took": "<n>ms", the shipper dropped took_millis
    assert entry.total_hits == 250000


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "not json",
        "{broken",
        "[1, 2]",
        '{"message": "hello"}',
        '{"type": "server", "message": "[x][0]"}',
        "null",
    ],
)
def test_lines_that_are_not_slow_log_entries(line: str) -> None:
    assert parse_slowlog_line(line) is None


def _flags(body: dict[str, object], total_hits: int | None = None) -> set[str]:
    return set(analyse_source(json.dumps(body), total_hits=total_hits).anti_patterns)


_FILTERED = {"_source": {"includes": ["id"]}}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"from": 9990, "size": 20, **_FILTERED}, {"deep_pagination"}),
        ({"from": 9990, "size": 10, **_FILTERED}, set()),
        ({"from": 10001, **_FILTERED}, {"deep_pagination"}),
        ({"query": {"wildcard": {"host": {"value": "*-prod"}}}, **_FILTERED}, {"leading_wildcard"}),
        ({"query": {"wildcard": {"host": "?eb"}}, **_FILTERED}, {"leading_wildcard"}),
        ({"query": {"wildcard": {"host": {"value": "web-*"}}}, **_FILTERED}, set()),
        ({"query": {"query_string": {"query": "title:*phone AND x"}}, **_FILTERED}, {"leading_wildcard"}),
        (
            {"query": {"query_string": {"query": "*phone", "allow_leading_wildcard": False}}, **_FILTERED},
            set(),
        ),
        ({"query": {"query_string": {"query": "host:/web-[0-9]+/"}}, **_FILTERED}, {"regexp"}),
        ({"query": {"regexp": {"host": {"value": "web.*"}}}, **_FILTERED}, {"regexp"}),
        (
            {"query": {"bool": {"filter": [{"script": {"script": "doc['a'].value > 1"}}]}}, **_FILTERED},
            {"script"},
        ),
        (
            {"query": {"script_score": {"query": {"match_all": {}}, "script": {"source": "1"}}}, **_FILTERED},
            {"script"},
        ),
        (
            {"query": {"function_score": {"functions": [{"script_score": {"script": "1"}}]}}, **_FILTERED},
            {"script"},
        ),
        ({"sort": [{"_script": {"type": "number", "script": "1"}}], **_FILTERED}, {"script"}),
        ({"script_fields": {"x": {"script": "1"}}, **_FILTERED}, {"script"}),
        ({"query": {"term": {"status": "paid"}}, **_FILTERED}, {"scoring_query_context"}),
        (
            {"query": {"bool": {"must": [{"range": {"price": {"lte": 5}}}]}}, **_FILTERED},
            {"scoring_query_context"},
        ),
        ({"query": {"bool": {"filter": [{"term": {"status": "paid"}}]}}, **_FILTERED}, set()),
        ({"query": {"constant_score": {"filter": {"term": {"status": "paid"}}}}, **_FILTERED}, set()),
        ({"query": {"bool": {"must_not": [{"term": {"status": "paid"}}]}}, **_FILTERED}, set()),
        ({"query": {"match": {"title": "red shoes"}}, **_FILTERED}, set()),
        ({"track_total_hits": True, **_FILTERED}, {"track_total_hits"}),
        ({"track_total_hits": 10000, **_FILTERED}, set()),
        ({"query": {"match_all": {}}}, {"unfiltered_source"}),
        ({"query": {"match_all": {}}, "_source": False}, set()),
        ({"query": {"match_all": {}}, "size": 0}, set()),
        ({"highlight": {"fields": {"title": {}}}, **_FILTERED}, {"highlight"}),
    ],
)
def test_anti_patterns(body: dict[str, object], expected: set[str]) -> None:
    assert _flags(body) == expected


def test_track_total_hits_only_matters_on_large_results() -> None:
    body = {"track_total_hits": True, **_FILTERED}
    assert _flags(body, total_hits=120) == set()
    assert _flags(body, total_hits=250_000) == {"track_total_hits"}


def test_every_anti_pattern_is_documented() -> None:
    assert set(ANTI_PATTERNS) == {
        "deep_pagination",
        "leading_wildcard",
        "regexp",
        "script",
        "scoring_query_context",
        "track_total_hits",
        "unfiltered_source",
        "highlight",
    }


def test_shape_replaces_literals_and_keeps_structure() -> None:
    # Elasticsearch writes a search source in a fixed key order, so the text is the structure.
    a = analyse_source(json.dumps({"from": 15000, "query": {"term": {"status": "shipped"}}, "size": 100}))
    b = analyse_source(json.dumps({"from": 30000, "query": {"term": {"status": 'pen\\"ding, x'}}, "size": 2}))
    c = analyse_source(json.dumps({"from": 30000, "query": {"term": {"region": "eu"}}, "size": 20}))
    assert a.shape == b.shape == '{"from":"?","query":{"term":{"status":"?"}},"size":"?"}'
    assert c.shape != a.shape  # a different field is a different query
    terms = analyse_source(json.dumps({"query": {"terms": {"id": [1, 2, 3], "tag": ["a", "b"]}}}))
    assert terms.shape == '{"query":{"terms":{"id":["?"],"tag":["?"]}}}'
    scalars = analyse_source('{"a":true,"b":null,"c":-1.5e3,"d":[false],"e":{"f":"1:2,3"}}')
    assert scalars.shape == '{"a":"?","b":"?","c":"?","d":["?"],"e":{"f":"?"}}'


def test_unparseable_or_deep_bodies_do_not_raise() -> None:
    assert analyse_source("{not json").shape == "(unparsed)"
    assert analyse_source("").parsed is False
    deep = '{"query":' * 5000 + "1" + "}" * 5000
    assert analyse_source(deep).parsed is False


def test_summary_of_the_prod_log_groups_shapes(es_fixtures: Path) -> None:
    summary = summarise_slowlog_files([_slowlogs(es_fixtures) / "prod-search_index_search_slowlog.json"])
    lines = (_slowlogs(es_fixtures) / "prod-search_index_search_slowlog.json").read_text().splitlines()
    assert summary.lines == summary.entries == len(lines)
    flagged = summary.slowest(10, with_anti_patterns=True)
    assert [(s.index, sorted(s.anti_patterns), s.count) for s in flagged] == [
        ("products", ["leading_wildcard"], 6),
        ("orders-2026.11", ["deep_pagination"], 4),
        ("products", ["script"], 3),
    ]
    expected_total = sum(
        json.loads(x)["elasticsearch.slowlog.took_millis"] for x in lines if "query_string" in x
    )
    assert flagged[0].total_ms == expected_total
    assert flagged[0].nodes == {"es-node-1"}
    assert flagged[0].first_seen <= flagged[0].last_seen
    # Clean shapes are still counted, just not flagged.
    assert len(summary.slowest(10)) == 5


def test_directory_with_rotated_and_gzipped_files(tmp_path: Path, es_fixtures: Path) -> None:
    source = _slowlogs(es_fixtures) / "prod-search_index_search_slowlog.json"
    lines = source.read_text().splitlines(keepends=True)
    shutil.copy(source, tmp_path / "prod-search_index_search_slowlog.json")
    with gzip.open(tmp_path / "prod-search_index_search_slowlog-2026-11-28-1.json.gz", "wt") as handle:
        handle.writelines(lines[:5])
    # A rotated file gzipped without the .gz suffix still reads: the magic bytes decide.
    with gzip.open(tmp_path / "prod-search_index_search_slowlog-2026-11-27-1.json", "wt") as handle:
        handle.writelines(lines[:3])
    (tmp_path / "gc.log").write_text("not a slow log\n")  # ignored: not a slow log file name
    summary = summarise_slowlog_files([tmp_path])
    assert len(summary.files) == 3
    assert summary.entries == len(lines) + 5 + 3
    assert summary.unparsed_lines == 0


def test_time_window(es_fixtures: Path) -> None:
    path = _slowlogs(es_fixtures) / "prod-search_index_search_slowlog.json"
    stamps = sorted(json.loads(x)["@timestamp"] for x in path.read_text().splitlines())
    middle = datetime.fromisoformat(stamps[len(stamps) // 2].replace("Z", "+00:00"))
    summary = summarise_slowlog_files([path], since=middle, until=datetime(2030, 1, 1, tzinfo=UTC))
    assert summary.entries == sum(1 for s in stamps if s[:19] >= middle.strftime("%Y-%m-%dT%H:%M:%S"))
    assert summary.outside_window == len(stamps) - summary.entries
    assert 0 < summary.entries < len(stamps)


def test_garbage_lines_are_counted_not_fatal(tmp_path: Path, es_fixtures: Path) -> None:
    good = (_slowlogs(es_fixtures) / "healthy_index_search_slowlog.json").read_text()
    path = tmp_path / "x_index_search_slowlog.json"
    path.write_bytes(good.encode() + b'\xff\xfe garbage\n{"half": \n\n')
    summary = summarise_slowlog_files([path])
    assert summary.entries == len(good.splitlines())
    assert summary.unparsed_lines == 3


def test_missing_path_gives_an_empty_summary(tmp_path: Path) -> None:
    summary = summarise_slowlog_files([tmp_path / "does-not-exist"])
    assert (summary.files, summary.entries, summary.errors) == ([], 0, [])


def test_truncated_gzip_keeps_what_was_read(tmp_path: Path, es_fixtures: Path) -> None:
    lines = (_slowlogs(es_fixtures) / "prod-search_index_search_slowlog.json").read_bytes()
    whole = gzip.compress(lines)
    (tmp_path / "a_index_search_slowlog-1.json.gz").write_bytes(whole[: len(whole) - 40])
    with pytest.raises(OSError, match=r"a_index_search_slowlog-1\.json\.gz"):
        summarise_slowlog_files([tmp_path])
    (tmp_path / "b_index_search_slowlog.json").write_bytes(lines)
    summary = summarise_slowlog_files([tmp_path])
    assert summary.files == [str(tmp_path / "b_index_search_slowlog.json")]
    assert len(summary.errors) == 1
    # Lines decompressed before the cut are counted too.
    assert summary.entries > len(lines.splitlines())


def test_shape_count_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slowlog_summary, "MAX_SHAPES", 3)
    records = [
        {
            "type": "index_search_slowlog",
            "message": "[i][0]",
            "took_millis": "5",
            "source": json.dumps({"query": {"term": {f"field{n}": "x"}}}),
        }
        for n in range(10)
    ]
    summary = summarise_slowlog_records(records)
    assert len(summary.shapes) == 3
    assert summary.overflow_entries == 7
    assert summary.entries == 10
