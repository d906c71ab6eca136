"""``k8s.cross_zone_dependency``: client pods run in one zone while a dependency's endpoints are in others.

The rule names the dependency (``service``, a Service whose EndpointSlices give its ready
endpoints' zones) and its clients (``clients``, a label selector); nodes give the clients'
zones through ``topology.kubernetes.io/zone``. Every cross-zone call adds a round trip, so by
default it is a cause only when the dependency's latency (``latency_seconds``, or the PromQL
``latency_query`` when Prometheus is configured) is over ``latency_threshold_seconds``;
``when_latency: unknown`` reports it when no latency can be had, ``any`` always.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from diagnoser.checks.k8s.common import SOURCE, K8sCheckParams, join, kubernetes_of, meta
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError
from diagnoser.sources.kubernetes.objects import labels_match, parse_label_selector

if TYPE_CHECKING:
    from diagnoser.signals import Catalogue

__all__ = ["CrossZoneDependencyParams", "cross_zone_dependency"]

ZONE_LABEL = "topology.kubernetes.io/zone"


class CrossZoneDependencyParams(K8sCheckParams):
    check_name: ClassVar[str] = "cross_zone_dependency"

    #: The dependency's Service; unset: no dependency configured, the check does not apply.
    service: str | None = None
    service_namespace: str | None = None
    #: Label selector of the client pods (``app=web``).
    clients: str | None = None
    #: Share of the ready endpoints in other zones than a client zone that counts.
    min_share: float = Field(default=0.5, ge=0, le=1)
    latency_seconds: float | None = Field(default=None, ge=0)
    latency_query: str | None = None
    latency_threshold_seconds: float = Field(default=0.05, ge=0)
    #: high: only with latency over threshold; unknown: only when no latency is measurable; any: always.
    when_latency: Literal["high", "unknown", "any"] = "high"

    @field_validator("clients")
    @classmethod
    def _selector_is_supported(cls, clients: str | None) -> str | None:
        if clients:
            parse_label_selector(clients)
        return clients


def _queries(params: CrossZoneDependencyParams, catalogue: Catalogue) -> list[tuple[str, str]]:
    if params.latency_seconds is None and params.latency_query:
        return [(".latency_query", params.latency_query)]
    return []


@check_kind(
    "k8s.cross_zone_dependency",
    params=CrossZoneDependencyParams,
    reads={"kubernetes"},
    also_reads={"prometheus"},
    queries=_queries,
)
async def cross_zone_dependency(params: CrossZoneDependencyParams, ctx: CheckContext) -> CheckResult:
    """One row per client zone whose share of the dependency's endpoints elsewhere is over ``min_share``."""
    source = kubernetes_of(ctx)
    if not params.service or not params.clients:
        return []  # no dependency configured for this rule (rule_params name service and clients)
    latency = await _latency(params, ctx)
    if isinstance(latency, SourceError):
        return latency
    high = latency is not None and latency > params.latency_threshold_seconds
    if (params.when_latency == "high" and not high) or (
        params.when_latency == "unknown" and latency is not None
    ):
        return []

    service_scope = [params.service_namespace] if params.service_namespace else params.namespaces
    slices = await source.list_objects(
        "endpointslices",
        namespaces=service_scope,
        label_selector=f"kubernetes.io/service-name={params.service}",
    )
    if isinstance(slices, SourceError):
        return slices
    endpoint_zones = _endpoint_zones(slices)
    if not endpoint_zones:
        return []
    pods = await source.list_objects("pods", namespaces=params.namespaces)
    if isinstance(pods, SourceError):
        return pods
    nodes = await source.list_objects("nodes")
    if isinstance(nodes, SourceError):
        return nodes
    client_zones = _client_zones(pods, nodes, params.clients)
    latency_text = f"{latency * 1000:.0f}ms" if latency is not None else "unknown"
    total = sum(endpoint_zones.values())
    rows: list[Evidence] = []
    for zone, clients in sorted(client_zones.items()):
        share = 1.0 - endpoint_zones.get(zone, 0) / total
        if share < params.min_share or share == 0:
            continue
        remote = join(z for z in endpoint_zones if z != zone)
        rows.append(
            Evidence(
                source=SOURCE,
                query=f"list endpointslices kubernetes.io/service-name={params.service}; "
                f"list pods {params.clients}; list nodes ({ZONE_LABEL})",
                labels={
                    "service": params.service,
                    "client_zone": zone,
                    "endpoint_zones": remote,
                    "clients": str(clients),
                    "share": f"{share:.0%}",
                    "latency": latency_text,
                },
                value=share,
                threshold=params.min_share,
                detail=f"{clients} client pods ({params.clients}) in {zone} reach {params.service}, whose "
                f"ready endpoints are {share:.0%} in other zones ({remote}); latency {latency_text}",
            )
        )
    return rows


async def _latency(params: CrossZoneDependencyParams, ctx: CheckContext) -> float | SourceError | None:
    """The configured latency, else the worst of ``latency_query`` when Prometheus can answer it."""
    if params.latency_seconds is not None or not params.latency_query or ctx.sources.prometheus is None:
        return params.latency_seconds
    samples = await ctx.sources.prometheus.query(params.latency_query, ctx.at)
    if isinstance(samples, SourceError):
        return samples
    finite = [s.value for s in samples if s.is_finite]
    return max(finite) if finite else None


def _endpoint_zones(slices: list[dict[str, Any]]) -> Counter[str]:
    """Ready endpoints per zone."""
    zones: Counter[str] = Counter()
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            if endpoint.get("zone"):
                zones[str(endpoint["zone"])] += 1
    return zones


def _client_zones(pods: list[dict[str, Any]], nodes: list[dict[str, Any]], clients: str) -> Counter[str]:
    """Running client pods per zone of their node."""
    node_zone = {
        str(meta(n).get("name")): str((meta(n).get("labels") or {}).get(ZONE_LABEL, "")) for n in nodes
    }
    selector = parse_label_selector(clients)
    zones: Counter[str] = Counter()
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running" or not labels_match(
            meta(pod).get("labels") or {}, selector
        ):
            continue
        zone = node_zone.get(str((pod.get("spec") or {}).get("nodeName", "")), "")
        if zone:
            zones[zone] += 1
    return zones
