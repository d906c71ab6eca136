"""``k8s.metrics_server``: the metrics APIService is absent or not Available, and HPAs show it matters.

Without ``v1beta1.metrics.k8s.io`` (metrics-server) every HPA scaling on CPU or memory is
frozen at its current size. The APIService alone may be a deliberate choice, so by default the
finding needs confirmation: an HPA whose ``ScalingActive`` condition or recent events say it
could not get resource metrics.
"""

from __future__ import annotations

from typing import ClassVar

from diagnoser.checks.k8s.common import (
    SOURCE,
    WindowParams,
    involved,
    join,
    kubernetes_of,
    list_namespaced,
    recent_events,
    ref,
    since,
)
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes.objects import condition

__all__ = ["MetricsServerParams", "metrics_server"]

#: HPA condition reasons that mean "the metrics API did not answer".
_METRIC_FAILURES = frozenset({"FailedGetResourceMetric", "FailedGetContainerResourceMetric"})


class MetricsServerParams(WindowParams):
    check_name: ClassVar[str] = "metrics_server"

    apiservice: str = "v1beta1.metrics.k8s.io"
    #: Report a missing metrics API only when some HPA or event shows it matters.
    require_confirmation: bool = True


@check_kind("k8s.metrics_server", params=MetricsServerParams, reads={"kubernetes"})
async def metrics_server(params: MetricsServerParams, ctx: CheckContext) -> CheckResult:
    """One row when the metrics API is missing or unavailable (and confirmed by HPAs)."""
    source = kubernetes_of(ctx)
    api = await source.get_object("apiservices", params.apiservice)
    if isinstance(api, SourceError):
        return api
    if api is None:
        state, why = "absent", f"APIService {params.apiservice} does not exist (metrics-server not installed)"
    else:
        available = condition(api, "Available")
        if available is not None and available.get("status") == "True":
            return []
        reason = (available or {}).get("reason", "no Available condition")
        state = "not_available"
        message = (available or {}).get("message", "")
        why = f"APIService {params.apiservice} is not Available ({reason}: {message})"

    listed = await list_namespaced(source, params.namespaces, "horizontalpodautoscalers", "events")
    if isinstance(listed, SourceError):
        return listed
    hpas, events = listed
    stuck: dict[str, str] = {}
    for hpa in hpas:
        active = condition(hpa, "ScalingActive")
        if active and active.get("status") == "False" and active.get("reason") in _METRIC_FAILURES:
            namespace, name = ref(hpa)
            stuck[f"{namespace}/{name}"] = str(active.get("message", ""))
    for event, _ in recent_events(events, _METRIC_FAILURES, since(params, ctx), "HorizontalPodAutoscaler"):
        namespace, name = involved(event)
        stuck.setdefault(f"{namespace}/{name}", str(event.get("message", "")))
    if not stuck and params.require_confirmation:
        return []
    detail = why + "".join(f"\n- HPA {name}: {message}" for name, message in sorted(stuck.items()))
    return [
        Evidence(
            source=SOURCE,
            query=f"get apiservices {params.apiservice}; list horizontalpodautoscalers; list events "
            "reason=FailedGetResourceMetric",
            labels={"apiservice": params.apiservice, "state": state, "hpas": join(stuck) or "none"},
            value=float(len(stuck)),
            detail=detail,
        )
    ]
