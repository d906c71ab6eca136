"""``diagnose rules export --recording``: the group promtool accepts, and a promtool case per recorded
condition whose expected value is worked out here from the input series, not read off the output.

Each case feeds one convention's series (a pool of 10 with 9 in use, buckets with a known p99...)
and expects the recorded series with the labels the raw query's answers carry plus the recording's
own. Both promtools run when installed: Debian's 2.42 and the set-up's 3.5.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from diagnoser.config import Settings
from diagnoser.engine import RulePack, load_ruleset
from diagnoser.ruleset.lint import LintInputs
from diagnoser.ruleset.recording import GROUP, Recorded, recorded_conditions, recording_group
from diagnoser.signals import load_catalogue
from diagnoser.signals.expand import Expansion
from diagnoser.signals.recorded import (
    CONVENTION,
    PRESENT,
    fingerprint,
    recorded_query,
    strip_recording_labels,
    substitute,
    valid_record_name,
)
from diagnoser.sources.prometheus import Sample
from diagnoser.testing.prometheus import binaries
from tests.conftest import run_cli_here, unavailable

#: Minutes of input series: rates are read at the end, well past the first samples.
MINUTES = 20
EVAL = f"{MINUTES}m"


def _recorded() -> list[Recorded]:
    settings = Settings()
    inputs = LintInputs.from_settings(settings)
    ruleset = load_ruleset(RulePack.from_settings(settings))
    return recorded_conditions(ruleset, inputs.variables, inputs.catalogue, signals=settings.signals)


RECORDED = _recorded()


def _promtools() -> list[str]:
    found = [pair[1] for pair in (binaries("2"), binaries("3")) if pair is not None]
    if not found:
        unavailable("promtool is not installed (the Debian package 'prometheus')")
    return found


def _counter(per_minute: float) -> str:
    return f"0+{per_minute:g}x{MINUTES}"


def _p99(bounds: list[tuple[float, float]]) -> float:
    """The 0.99 quantile of cumulative bucket rates ``[(le, rate)]`` (+Inf last), interpolated
    linearly inside the bucket that holds the rank, as Prometheus' histogram_quantile does."""
    total = bounds[-1][1]
    rank = 0.99 * total
    lower_bound, lower_count = 0.0, 0.0
    for le, count in bounds:
        if count >= rank:
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    raise AssertionError("rank beyond the last bucket")


#: Buckets per minute: 50 within 0.1 s, 90 within 0.5 s, all 100 within 1 s.
BUCKETS = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0)]


def _buckets(metric: str, labels: str, scale: float = 1.0) -> list[dict[str, str]]:
    series = [
        {"series": f'{metric}_bucket{{{labels}, le="{le * scale:g}"}}', "values": _counter(n)}
        for le, n in BUCKETS
    ]
    series.append({"series": f'{metric}_bucket{{{labels}, le="+Inf"}}', "values": _counter(BUCKETS[-1][1])})
    return series


@dataclass(frozen=True)
class Case:
    convention: str
    series: list[dict[str, str]]
    #: ``(labels of the answer, value)``; the recording's own labels are added.
    expected: list[tuple[dict[str, str], float]]


def _pool() -> Case:
    # Two pods of one service share the pool's name: 6 and 9 of 10 in use; the rule takes the worst.
    pool = 'job="checkout", db_client_connection_pool_name="orders"'
    series = [
        {"series": f'db_client_connection_count{{{pool}, pod="a", db_client_connection_state="used"}}', "values": "6x20"},
        {"series": f'db_client_connection_count{{{pool}, pod="b", db_client_connection_state="used"}}', "values": "9x20"},
        {"series": f'db_client_connection_max{{{pool}, pod="a"}}', "values": "10x20"},
        {"series": f'db_client_connection_max{{{pool}, pod="b"}}', "values": "10x20"},
    ]  # fmt: skip
    return Case(
        "otel-semconv", series, [({"job": "checkout", "db_client_connection_pool_name": "orders"}, 9 / 10)]
    )


def _http_p99() -> Case:
    series = [
        *_buckets("http_server_request_duration_seconds", 'job="checkout", pod="a"'),
        *_buckets("http_server_request_duration_seconds", 'job="checkout", pod="b"'),
    ]
    # Two pods with the same buckets: the sum has the same shape, so the same p99.
    return Case("otel-http", series, [({"job": "checkout"}, _p99([(le, 2 * n) for le, n in BUCKETS]))])


def _http_rate() -> Case:
    series = [
        {
            "series": 'http_server_request_duration_seconds_count{job="checkout", pod="a"}',
            "values": _counter(60),
        },
        {
            "series": 'http_server_request_duration_seconds_count{job="checkout", pod="b"}',
            "values": _counter(120),
        },
    ]
    return Case("otel-http", series, [({"job": "checkout"}, (60 + 120) / 60)])


def _grpc_p99() -> Case:
    labels = 'job="orders", grpc_service="shop.Orders", grpc_method="Get", grpc_type="unary"'
    series = [
        *_buckets("grpc_server_handling_seconds", labels),
        {"series": f'grpc_server_handled_total{{{labels}, grpc_code="OK"}}', "values": _counter(100)},
    ]
    return Case(
        "go-grpc-prometheus", series, [({"job": "orders", "grpc_service": "shop.Orders"}, _p99(BUCKETS))]
    )


def _dependency_mean() -> Case:
    peer = 'job="checkout", server_address="inventory", server_port="8080"'
    series = [
        {"series": f"http_client_request_duration_seconds_sum{{{peer}}}", "values": _counter(30)},
        {"series": f"http_client_request_duration_seconds_count{{{peer}}}", "values": _counter(120)},
    ]
    labels = {"job": "checkout", "server_address": "inventory", "server_port": "8080"}
    return Case("otel-http-client", series, [(labels, 30 / 120)])


def _dependency_p99() -> Case:
    # The older OpenTelemetry client histogram counts milliseconds: the recording is in seconds.
    series = _buckets("http_client_duration_milliseconds", 'job="checkout", net_peer_name="inventory"', 1000)
    return Case(
        "otel-http-client-old", series, [({"job": "checkout", "net_peer_name": "inventory"}, _p99(BUCKETS))]
    )


CASES: dict[str, Callable[[], Case]] = {
    "diag:namespace_service_pool:pool_utilisation:ratio": _pool,
    "diag:namespace_service:http_server_duration:p99": _http_p99,
    "diag:namespace_service:http_server_requests:rate": _http_rate,
    "diag:namespace_service_rpc_service:grpc_server_duration:p99": _grpc_p99,
    "diag:namespace_service_peer:dependency_duration:mean": _dependency_mean,
    "diag:namespace_service_peer:dependency_duration:p99": _dependency_p99,
}


#: What the recorded values are rounded to in the promtool cases.
STEP = 2.0**-20


def _rounded(value: float) -> float:
    return math.floor(value / STEP + 0.5) * STEP


def _selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_the_expensive_conditions_are_recorded_under_every_convention() -> None:
    records = {r.record for r in RECORDED}
    assert records == set(CASES), "every recorded condition has a promtool case below"
    assert all(valid_record_name(r.record) for r in RECORDED)
    by_rule = {(r.rule_id, r.record) for r in RECORDED}
    assert ("pools/pool-exhaustion", "diag:namespace_service_pool:pool_utilisation:ratio") in by_rule
    assert ("dependencies/dependency-slow", "diag:namespace_service_peer:dependency_duration:p99") in by_rule
    # One rule per convention, each query once; aggregated before any division or quantile.
    assert len({(r.record, r.query) for r in RECORDED}) == len(RECORDED) > 50
    for item in RECORDED:
        if "histogram_quantile" in item.query:  # summed by le inside the quantile (classic form)
            assert ", le) (rate(" in item.expr, item.expr
        assert item.expr.lstrip("(").startswith(("sum by", "max by", "histogram_quantile")), item.expr


def test_export_passes_promtool_check_rules(tmp_path: Path) -> None:
    out = tmp_path / "recording.yaml"
    result = run_cli_here("rules", "export", "--recording", "--interval", "30s", "-o", str(out))
    assert result.code == 0, result.stderr
    document = yaml.safe_load(out.read_text())
    [group] = document["groups"]
    assert group["name"] == GROUP and group["interval"] == "30s"
    assert len(group["rules"]) == 2 * len(RECORDED)
    heartbeats = [r for r in group["rules"] if r["record"] == PRESENT]
    assert {h["labels"]["diag_query"] for h in heartbeats} == {r.fingerprint for r in RECORDED}
    for promtool in _promtools():
        checked = subprocess.run(
            [promtool, "check", "rules", str(out)], capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, f"{promtool}: {checked.stdout}{checked.stderr}"
        assert f"{len(group['rules'])} rules found" in checked.stdout


def test_a_promtool_case_per_recorded_condition(tmp_path: Path) -> None:
    rules_file = tmp_path / "recording.yaml"
    rules_file.write_text(yaml.safe_dump(recording_group(RECORDED), sort_keys=False, width=1 << 16))
    tests = []
    for record, build in CASES.items():
        case = build()
        [item] = [r for r in RECORDED if r.record == record and r.convention == case.convention]
        own = {"diag_convention": CONVENTION, "diag_query": fingerprint(item.query)}
        # Rounded to a power of two on both sides: the same interpolation in another order of
        # operations differs in the last bits, and promtool 2.x compares exactly.
        samples = [
            {"labels": _selector("", {**labels, **own}), "value": _rounded(value)}
            for labels, value in case.expected
        ]
        heartbeat = {**own, "diag_record": record}
        tests.append(
            {
                "name": f"{record} ({case.convention})",
                "interval": "1m",
                "input_series": case.series,
                "promql_expr_test": [
                    {
                        "expr": f"round({_selector(record, own)}, {STEP!r})",
                        "eval_time": EVAL,
                        "exp_samples": samples,
                    },
                    {
                        "expr": _selector(PRESENT, heartbeat),
                        "eval_time": EVAL,
                        "exp_samples": [{"labels": _selector(PRESENT, heartbeat), "value": 1}],
                    },
                ],
            }
        )
    test_file = tmp_path / "recording_test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {"rule_files": [rules_file.name], "evaluation_interval": "1m", "tests": tests}, sort_keys=False
        )
    )
    for promtool in _promtools():
        ran = subprocess.run(
            [promtool, "test", "rules", test_file.name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert ran.returncode == 0, f"{promtool}:\n{ran.stdout}{ran.stderr}"


@pytest.mark.parametrize("name", ["diag:pool", "pool:utilisation:ratio", "diag:a:B:ratio", "diag:a:b:c:d"])
def test_a_record_name_out_of_form_is_a_rule_problem(tmp_path: Path, name: str) -> None:
    rules = tmp_path / "rules" / "mine"
    rules.mkdir(parents=True)
    (rules / "busy.yaml").write_text(
        "cause: queue_backlog\nseverity: warning\ntitle: t\nsummary: s\nrecommendation: r\n"
        "when:\n  - signal:\n      query: sum by (service) ({{queue.length}})\n"
        f"      record: {name}\n"
    )
    (rules / "busy.md").write_text("# busy\n## Meaning\n## Impact\n## Diagnosis\n## Mitigation\n## Verify\n")
    result = run_cli_here("rules", "lint", "--rules", str(tmp_path / "rules"))
    assert result.code == 1
    assert "diag:<level>:<metric>:<operations>" in result.stdout + result.stderr


def test_the_documented_group_is_what_the_export_writes() -> None:
    from tests.docs.examples import only

    documented = yaml.safe_load(only("recording-rules").text)
    [group] = documented["groups"]
    exported = recording_group(RECORDED)["groups"][0]
    assert group["name"] == exported["name"]
    for rule in group["rules"]:
        assert rule in exported["rules"], rule


def test_a_query_is_swapped_only_for_its_own_recording() -> None:
    item = RECORDED[0]
    expansion = Expansion(convention=load_catalogue().conventions[0], query=item.query)
    swapped = substitute(expansion, {item.fingerprint: item.record})
    assert swapped is not None and swapped.query == recorded_query(item.record, item.query)
    assert swapped.query == f'{item.record}{{diag_convention="{CONVENTION}",diag_query="{item.fingerprint}"}}'
    # Another query's recording (the pack changed since the export), or none: the raw query stands.
    assert substitute(expansion, {fingerprint(item.query + " > 0"): item.record}) is None
    assert substitute(expansion, {}) is None
    # Whitespace is no change of query.
    assert fingerprint(item.query.replace(" ", "  ")) == item.fingerprint
    [row] = strip_recording_labels(
        [
            Sample(
                {"__name__": item.record, "diag_query": item.fingerprint, "diag_convention": "1", "job": "a"},
                1.0,
            )
        ]
    )
    assert row.labels == {"job": "a"}
