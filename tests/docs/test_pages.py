"""The pages themselves: a README that reads in five minutes, every example run, every link alive."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docs.examples import DOCS, PAGES, README, all_examples, examples

#: The kinds of example the doc tests run; each kind is run by the test named beside it.
KNOWN_KINDS = {
    "commands",  # test_commands.py: flags exist; Prometheus-only commands run against a local one
    "output",  # test_reference.py: a recorded run's excerpt, its rule ids and causes still exist
    "config",  # test_config_examples.py: loaded by diagnoser's config loader
    "probe",  # test_config_examples.py: loaded by the probe file loader
    "grpc-probe",  # test_config_examples.py: a gRPC probe file, loaded by the probe file loader
    "signals",  # test_config_examples.py: loaded into the signal catalogue
    "resources",  # test_config_examples.py: a catalogue file's resources, loaded
    "atlas-entry",  # test_config_examples.py: an atlas entry, loaded into the catalogue and read by shape
    "condition",  # test_config_examples.py: loaded by the rule loader inside a rule
    "rule-error",  # test_config_examples.py: the loader's message for that mistake
    "json diagnosis",  # test_config_examples.py: validated by the Diagnosis model
    "json capacity",  # test_config_examples.py: validated by the CapacityReport model
    "alertmanager",  # test_reference.py: points at the daemon's receiver route
    "rule",  # test_rule_examples.py: loaded and tested by `diagnose rules test`
    "rule-test",  # test_rule_examples.py: run by `diagnose rules test` on a real Prometheus
    "check-kind",  # test_check_kind_example.py: registered and run on a real Prometheus
    "recording-rules",  # tests/rules/test_recording.py: each of its rules is in the export as written
}

MAX_README_BYTES = 12 * 1024


def test_readme_reads_in_five_minutes() -> None:
    assert len(README.read_bytes()) <= MAX_README_BYTES


def test_the_two_commands_come_first_and_exist() -> None:
    first = examples(README)[0]
    assert first.kind == "commands"
    assert [line.split()[:2] for line in first.text.splitlines()] == [["make", "demo"], ["make", "test"]]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "make test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "`.ci/run` runs `make test`" in " ".join(README.read_text(encoding="utf-8").split())


def test_the_readme_says_why_prometheus_is_read_with_httpx() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = [re.split(r"[<>=;\[ ]", dependency, maxsplit=1)[0] for dependency in project["dependencies"]]
    assert "httpx" in names and "prometheus-api-client" not in names
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "with `httpx` directly, not through `prometheus-api-client`, because its async requests can be" \
           " cancelled at the diagnosis deadline" in text


def test_every_example_is_run() -> None:
    unmarked = [str(e) for e in all_examples() if e.kind not in KNOWN_KINDS]
    assert unmarked == [], f"examples without a known <!-- example: KIND --> marker: {unmarked}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = README.read_text(encoding="utf-8")
    assert [p.name for p in DOCS.glob("*.md") if f"](docs/{p.name})" not in readme] == []


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize(
    "page", [*PAGES, REPO / "ARCHITECTURE.md", REPO / "deploy" / "README.md"], ids=lambda p: str(p.relative_to(REPO))
)
def test_links_lead_somewhere(page: Path) -> None:
    broken = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a URL: not checked offline
        path_text, _, anchor = target.partition("#")
        path = (page.parent / path_text).resolve() if path_text else page
        missing_anchor = path.exists() and bool(anchor) and path.suffix == ".md" and anchor not in _anchors(path)
        if not path.exists() or missing_anchor:
            broken.append(target)
    assert broken == []
