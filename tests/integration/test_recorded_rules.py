"""``diagnose now --use-recorded`` on a real Prometheus whose ruler wrote the pack's recordings.

The checkout incident is backfilled, the exported group is evaluated over its history by
``promtool tsdb create-blocks-from rules`` (what a ruler running through the incident would have
written), and the server restarted with those blocks. The same instants are then diagnosed with and
without ``--use-recorded``, through a proxy that sees every query: the same findings with the same
numbers, fewer raw queries, and the recorded series read in their place.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnoser.config import Settings
from diagnoser.engine import RulePack, load_ruleset
from diagnoser.ruleset.lint import LintInputs
from diagnoser.ruleset.recording import recorded_conditions, recording_group
from diagnoser.testing.prometheus import LocalPrometheus
from diagnoser.testing.rules import backfill_text
from tests.conftest import INCIDENT, IncidentPrometheus, run_cli_here, shared_bed
from tests.fixtures.background_http import BackgroundHTTPServer
from tests.fixtures.prometheus_proxy import PrometheusProxy, _Handler

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

#: The ruler's interval: the incident's scrape interval, so every diagnosed instant is on its grid.
INTERVAL_S = 30


class CountingProxy(PrometheusProxy):
    """The pass-through proxy, keeping the text of every instant query it relays."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.queries: list[str] = []

    def __enter__(self) -> CountingProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

            def _relay(self, body: bytes | None) -> None:
                url = urllib.parse.urlsplit(self.path)
                if url.path.endswith("/api/v1/query"):
                    form = urllib.parse.parse_qs(url.query)
                    form.update(urllib.parse.parse_qs((body or b"").decode()))
                    proxy.queries.extend(form.get("query", []))
                super()._relay(body)

        self._http = BackgroundHTTPServer(Handler, name="counting-proxy").start()
        return self


@dataclass(frozen=True)
class RecordedBed:
    url: str
    start_s: float
    rules: int


@pytest.fixture(scope="module")
def recorded_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedBed]:
    workdir = tmp_path_factory.mktemp("recorded")
    text, starts = backfill_text(INCIDENT)
    start = int(starts[0])
    settings = Settings()
    inputs = LintInputs.from_settings(settings)
    recorded = recorded_conditions(
        load_ruleset(RulePack.from_settings(settings)), inputs.variables, inputs.catalogue
    )
    group = yaml.safe_dump(recording_group(recorded), sort_keys=False, width=1 << 16)
    with _recorded_server(workdir, text, start + 300, start + 40 * 60, lambda _: group) as url:
        yield RecordedBed(url, float(start), len(recorded))


@contextlib.contextmanager
def _recorded_server(
    workdir: Path, text: str, start: int, end: int, group: Callable[[str], str]
) -> Iterator[str]:
    """A Prometheus holding ``text`` and what a ruler evaluating ``group(url of a server holding
    text)`` from ``start`` to ``end`` would have written (``promtool tsdb create-blocks-from rules``)."""
    rules_file = workdir / "recording.yaml"
    blocks = workdir / "recorded-blocks"
    first = LocalPrometheus(openmetrics=text, workdir=workdir)
    with first:
        assert first.promtool_bin is not None
        rules_file.write_text(group(first.url))
        written = subprocess.run(
            [
                first.promtool_bin, "tsdb", "create-blocks-from", "rules",
                f"--start={start}", f"--end={end}", f"--url={first.url}",
                f"--eval-interval={INTERVAL_S}s", f"--output-dir={blocks}", str(rules_file),
            ],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert written.returncode == 0, written.stdout + written.stderr
        major = first.major
    for block in blocks.iterdir():
        if block.is_dir():
            shutil.move(str(block), workdir / "data" / block.name)
    with LocalPrometheus(workdir=workdir, major=major) as second:
        yield second.url


def _diagnose(url: str, at_s: float, *flags: str) -> tuple[dict[str, Any], list[str]]:
    from datetime import UTC, datetime

    at = datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with CountingProxy(url) as proxy:
        result = run_cli_here("now", "--prometheus-url", proxy.url, "--at", at, "--format", "json", *flags)
        assert result.code in (0, 1), result.stderr
        return json.loads(result.stdout), list(proxy.queries)


def _findings(diagnosis: dict[str, Any]) -> list[tuple[str, str, list[float]]]:
    return [
        (f["rule_id"], json.dumps(f["labels"], sort_keys=True), [e["value"] for e in f["evidence"]])
        for f in diagnosis["findings"]
    ]


@pytest.mark.parametrize("minute", [35, 15])
def test_use_recorded_finds_the_same_reading_the_recordings(recorded_bed: RecordedBed, minute: int) -> None:
    at = recorded_bed.start_s + minute * 60
    raw, raw_queries = _diagnose(recorded_bed.url, at)
    recorded, recorded_queries = _diagnose(recorded_bed.url, at, "--use-recorded")
    assert recorded["errors"] == raw["errors"] == []
    # The same findings for the same subjects, every number within float noise.
    raw_findings, recorded_findings = _findings(raw), _findings(recorded)
    assert [f[:2] for f in recorded_findings] == [f[:2] for f in raw_findings]
    for (_, _, raw_values), (_, _, recorded_values) in zip(raw_findings, recorded_findings, strict=True):
        assert recorded_values == pytest.approx(raw_values, rel=1e-9, abs=1e-12)
    if minute == 35:  # the pool and the p99 are found, and the recordings read for them
        causes = {f["cause"] for f in recorded["findings"]}
        assert {"connection_pool_exhaustion", "latency_slo_breach"} <= causes
        read = {
            e["query"].split("{")[0]
            for f in recorded["findings"]
            for e in f["evidence"]
            if e["query"].startswith("diag:")
        }
        assert {
            "diag:namespace_service_pool:pool_utilisation:ratio",
            "diag:namespace_service:http_server_duration:p99",
        } <= read
    else:
        assert raw["findings"] == []
    # Fewer raw queries reach the server: the recorded conditions' own are read as series instead.
    sent_recorded = [q for q in recorded_queries if "diag:" in q]
    raw_left = [q for q in recorded_queries if "diag:" not in q]
    assert sent_recorded, recorded_queries
    assert len(raw_left) < len(raw_queries)
    assert not any("diag:" in q for q in raw_queries)


def test_without_recordings_every_query_is_sent_raw(incident_prometheus: IncidentPrometheus) -> None:
    at = incident_prometheus.start_s + 35 * 60
    raw, raw_queries = _diagnose(incident_prometheus.url, at)
    recorded, recorded_queries = _diagnose(incident_prometheus.url, at, "--use-recorded")
    assert _findings(recorded) == _findings(raw)
    assert raw["findings"]
    # One look for the heartbeats, which none answers; then the same raw queries.
    [heartbeats] = [q for q in recorded_queries if q.startswith("diag:")]
    assert heartbeats.startswith("diag:recorded:present")
    assert sorted(q for q in recorded_queries if q != heartbeats) == sorted(raw_queries)


#: An in-house server histogram no convention names, recognised by its shape: ``orders`` slow (p99
#: over a second), ``billing`` healthy; 15 s scrapes for 40 minutes.
RECOGNISED_FAMILY = "orders_request_duration_seconds"
_BOUNDS = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf")
_SHARES = {"orders": (0.1, 0.2, 0.4, 0.6, 0.8, 0.95, 1), "billing": (0.5, 0.9, 0.99, 1, 1, 1, 1)}


def _recognised_bed(start: int) -> str:
    out = []
    for job, shares in _SHARES.items():
        for pod in range(2):
            for handler in ("/pay", "/list"):
                key = f'job="{job}",instance="10.0.0.{pod}:8080",handler="{handler}",code="200"'
                for i in range(161):
                    at = start + 15 * i
                    for le, share in zip(_BOUNDS, shares, strict=True):
                        out.append(f'{RECOGNISED_FAMILY}_bucket{{{key},le="{le}"}} {20 * share * i:g} {at}\n')
                    out.append(f"{RECOGNISED_FAMILY}_count{{{key}}} {20 * i} {at}\n")
                    out.append(f"{RECOGNISED_FAMILY}_sum{{{key}}} {20 * i * (0.9 if job == 'orders' else 0.05):g} {at}\n")
    return "".join(out) + "# EOF\n"


def test_a_family_recognised_by_shape_is_recorded_and_read_back(tmp_path: Path) -> None:
    start = 1_795_400_000
    at = start + 35 * 60
    when = str(at)

    def exported(url: str) -> str:
        done = run_cli_here("rules", "export", "--recording", "--prometheus-url", url, "--at", when)
        assert done.code == 0, done.stderr
        return done.stdout

    with _recorded_server(tmp_path, _recognised_bed(start), start + 300, start + 40 * 60, exported) as url:
        group = yaml.safe_load((tmp_path / "recording.yaml").read_text())["groups"][0]["rules"]
        ours = [r for r in group if RECOGNISED_FAMILY in r["expr"]]
        assert {r["record"] for r in ours} >= {"diag:namespace_service:http_server_duration:p99"}, ours
        raw, raw_queries = _diagnose(url, at)
        recorded, queries = _diagnose(url, at, "--use-recorded")
    assert _findings(recorded) == _findings(raw)
    slow = [f for f in recorded["findings"] if f["cause"] == "latency_slo_breach"]
    assert [f["labels"]["service"] for f in slow] == ["orders"], recorded["findings"]
    assert slow[0]["evidence"][0]["query"].startswith("diag:namespace_service:http_server_duration:p99{")
    # The family's every-service p99 is read from its recording, not from its buckets.
    buckets = f"{RECOGNISED_FAMILY}_bucket"
    assert sum(buckets in q for q in queries) < sum(buckets in q for q in raw_queries)
