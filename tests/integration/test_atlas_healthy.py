"""Every recorded healthy exposition, side by side: nothing at warning or above, no false pair.

Every directory of ``tests/fixtures/expositions`` with a ``healthy*.prom`` (the software recorded
live here or reconstructed from its source, see each SOURCE.md) is found here by itself, so a new
recording is judged the day it lands, with no list to keep. Each is backfilled as a healthy lead-in
(its two healthy scrapes: the gauges of the first, counters at the rate between them) into one
Prometheus, all on the same day, each its own scrape job; then one ``diagnose now`` and one
``diagnose signals`` at the end of the lead-in must show:

* no finding at warning or above for any recording (a healthy service is not an incident);
* no inferred pair of a status, a cluster's size, an age or a position with a gauge: a resource
  recognised by shape pairs only counts of what a server holds at once.

Cost: one Prometheus and two CLI runs over all the recordings (about 25 s on this 2-core host at a load average of 10).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from diagnoser.testing.prometheus import LocalPrometheus
from tests.conftest import run_cli_here, shared_bed
from tests.fixtures.expositions.timeline import HERE, incident_openmetrics

pytestmark = [pytest.mark.integration, shared_bed(__name__)]

#: Healthy seconds replayed before the instant judged: past the five minutes rates need and the
#: 15-minute windows; rules with longer baselines read what there is, as on a service started 16
#: minutes ago. Shorter is cheaper: the backfill is most of this module's cost.
LEAD_IN_S = 960
START_S = 1_792_000_000
AT = datetime.fromtimestamp(START_S + LEAD_IN_S - 30, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

RECORDINGS = sorted({path.parent.name for path in Path(HERE).glob("*/healthy*.prom")})

#: What a healthy recording may show because it is true of the host it was recorded on, not of the
#: software: node_exporter scraped this 2-core host while other work kept it busy (load 14).
TRUE_OF_THE_RECORDING_HOST = {"node-exporter": {"nodes/node-cpu-saturation"}}

#: Words that make a series no count of what a limit caps (a state, a cluster's size, an age, a
#: position in a log): any of them as a word of either name of an inferred pair is a false pair.
_NOT_COUNTS = re.compile(r"(^|_)(status|state|size|age|cluster|position|lsn|offset|epoch|version)(_|$)")


def _instance(index: int) -> str:
    return f"10.1.{index // 250}.{index % 250 + 1}:9000"


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    parts = [
        incident_openmetrics(
            directory,
            start_s=START_S,
            lead_in_s=LEAD_IN_S,
            # One incident point after the instant judged: the lead-in alone is read.
            incident_s=0,
            scrape_labels={"job": directory, "instance": _instance(index)},
        ).removesuffix("# EOF\n")
        for index, directory in enumerate(RECORDINGS)
    ]
    with LocalPrometheus(openmetrics="".join(parts) + "# EOF\n") as prometheus:
        yield prometheus.url


@pytest.fixture(scope="module")
def loud(prometheus_url: str) -> list[dict[str, object]]:
    # Fifty services side by side are a large cluster's worth of families: its deadline.
    result = run_cli_here(
        "now", "--prometheus-url", prometheus_url, "--at", AT, "--format", "json", "--deadline", "120"
    )
    assert result.code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == [], report["errors"]
    return [f for f in report["findings"] if f["severity"] in ("critical", "warning")]


@pytest.fixture(scope="module")
def services(prometheus_url: str) -> list[dict[str, object]]:
    result = run_cli_here("signals", "--prometheus-url", prometheus_url, "--at", AT, "--format", "json")
    assert result.code == 0, result.stderr
    found: list[dict[str, object]] = json.loads(result.stdout)["services"]
    return found


def _recording_of(finding: dict[str, object]) -> str | None:
    """The recording a finding is about: its scrape job, or its instance where the rule keeps that."""
    labels = finding["labels"]
    assert isinstance(labels, dict)
    if labels.get("job") in RECORDINGS:
        return str(labels["job"])
    for index, directory in enumerate(RECORDINGS):
        if labels.get("instance") == _instance(index):
            return directory
    return None


def test_every_recording_is_replayed() -> None:
    # The glob finds the recordings this module exists for (a moved directory is not silently skipped).
    assert len(RECORDINGS) >= 40 and {"prom-client", "redis-exporter-maxclients", "node-exporter"} <= set(
        RECORDINGS
    )


@pytest.mark.parametrize("directory", RECORDINGS)
def test_a_healthy_recording_gives_nothing_at_warning_or_above(
    loud: list[dict[str, object]], directory: str
) -> None:
    allowed = TRUE_OF_THE_RECORDING_HOST.get(directory, set())
    mine = [(f["rule_id"], f["summary"]) for f in loud if _recording_of(f) == directory]
    assert [m for m in mine if m[0] not in allowed] == []


def test_no_healthy_recording_gives_a_finding_nobody_owns(loud: list[dict[str, object]]) -> None:
    # A finding scoped by a label other than job and instance (a mesh's destination service)
    # still counts: nothing loud at all but what is true of a recording host.
    assert [(f["rule_id"], f["summary"], f["labels"]) for f in loud if _recording_of(f) is None] == []


@pytest.mark.parametrize("directory", RECORDINGS)
def test_a_healthy_recording_pairs_no_status_or_size_with_a_gauge(
    services: list[dict[str, object]], directory: str
) -> None:
    rows = [row for s in services if s["service"] == directory for row in s["signals"]]  # type: ignore[attr-defined]
    pairs = [row for row in rows if row["inferred"] and str(row["signal"]).startswith("resource")]
    for row in pairs:
        for metric in str(row["metric"]).split(" / "):
            name = metric.split("{")[0].split("(")[-1].removesuffix("_total")
            assert not _NOT_COUNTS.search(name), row


#: The HTTP servers sharing a family name with another library's, and the entry that must read each.
HTTP_ENTRIES = {
    "prom-client": "prom-client",
    "express-prom-bundle": "express-prom-bundle",
    "http-promhttp-go": "prometheus-promhttp",
    "http-client-python": "prometheus-python-instrumentator",
    "prometheus-net": "prometheus-net",
    "django-prometheus": "django-prometheus",
}
#: OpenTelemetry HTTP servers whose names one Prometheus holds in two OTLP spellings here (the JS
#: exporter appends no unit, Go's, Java's and Python's do): a convention is resolved to one
#: spelling per Prometheus (signals/holdings.py), so the other spelling's duration goes unread.
OTEL_TWO_SPELLINGS = {
    "http-otel-old": "otel-http-old",
    "otel-go-http-old": "otel-http-old",
    "otel-java-http-old": "otel-http-old-route",
    "otel-go-http-new": "otel-http",
    "otel-java-http-new": "otel-http",
}


def _check_entry(services: list[dict[str, object]], directory: str, entry: str) -> None:
    [service] = [s for s in services if s["service"] == directory]
    signals = service["signals"]
    assert isinstance(signals, list)
    used = {row["signal"]: row["convention"] for row in signals}
    assert used.get("http.server.duration") == entry, used
    assert used.get("http.server.errors") == entry, used


@pytest.mark.parametrize("directory", sorted(HTTP_ENTRIES))
def test_each_http_server_is_read_by_its_own_entry(services: list[dict[str, object]], directory: str) -> None:
    _check_entry(services, directory, HTTP_ENTRIES[directory])


@pytest.mark.xfail(
    strict=True, reason="one OTLP spelling per convention per Prometheus (signals/holdings.py)"
)
@pytest.mark.parametrize("directory", sorted(OTEL_TWO_SPELLINGS))
def test_an_otel_server_is_read_beside_another_spelling_of_its_names(
    services: list[dict[str, object]], directory: str
) -> None:
    _check_entry(services, directory, OTEL_TWO_SPELLINGS[directory])


def test_prom_client_beside_promhttp_is_not_listed_under_promhttp(services: list[dict[str, object]]) -> None:
    [prom_client] = [s for s in services if s["service"] == "prom-client"]
    rejected = prom_client["rejected"]
    assert isinstance(rejected, list)
    reasons = [r["reason"] for r in rejected if r["entry"] == "prometheus-promhttp"]
    assert any("lack the labels" in reason and "code" in reason for reason in reasons), rejected
