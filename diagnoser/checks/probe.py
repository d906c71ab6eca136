"""The ``probe`` check kind: a number read from the last probe run, compared with a threshold.

``field`` names a number of the :class:`~diagnoser.probe.ProbeResult` by its JSON path, or a
sum of them with ``+``; ``per`` divides it by a count to make a ratio::

    - probe: {field: latency_ms.p99, op: ">", threshold: "${slo.p99_ms}"}
    - probe: {field: failures.empty_body+failures.empty_json+failures.missing_path, per: finished,
              op: ">", threshold: 0.01}
    - probe: {field: phase_share_p99.connect+phase_share_p99.tls, op: ">=", threshold: 0.5}
    - probe: {field: error_ratio, op: ">", threshold: "${slo.error_ratio}"}

``status_counts.<status>`` counts the answers with one status (``status_counts.503``, or for a
gRPC target ``status_counts.UNAVAILABLE``), 0 when none had it; its ``detail`` lists every status
seen. Besides the result's own fields, ``error_ratio`` (every failure kind over finished
requests), ``handshake_share_p50`` (the median connect + TLS over the median time on the wire: what
a typical request pays for opening its connection) and ``handshake_share_p99`` (connect + TLS over
the slowest requests' time on the wire, the probe's own schedule lag left out) are available. Field
names are checked when the rule loads, so a typo is a rule error. The check holds with one evidence
row (labels ``target`` and ``host``); for ``failures.*`` fields its ``detail`` quotes the sampled
responses of those kinds, so a report shows the body that was wrong. With no probe run
(``ctx.sources.probe`` is ``None``) the rule is skipped.

``min_requests`` keeps a run too small to judge from holding, with one exception: a run the probe
stopped on its own error ratio (:attr:`~diagnoser.probe.ProbeResult.aborted_on_errors`, after
about ten failures of ten) is the probe's verdict that the target is failing, however few
requests it took, so its counts and latencies are judged as they are, and the row's caveat says
the probe aborted and why (the rules' summaries say it once, through ``{caveats}``). Fields
about connections (phase shares, handshakes, connections opened) still need their minimum: a
handful of requests says nothing about connection reuse. Coverage asks the same (:func:`judged`)
of a rule that stayed silent, so an aborted run never reads as too small to judge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from diagnoser.checks.comparison import Comparison, compare
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence
from diagnoser.numbers import format_number
from diagnoser.probe.result import ProbeResult

__all__ = ["ProbeParams", "judged", "probe_check", "read_field"]

SOURCE = "probe"
def _handshake_share(result: ProbeResult) -> float:
    """Connect + TLS as a share of the slowest requests' time on the wire.

    The probe's own schedule lag is left out: under load it can inflate the slowest requests'
    latency without saying anything about the server or its handshakes.
    """
    shares = result.phase_share_p99
    wire = shares.connect + shares.tls + shares.ttfb + shares.body
    return (shares.connect + shares.tls) / wire if wire > 0 else 0.0


def _median_handshake_share(result: ProbeResult) -> float:
    """The median connect + TLS over the median time on the wire, at most 1.

    A typical request, not the slowest: with a few dozen requests the p99 is one request, and on a
    busy host that one is wherever the scheduler stalled, so its split says nothing about
    handshakes. Connection reuse is a cost every request pays or none does, which the median shows.
    """
    phases = result.phases_ms
    handshake = (phases.connect.p50 or 0.0) + (phases.tls.p50 or 0.0)
    wire = result.service_time_ms.p50
    return min(1.0, handshake / wire) if wire else 0.0


_DERIVED: dict[str, Callable[[ProbeResult], float]] = {
    "error_ratio": lambda r: r.error_ratio,
    "handshake_share_p50": _median_handshake_share,
    "handshake_share_p99": _handshake_share,
}
_COUNTS = ("sent", "completed", "finished")
#: Fields that describe connection behaviour: never judged below their minimum, abort or not.
_CONNECTION_FIELDS = (
    "phase_share_p99",
    "handshake_share_p50",
    "handshake_share_p99",
    "connections_opened",
    "phases_ms",
)
_STATUS_PREFIX = "status_counts."
_EXAMPLE_BODY_CHARS = 200


def _read_path(data: Any, path: str) -> Any:
    value = data
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def read_field(result: ProbeResult, field: str, dumped: dict[str, Any] | None = None) -> float | None:
    """The value of ``field`` (a path or ``a+b`` sum); ``None`` when any part was not measured."""
    data = dumped if dumped is not None else result.model_dump(mode="json", exclude={"histogram", "examples"})
    total = 0.0
    for term in field.split("+"):
        term = term.strip()
        if term in _DERIVED:
            value: Any = _DERIVED[term](result)
        elif term.startswith(_STATUS_PREFIX):
            value = result.status_counts.get(term.removeprefix(_STATUS_PREFIX), 0)
        else:
            value = _read_path(data, term)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{term} is not a number")
        total += float(value)
    return total


def _validate_field(field: str) -> str:
    sample = ProbeResult(
        target="http://x/", requested_rate=1, achieved_rate=1, duration_s=1, sent=1, completed=1
    )
    data = sample.model_dump(mode="json", exclude={"histogram", "examples"})
    for term in field.split("+"):
        term = term.strip()
        if term in _DERIVED:
            continue
        if term.startswith(_STATUS_PREFIX) and term.removeprefix(_STATUS_PREFIX):
            continue  # any status: an HTTP code or a gRPC status name
        try:
            value = _read_path(data, term)
        except KeyError:
            raise ValueError(f"{term!r} is not a field of the probe result") from None
        if isinstance(value, dict | list | str | bool):
            raise ValueError(f"{term!r} is not a number (pick a field inside it)")
    return field


class ProbeParams(BaseModel):
    """Parameters of a ``probe`` condition."""

    model_config = ConfigDict(extra="forbid")

    field: str
    #: Divide by this count (``finished``, ``completed`` or ``sent``) to get a ratio.
    per: Literal["sent", "completed", "finished"] | None = None
    op: Comparison = ">"
    threshold: float
    #: Fewer finished requests than this and the run is too small to judge: the check does not hold.
    min_requests: int = Field(default=10, ge=1)

    @field_validator("field")
    @classmethod
    def _known_field(cls, value: str) -> str:
        return _validate_field(value)


def judged(params: ProbeParams, finished: int, *, aborted_on_errors: bool) -> bool:
    """Whether a run of ``finished`` requests is large enough to judge ``params.field``: its
    ``min_requests``, or any run the probe stopped on its error ratio, except for the fields about
    connections (see the module docstring). Coverage asks the same question of a silent rule.
    """
    if finished >= params.min_requests:
        return True
    about_connections = any(t.strip().startswith(_CONNECTION_FIELDS) for t in params.field.split("+"))
    return aborted_on_errors and finished > 0 and not about_connections


def _large_enough(result: ProbeResult, params: ProbeParams) -> bool:
    return judged(params, result.finished, aborted_on_errors=result.aborted_on_errors)


def _failure_kinds(field: str) -> set[str]:
    return {t.strip().split(".", 1)[1] for t in field.split("+") if t.strip().startswith("failures.")}


def _status_detail(result: ProbeResult) -> str:
    """Every status the run saw, most frequent first: ``UNAVAILABLE 40, OK 360 of 400 calls``."""
    counts = sorted(result.status_counts.items(), key=lambda item: -item[1])
    listed = ", ".join(f"{status} {count}" for status, count in counts) or "no answer with a status"
    return f"{listed} of {result.finished} {'calls' if _is_grpc(result) else 'requests'}"


def _is_grpc(result: ProbeResult) -> bool:
    return result.target.startswith(("grpc://", "grpcs://"))


def _abort_caveat(result: ProbeResult) -> str | None:
    """Said once per finding (a caveat, not each row's detail): the run stopped itself, and why."""
    return f"the probe aborted: {result.abort_reason}" if result.aborted_on_errors else None


def _latency_detail(result: ProbeResult) -> str:
    """``p50 .. p99 .. max ..``, or what there is none of: a run of refused connections has no latency."""
    latency = result.latency_ms
    if latency.p50 is None or latency.p99 is None or latency.max is None:
        return f"no answer to time over {result.finished} requests"
    return (
        f"p50 {format_number(latency.p50)} ms, p99 {format_number(latency.p99)} ms, "
        f"max {format_number(latency.max)} ms over {result.finished} requests"
    )


def _measured(result: ProbeResult, params: ProbeParams) -> str:
    if _STATUS_PREFIX in params.field:
        return f"status codes: {_status_detail(result)}"
    kinds = _failure_kinds(params.field)
    if kinds:
        shown = []
        for example in result.examples:
            if example.kind not in kinds:
                continue
            body = example.body if example.body is not None else ""
            if len(body) > _EXAMPLE_BODY_CHARS:
                body = body[:_EXAMPLE_BODY_CHARS] + "..."
            if example.kind == "truncated" and example.content_length is not None:
                shown.append(
                    f"{example.status} with Content-Length {example.content_length} but "
                    f"{example.received_bytes} bytes received: {body}"
                )
            elif example.status is not None and not body and example.error:
                shown.append(example.error)  # a gRPC status: its name and details
            elif example.status is not None:
                shown.append(f"{example.status} {body}" if body else f"{example.status} with an empty body")
            else:
                shown.append(example.error or example.kind)
        failures = result.failures.model_dump()
        counts = ", ".join(f"{k} {failures[k]}" for k in sorted(kinds))
        sample = "; ".join(dict.fromkeys(shown)) or "no sample kept"
        return f"{sample} ({counts} of {result.finished} requests)"
    if params.field.startswith("phase_share_p99"):
        shares = result.phase_share_p99
        parts = ", ".join(f"{name} {value:.0%}" for name, value in shares.model_dump().items() if value)
        return (
            f"slowest 1% of requests: {parts}; {result.connections_opened} connections opened "
            f"for {result.finished} requests"
        )
    detail = (
        f"{_latency_detail(result)} at {format_number(result.achieved_rate)} req/s; "
        f"{result.failures.total} failed{_failure_mix(result)}"
    )
    # The status codes say what kind of failure it was: always for a gRPC service, whenever
    # something failed for HTTP.
    if _is_grpc(result) or (result.failures.total and result.status_counts):
        return f"{detail}; status codes: {_status_detail(result)}"
    return detail


def _failure_mix(result: ProbeResult) -> str:
    """`` (status 11, timeout 2)``: the kinds of the failures, most frequent first."""
    kinds = sorted(((k, n) for k, n in result.failures.model_dump().items() if n), key=lambda kv: -kv[1])
    return f" ({', '.join(f'{kind} {count}' for kind, count in kinds)})" if kinds else ""


@check_kind("probe", params=ProbeParams, reads={"probe"})
async def probe_check(params: ProbeParams, ctx: CheckContext) -> CheckResult:
    """Holds when the probe's ``field`` (``/ per``) compares ``op`` ``threshold``."""
    result = ctx.require(ctx.sources.probe, SOURCE)
    if isinstance(result, dict):
        result = ProbeResult.model_validate(result)
    if not isinstance(result, ProbeResult):
        raise TypeError(f"sources.probe must be a ProbeResult, got {type(result).__name__}")
    if not _large_enough(result, params):
        return []
    value = read_field(result, params.field)
    if value is None:
        return []
    if params.per is not None:
        denominator = read_field(result, params.per)
        if not denominator:
            return []
        value = value / denominator
    if not compare(value, params.op, params.threshold):
        return []
    query = f"probe {result.target}: {params.field}" + (f" / {params.per}" if params.per else "")
    return [
        Evidence(
            source=SOURCE,
            query=f"{query} {params.op} {params.threshold:g}",
            labels={"target": result.target, "host": urlsplit(result.target).hostname or ""},
            value=value,
            threshold=params.threshold,
            detail=_measured(result, params),
            caveat=_abort_caveat(result),
        )
    ]
