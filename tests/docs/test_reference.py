"""The reference tables of docs/ are the code's: rules, causes, signals, config keys, metrics, routes."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import yaml
from pydantic import BaseModel

from diagnoser.config import Settings
from diagnoser.daemon.http import build_app
from diagnoser.daemon.metrics import DaemonMetrics
from diagnoser.models import CAUSES, SYMPTOMS
from diagnoser.ruleset import load_rules
from tests.conftest import REPO
from tests.docs.examples import DOCS, of_kind, only, section

_CODE = re.compile(r"`([^`]+)`")


def test_rule_table_matches_the_pack() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/rules_table.py", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_cause_vocabulary_is_the_models() -> None:
    page = DOCS / "rules.md"
    symptoms = set(_CODE.findall(section(page, "vocabulary:symptoms", "vocabulary:causes")))
    causes = set(_CODE.findall(section(page, "vocabulary:causes", "vocabulary:end"))) - {"text", "--at"}
    assert symptoms == SYMPTOMS
    assert causes == CAUSES


def test_signal_table_is_the_catalogue() -> None:
    rows = [line for line in (DOCS / "signals.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and "(`signals/" in line]
    documented = {}
    for row in rows:
        family, signals, conventions = (cell.strip() for cell in row.strip("|").split("|"))
        [path] = re.findall(r"`(signals/\w+\.yaml)`", family)
        notes = re.compile(r"\([^)]*\)")  # "(1.26+, also redis-py 8)": about a convention, not one
        documented[path] = (set(_CODE.findall(signals)), set(_CODE.findall(notes.sub("", conventions))))
    shipped = {}
    for path in sorted((REPO / "signals").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        conventions = {c["name"] for c in spec.get("conventions", [])} | {r["name"] for r in spec.get("resources", [])}
        shipped[f"signals/{path.name}"] = (set(spec.get("signals", {})), conventions)
    assert documented == shipped


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every key of the configuration, dotted, with its default (sections are walked into)."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        section_model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel) and name != "silences"), None
        )
        if section_model is not None:
            keys.update(_leaf_keys(section_model, f"{prefix}{name}."))
        else:
            # A key required inside an optional section (basic_auth.username) has no default.
            keys[f"{prefix}{name}"] = None if field.is_required() else field.get_default(call_default_factory=True)
    return keys


def _documented_keys() -> dict[str, str]:
    table = (DOCS / "configuration.md").read_text(encoding="utf-8").split("## Every key", 1)[1]
    keys = {}
    for line in table.splitlines()[4:]:
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for key in _CODE.findall(cells[0]):
            keys[key] = cells[1]
    return keys


def test_every_config_key_is_in_the_table_with_its_default() -> None:
    documented, real = _documented_keys(), _leaf_keys(Settings)
    assert set(documented) == set(real)
    for key, default in real.items():
        text = documented[key]
        if isinstance(default, bool):
            assert text == str(default).lower(), key
        elif isinstance(default, int | float):
            assert float(text) == default, key
        elif default is None or default == "":
            assert text == "none", key
        elif default in ([], {}):
            assert text == str(default), key
        else:
            assert text == str(default), key


def test_daemon_metrics_are_the_ones_it_exposes() -> None:
    text = section(DOCS / "daemon.md", "metrics:start", "metrics:end")
    documented = {re.sub(r"\{.*\}", "", name) for name in _CODE.findall(text)}
    exposed = {
        metric.name + ("_total" if metric.type == "counter" else "")
        for metric in DaemonMetrics().registry.collect()
    }
    assert documented == exposed


def test_the_alertmanager_example_points_at_the_receiver() -> None:
    config = yaml.safe_load(only("alertmanager").text)
    [url] = [hook["url"] for receiver in config["receivers"] for hook in receiver["webhook_configs"]]
    routes = {(route.method, route.resource.canonical) for route in build_app(None).router.routes()}  # type: ignore[arg-type]
    assert ("POST", "/" + url.split("/", 3)[3]) in routes


def test_the_demo_excerpt_names_real_rules_and_causes() -> None:
    ids = {rule.id for rule in load_rules([], include_builtin=True)}
    for example in of_kind("output"):
        named_rules = set(re.findall(r"\b([a-z]+/[a-z0-9-]+)\.md\b|\(([a-z]+/[a-z0-9-]+)\)", example.text))
        rule_ids = {a or b for a, b in named_rules}
        assert rule_ids and rule_ids <= ids, example
        causes = set(re.findall(r"\b([a-z]+(?:_[a-z]+)+)\b", example.text)) & (CAUSES | SYMPTOMS)
        assert causes, example
        upper = {c.lower() for c in re.findall(r"\b([A-Z]+(?:_[A-Z]+)+)\b", example.text)}
        assert upper <= CAUSES | SYMPTOMS, example
