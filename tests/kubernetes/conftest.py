"""Fixtures for the Kubernetes tests: a fixture API server per test and sources pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnoser.config import KubernetesSettings
from diagnoser.sources.kubernetes import KubernetesSource
from tests.fixtures.k8s_server import Cluster, K8sFixtureServer

ServeFactory = Callable[..., K8sFixtureServer]


@pytest.fixture
def serve() -> Iterator[ServeFactory]:
    """``serve(cluster, **options)`` starts a fixture server; all are stopped after the test."""
    started: list[K8sFixtureServer] = []

    def start(cluster: Cluster, **options: Any) -> K8sFixtureServer:
        server = K8sFixtureServer(cluster, **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def source_for(tmp_path: Path) -> Iterator[Callable[..., KubernetesSource]]:
    """``source_for(server, namespaces=..., timeout_s=...)``: a KubernetesSource built from a kubeconfig."""
    sources: list[KubernetesSource] = []

    def build(server: K8sFixtureServer, *, page_size: int | None = None, **settings: Any) -> KubernetesSource:
        kubeconfig = server.write_kubeconfig(tmp_path / f"kubeconfig-{len(sources)}")
        values: dict[str, Any] = {
            "enabled": True,
            "kubeconfig": kubeconfig,
            "context": "fixture",
            "timeout_s": 5.0,
        }
        values.update(settings)
        source = KubernetesSource.from_settings(KubernetesSettings(**values))
        if page_size is not None:
            source.page_size = page_size
        sources.append(source)
        return source

    yield build
    for source in sources:
        source.close()
