"""Every config, probe, signal, rule-fragment and JSON example of the pages, read by the real loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from diagnoser.capacity.report import CapacityReport
from diagnoser.config import load_settings
from diagnoser.errors import ConfigError
from diagnoser.models import CAUSES, SYMPTOMS, Diagnosis
from diagnoser.probe.spec import ConstantSchedule, load_probe_file
from diagnoser.ruleset import load_rules
from diagnoser.signals.catalogue import load_catalogue
from tests.docs.examples import Example, of_kind, only, run_in


@pytest.mark.parametrize("example", of_kind("config"), ids=str)
def test_config_example_loads(example: Example, tmp_path: Path) -> None:
    path = tmp_path / "diagnoser.yaml"
    path.write_text(example.text, encoding="utf-8")
    settings = load_settings(path)
    written = yaml.safe_load(example.text)
    dumped = settings.model_dump(mode="json")
    for key in written:
        assert key in dumped, key
    if "daemon" in written:
        assert settings.daemon.probe_files == [Path(p) for p in written["daemon"]["probe_files"]]
    if "silences" in written:
        assert [s.matchers for s in settings.silences] == [s["matchers"] for s in written["silences"]]


def test_a_misspelt_key_of_the_config_example_is_refused(tmp_path: Path) -> None:
    example = next(e for e in of_kind("config") if e.text.startswith("prometheus:"))
    path = tmp_path / "diagnoser.yaml"
    path.write_text(example.text.replace("  url: https", "  urll: https", 1), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"prometheus\.urll: unknown key \(did you mean prometheus\.url\?\)"):
        load_settings(path)


def test_probe_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "checkout.yaml"
    path.write_text(only("probe").text, encoding="utf-8")
    spec = load_probe_file(path)
    assert isinstance(spec.schedule, ConstantSchedule)
    assert spec.schedule.rate == 20
    assert spec.expect.json_path == "$.features"
    assert spec.timeout_s == 2


def test_grpc_probe_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "features.yaml"
    path.write_text(only("grpc-probe").text, encoding="utf-8")
    spec = load_probe_file(path)
    assert spec.is_grpc and spec.grpc is not None
    assert spec.grpc.proto == tmp_path / "protos" / "features.proto"
    assert spec.headers == {"x-tenant": "shop"}
    assert spec.timeout_s == 0.5


def test_signal_file_example_adds_its_convention(tmp_path: Path) -> None:
    path = tmp_path / "acme.yaml"
    path.write_text(only("signals").text, encoding="utf-8")
    convention = load_catalogue((path,)).convention("acme-pool")
    assert convention is not None
    assert convention.labels == {"service": "job", "pool": "acme_pool"}
    assert convention.forms["pool.used"].metric == "acme_pool_busy"
    # Milliseconds, from the name or said outright, are read as seconds.
    assert convention.forms["pool.hold_seconds"].scale == 0.001
    assert convention.forms["pool.use_seconds"].scale == 0.001
    assert convention.forms["pool.use_seconds"].note == "includes the wait"


def test_resource_example_loads_as_a_catalogued_resource(tmp_path: Path) -> None:
    path = tmp_path / "resources.yaml"
    path.write_text(only("resources").text, encoding="utf-8")
    [resource] = [r for r in load_catalogue((path,)).resources if r.how == "postgres-exporter"]  # replaced, not added
    assert (resource.name, resource.kind, resource.role, resource.labels) == (
        "postgresql max_connections", "connections", "server", ("server",)
    )
    assert resource.required == {
        "pg_stat_activity_count", "pg_settings_max_connections", "pg_settings_superuser_reserved_connections"
    }


def test_the_atlas_entry_example_loads_and_claims_its_names(tmp_path: Path) -> None:
    path = tmp_path / "acme.yaml"
    path.write_text(only("atlas-entry").text, encoding="utf-8")
    [resource] = [r for r in load_catalogue((path,)).resources if r.how == "acme-db"]
    assert (resource.name, resource.kind, resource.role) == ("acmedb max_sessions", "connections", "server")
    assert resource.required == {"acmedb_sessions_open", "acmedb_config_max_sessions"}
    assert resource.refused == ("acmedb_sessions_refused_total",)


def test_condition_example_loads_inside_a_rule(tmp_path: Path) -> None:
    rule = {
        "cause": "connection_pool_exhaustion", "kind": "cause", "severity": "critical",
        "title": "t", "summary": "s", "when": yaml.safe_load(only("condition").text),
    }
    path = tmp_path / "rules" / "pools" / "example.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(rule), encoding="utf-8")
    ruleset = load_rules([tmp_path / "rules"], include_builtin=False)
    assert ruleset.problems == []
    assert list(ruleset.rules) == ["pools/example"]


def test_the_rule_error_shown_is_the_loaders(tmp_path: Path) -> None:
    bad = tmp_path / "rules" / "team" / "bad.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text(only("rule").text.replace('op: ">="', 'op: "=>"'), encoding="utf-8")
    result = run_in(tmp_path, ["diagnose", "rules", "list", "--rules", "rules"])
    [line] = only("rule-error").text.splitlines()
    assert line in result.stdout + result.stderr


def _findings(findings: list[dict[str, object]]) -> None:
    for finding in findings:
        assert finding["cause"] in (SYMPTOMS if finding["kind"] == "symptom" else CAUSES)


def test_diagnosis_json_example_is_the_contract() -> None:
    document = json.loads(only("json diagnosis").text)
    diagnosis = Diagnosis.model_validate(document)
    dumped = json.loads(diagnosis.model_dump_json())
    assert set(dumped) == set(document)
    assert set(dumped["findings"][0]) == set(document["findings"][0])
    assert set(dumped["findings"][0]["evidence"][0]) == set(document["findings"][0]["evidence"][0])
    assert set(dumped["errors"][0]) == set(document["errors"][0])
    _findings(document["findings"])
    rule_ids = {r.id for r in load_rules([], include_builtin=True)}
    assert {f["rule_id"] for f in document["findings"]} <= rule_ids
    assert {r["rule_id"] for r in document["coverage"]["rules"]} <= rule_ids


def test_capacity_json_example_is_the_contract() -> None:
    document = json.loads(only("json capacity").text)
    report = CapacityReport.model_validate(document)
    assert set(json.loads(report.model_dump_json())) == set(document)
    assert set(json.loads(report.steps[0].model_dump_json())) == set(document["steps"][0])
    _findings(document["findings"])
    rule_ids = {r.id for r in load_rules([], include_builtin=True)}
    assert report.bottleneck is not None and report.bottleneck.rule_id in rule_ids
    assert report.bottleneck.cause in CAUSES
    assert set(report.steps[0].findings) <= CAUSES | SYMPTOMS
