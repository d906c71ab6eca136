"""Which findings answer an Alertmanager alert: the scope rules, table-driven."""

from __future__ import annotations

import pytest

from diagnoser.daemon.alerts import alert_scopes, finding_in_scope
from diagnoser.models import Evidence, Finding, Severity


def finding(labels: dict[str, str], evidence_labels: dict[str, str] | None = None) -> Finding:
    return Finding(rule_id="x/y", cause="connection_pool_exhaustion", kind="cause", severity=Severity.critical,
                   title="t", summary="s", labels=labels,
                   evidence=[Evidence(source="prometheus", query="q", labels=evidence_labels or {})])


def test_scopes_drop_alert_metadata_resolved_alerts_and_duplicates() -> None:
    payload = {"alerts": [
        {"status": "firing", "labels": {"alertname": "A", "severity": "page", "namespace": "shop", "job": "web"}},
        {"status": "firing", "labels": {"alertname": "B", "namespace": "shop", "job": "web"}},
        {"status": "resolved", "labels": {"alertname": "C", "namespace": "other"}},
    ]}
    assert alert_scopes(payload) == [{"namespace": "shop", "job": "web"}]
    assert alert_scopes({"alerts": [{"status": "resolved", "labels": {"job": "x"}}]}) == []
    with pytest.raises(ValueError, match="alerts"):
        alert_scopes({"alerts": "nope"})


@pytest.mark.parametrize(
    ("labels", "evidence", "expected"),
    [
        ({"namespace": "shop", "job": "web"}, None, True),
        ({"namespace": "shop", "job": "api"}, None, False),  # same namespace, another service
        ({"job": "web", "pool": "orders"}, None, True),  # shares job only, and it agrees
        ({"cluster": "prod"}, None, True),  # cluster-wide cause: may explain anything
        ({"job": "api"}, {"namespace": "shop", "job": "web"}, True),  # an evidence row is about it
        ({"namespace": "elsewhere"}, {"namespace": "elsewhere"}, False),
    ],
)
def test_finding_in_scope(labels: dict[str, str], evidence: dict[str, str] | None, expected: bool) -> None:
    assert finding_in_scope(finding(labels, evidence), {"namespace": "shop", "job": "web"}) is expected
