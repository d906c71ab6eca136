"""Source kinds are registered by decorator and built from the source sections alone."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

from diagnoser.cli.app import configured_sources
from diagnoser.config import ElasticsearchSettings, KubernetesSettings, PrometheusSettings, Settings
from diagnoser.engine.run import build_sources
from diagnoser.sources import SourceName
from diagnoser.sources.registry import SourceSettings, source_kind, source_kinds


def test_every_client_source_has_a_kind_in_report_order() -> None:
    assert list(source_kinds()) == [name for name in get_args(SourceName) if name != "probe"]


def test_configured_follows_the_sections() -> None:
    assert SourceSettings().configured() == []
    sections = SourceSettings(
        prometheus=PrometheusSettings(url="http://127.0.0.1:9"),
        elasticsearch=ElasticsearchSettings(urls=["http://127.0.0.1:9"]),
        kubernetes=KubernetesSettings(enabled=True),
    )
    assert sections.configured() == ["prometheus", "kubernetes", "elasticsearch"]
    settings = Settings(prometheus=PrometheusSettings(url="http://127.0.0.1:9"), daemon={"probe_files": ["p.yaml"]})
    assert configured_sources(settings) == ["prometheus", "probe"]


async def test_a_source_that_cannot_be_built_is_an_error_entry_and_the_others_are_built(tmp_path) -> None:
    missing = tmp_path / "no-kubeconfig"
    sections = SourceSettings(
        prometheus=PrometheusSettings(url="http://127.0.0.1:9"),
        kubernetes=KubernetesSettings(enabled=True, kubeconfig=missing),
    )
    built = build_sources(sections)
    try:
        assert built.sources.prometheus is not None
        assert built.sources.kubernetes is None
        assert [e.source for e in built.errors] == ["kubernetes"]
        assert built.errors[0].message.startswith("cannot set up: ")
    finally:
        await built.aclose()


def test_listing_the_kinds_loads_no_client() -> None:
    # A fresh interpreter: other tests here build sources, and so import their clients.
    code = (
        "import sys; from diagnoser.sources.registry import source_kinds; source_kinds(); "
        "print(sorted(m for m in ('elasticsearch', 'kubernetes', 'diagnoser.sources.kubernetes') if m in sys.modules))"
    )
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert listed.stdout.strip() == "[]"


def test_a_kind_must_be_a_source_name_and_registered_once() -> None:
    with pytest.raises(ValueError, match="is not a SourceName"):
        source_kind("graphite", configured=lambda s: True)  # type: ignore[arg-type]
    source_kinds()  # the real kinds first, so that the second registration is the test's
    with pytest.raises(ValueError, match="registered twice"):
        source_kind("prometheus", configured=lambda s: True)(lambda sources, credentials: None)
