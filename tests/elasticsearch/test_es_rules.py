"""The Elasticsearch rules evaluated by the engine: each cause on its fixture, silence when healthy.

Also the acceptance path end to end: ``diagnose now --elasticsearch-url URL --slowlog PATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from diagnoser.config import ElasticsearchSettings, Settings
from diagnoser.engine import DiagnosisConfig, diagnose
from diagnoser.models import Diagnosis
from diagnoser.ruleset import Rule, load_rules
from diagnoser.sources import Sources
from diagnoser.sources.elasticsearch import ElasticsearchSource
from tests.fixtures.es_server import EsFixtureServer, closed_port_url

ServeFactory = Callable[..., EsFixtureServer]
SourceFactory = Callable[..., ElasticsearchSource]

ROOT = Path(__file__).resolve().parents[2]
AT = datetime(2026, 11, 29, 21, 0, tzinfo=UTC)
RULE_IDS = (
    "elasticsearch/es-expensive-query",
    "elasticsearch/es-hot-threads",
    "elasticsearch/es-heap-pressure-api",
    "elasticsearch/es-thread-pool-rejection-api",
    "elasticsearch/es-shard-sizing",
    "elasticsearch/es-fielddata-text",
)
# Short samples keep the suite fast; the shipped default is 2 s.
FAST = {"sample_s": 0.5}


@pytest.fixture(scope="module")
def rules() -> list[Rule]:
    ruleset = load_rules([ROOT / "rules"], include_builtin=False)
    assert not [p for p in ruleset.problems if "elasticsearch/" in str(p)]
    return [ruleset.rules[rule_id] for rule_id in RULE_IDS]


def _settings(url: str | None, slowlog: Path | None = None, slowlog_index: str | None = None) -> Settings:
    return Settings(
        elasticsearch=ElasticsearchSettings(
            urls=[url] if url else [],
            slowlog_paths=[slowlog] if slowlog else [],
            slowlog_index=slowlog_index,
            timeout_s=2,
        ),
        rule_params={
            "elasticsearch/es-heap-pressure-api": FAST,
            "elasticsearch/es-thread-pool-rejection-api": FAST,
        },
    )


def _source(source_for: SourceFactory, target: EsFixtureServer | str, settings: Settings) -> ElasticsearchSource:
    """The source the runner builds from ``settings``, pointed at ``target``: slow logs included."""
    es = settings.elasticsearch
    return source_for(target, slowlog_paths=es.slowlog_paths, slowlog_index=es.slowlog_index)


async def _diagnose(rules: list[Rule], settings: Settings, source: ElasticsearchSource | None) -> Diagnosis:
    return await diagnose(rules, DiagnosisConfig.from_settings(settings), Sources(elasticsearch=source), at=AT)


def _by_rule(diagnosis: Diagnosis) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for finding in diagnosis.findings:
        found.setdefault(finding.rule_id, []).append(finding.labels)
    return found


@pytest.mark.parametrize(
    ("scenario", "slowlog", "expected"),
    [
        (
            "hot_threads",
            "healthy",
            {"elasticsearch/es-hot-threads": [("node", "es-node-1"), ("pool", "merge")]},
        ),
        ("heap_pressure", "healthy", {"elasticsearch/es-heap-pressure-api": [("node", "es-node-2")]}),
        (
            "thread_pool_rejection",
            "healthy",
            {"elasticsearch/es-thread-pool-rejection-api": [("node", "es-node-1"), ("pool", "search")]},
        ),
        (
            "shard_sizing",
            "healthy",
            {"elasticsearch/es-shard-sizing": [("index", "events"), ("index", "metrics-tiny")]},
        ),
        (
            "fielddata_text",
            "healthy",
            {
                "elasticsearch/es-fielddata-text": [
                    ("field", "message"),
                    ("node", "es-node-1"),
                    ("node", "es-node-2"),
                ]
            },
        ),
        (
            "expensive_query",
            "prod-search",
            {
                "elasticsearch/es-expensive-query": [
                    ("index", "products"),
                    ("index", "orders-2026.11"),
                    ("index", "logs-app"),
                    ("anti_patterns", "leading_wildcard"),
                    ("anti_patterns", "deep_pagination"),
                    ("anti_patterns", "script"),
                    ("anti_patterns", "regexp,track_total_hits"),
                ]
            },
        ),
    ],
)
async def test_each_cause_on_its_fixture(
    rules: list[Rule],
    serve: ServeFactory,
    source_for: SourceFactory,
    es_fixtures: Path,
    scenario: str,
    slowlog: str,
    expected: dict[str, list[tuple[str, str]]],
) -> None:
    server = serve(scenario)
    settings = _settings(
        server.url,
        es_fixtures / "slowlog" / f"{slowlog}_index_search_slowlog.json",
        slowlog_index="slowlogs-*",
    )
    diagnosis = await _diagnose(rules, settings, _source(source_for, server, settings))
    assert diagnosis.errors == []
    found = _by_rule(diagnosis)
    assert set(found) == set(expected)
    for rule_id, pairs in expected.items():
        for key, value in pairs:
            assert any(labels.get(key) == value for labels in found[rule_id]), (rule_id, key, value, found)
    for finding in diagnosis.findings:
        # Every template field was filled: no "?" holes in what the on-call engineer reads.
        assert "?" not in finding.title
        assert " ?" not in finding.summary
        assert finding.evidence
        assert finding.evidence[0].value is not None
        assert finding.runbook_url.endswith(f"{finding.rule_id}.md")
        assert (ROOT / "rules" / f"{finding.rule_id}.md").is_file()


async def test_summaries_carry_the_numbers(
    rules: list[Rule], serve: ServeFactory, source_for: SourceFactory
) -> None:
    server = serve("shard_sizing")
    diagnosis = await _diagnose(rules, _settings(server.url), source_for(server))
    summaries = sorted(f.summary for f in diagnosis.findings)
    assert summaries == [
        "events: 1 primary shard(s) averaging 182.0 GiB (bound 50 GiB); recommend 6",
        "metrics-tiny: 30 primary shard(s) averaging 0.3 GiB (bound 10 GiB); recommend 1",
    ]
    recommendation = next(f.recommendation for f in diagnosis.findings if f.labels["index"] == "events")
    assert "Set number_of_shards to 6" in recommendation
    assert "max_primary_shard_size: 50gb" in recommendation


async def test_healthy_cluster_reports_nothing(
    rules: list[Rule], serve: ServeFactory, source_for: SourceFactory, es_fixtures: Path
) -> None:
    server = serve("healthy")
    settings = _settings(
        server.url, es_fixtures / "slowlog" / "healthy_index_search_slowlog.json", slowlog_index="slowlogs-*"
    )
    diagnosis = await _diagnose(rules, settings, _source(source_for, server, settings))
    assert diagnosis.findings == []
    assert diagnosis.errors == []
    assert diagnosis.exit_code == 0


@pytest.mark.parametrize("failure", ["refused", "401", "403", "503"])
async def test_unreachable_or_unauthorized_cluster_is_an_error_and_the_slowlog_still_reports(
    rules: list[Rule],
    serve: ServeFactory,
    source_for: SourceFactory,
    es_fixtures: Path,
    failure: str,
) -> None:
    url = closed_port_url() if failure == "refused" else serve("hot_threads", failure).url
    settings = _settings(url, es_fixtures / "slowlog" / "prod-search_index_search_slowlog.json")
    diagnosis = await _diagnose(rules, settings, _source(source_for, url, settings))
    assert diagnosis.errors
    assert {e.source for e in diagnosis.errors} == {"elasticsearch"}
    marker = "cannot connect" if failure == "refused" else f"HTTP {failure}"
    assert any(marker in e.message for e in diagnosis.errors)
    # The slow log files are another source of evidence: their findings still appear.
    causes = {f.cause for f in diagnosis.findings}
    assert "es_expensive_query" in causes
    assert "es_hot_threads" not in causes


async def test_slowlog_only_mode_skips_api_rules(rules: list[Rule], es_fixtures: Path) -> None:
    settings = _settings(None, es_fixtures / "slowlog" / "prod-search_index_search_slowlog.json")
    source = ElasticsearchSource.from_settings(settings.elasticsearch)
    diagnosis = await _diagnose(rules, settings, source)
    assert diagnosis.errors == []
    assert {f.rule_id for f in diagnosis.findings} == {"elasticsearch/es-expensive-query"}


@pytest.mark.parametrize(
    ("scenario", "slowlog", "causes"),
    [
        ("hot_threads", "prod-search", {"es_hot_threads", "es_expensive_query"}),
        ("healthy", "healthy", set()),
    ],
)
def test_cli_diagnose_now(
    serve: ServeFactory, es_fixtures: Path, scenario: str, slowlog: str, causes: set[str]
) -> None:
    server = serve(scenario)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    completed = subprocess.run(
        [
            str(Path(sys.executable).parent / "diagnose"),
            "now",
            "--elasticsearch-url",
            server.url,
            "--slowlog",
            str(es_fixtures / "slowlog" / f"{slowlog}_index_search_slowlog.json"),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        check=False,
    )
    report: dict[str, Any] = json.loads(completed.stdout)
    es_causes = {f["cause"] for f in report["findings"] if f["rule_id"].startswith("elasticsearch/")}
    assert es_causes == causes, completed.stderr
    assert report["errors"] == []
    assert completed.returncode == (1 if causes else 0)


@pytest.mark.parametrize(
    ("scenario", "summary"),
    [
        ("hot_threads", "es-node-1: merge threads use 94% of the hot-thread CPU (threshold 50%)"),
        ("fielddata_text", "es-node-1: 1,650 MiB of fielddata on text field 'message' (orders-2026.11)"),
        ("thread_pool_rejection", "es-node-1: search pool rejected"),
        ("heap_pressure", "es-node-2: heap 93% used (threshold 85%), old-gen GC"),
    ],
)
async def test_summary_wording(
    rules: list[Rule], serve: ServeFactory, source_for: SourceFactory, scenario: str, summary: str
) -> None:
    server = serve(scenario)
    diagnosis = await _diagnose(rules, _settings(server.url), source_for(server))
    assert any(f.summary.startswith(summary) for f in diagnosis.findings), [
        f.summary for f in diagnosis.findings
    ]
