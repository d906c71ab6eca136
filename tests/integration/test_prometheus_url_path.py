"""A ``prometheus.url`` with a path and a query string, against a real Prometheus.

Behind a proxy or a multi-tenant gateway the PromQL API lives under a path
(``--web.route-prefix``) and often wants parameters of its own (``?tenant=a``,
``?access_token=...``). Every API request keeps that path and carries those parameters, and a
secret among them is never printed, neither in an error message nor in the libraries' log lines.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from diagnoser.config import PrometheusSettings
from diagnoser.models import SourceError
from diagnoser.sources.prometheus import PrometheusSource, Sample
from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import IncidentPrometheus, shared_bed

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

TOKEN = "tok-in-prom-url-3c9d"


@pytest.fixture(scope="module")
def prefixed() -> Iterator[LocalPrometheus]:
    """A Prometheus serving its API under ``/prometheus`` only, as behind a path-routing proxy."""
    with LocalPrometheus(route_prefix="/prometheus") as prometheus:
        yield prometheus


def _ask(
    url: str, promql: str, at: datetime | None = None
) -> tuple[list[Sample] | SourceError, set[str] | SourceError]:
    source = PrometheusSource(PrometheusSettings(url=url, query_timeout_s=5))
    now = at or datetime.now(UTC)

    async def both() -> tuple[list[Sample] | SourceError, set[str] | SourceError]:
        return await source.query(promql, now), await source.metric_names(now)

    try:
        return asyncio.run(both())
    finally:
        source.close()


def test_a_query_string_in_the_url_is_kept_on_every_request(incident_prometheus: IncidentPrometheus) -> None:
    # Prometheus ignores parameters it does not know: the tenant reaches it and changes nothing.
    during = datetime.fromtimestamp(incident_prometheus.start_s + 35 * 60, UTC)
    samples, names = _ask(f"{incident_prometheus.url}?tenant=a", "scalar(vector(42))", during)
    assert samples == [Sample(labels={}, value=42.0)]
    assert isinstance(names, set) and "db_client_connection_max" in names


@pytest.mark.parametrize("suffix", ["", "/", f"?access_token={TOKEN}", f"/?tenant=a&access_token={TOKEN}"])
def test_a_path_prefix_is_kept(prefixed: LocalPrometheus, suffix: str) -> None:
    samples, names = _ask(prefixed.url + suffix, "scalar(vector(7))")
    assert samples == [Sample(labels={}, value=7.0)]
    assert isinstance(names, set)


def test_a_token_in_the_url_stays_out_of_errors_and_logs(prefixed: LocalPrometheus) -> None:
    url = f"{prefixed.url}?access_token={TOKEN}"
    broken, _ = _ask(url, "sum(")
    assert isinstance(broken, SourceError) and "parse error" in broken.message
    assert TOKEN not in broken.message
    # -vv shows the libraries' own log lines, httpx's request lines among them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    result = subprocess.run(
        [sys.executable, "-m", "diagnoser", "now", "--prometheus-url", url, "--format", "json", "-vv"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    assert "HTTP Request: GET" in result.stderr  # the request lines are there, and clean
    assert "access_token=***" in result.stderr
    assert TOKEN not in result.stdout + result.stderr
    assert '"errors": []' in result.stdout.replace("\n", "").replace("  ", "")
