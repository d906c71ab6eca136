"""Rendering a :class:`ProbeResult` for people, in the style of Nighthawk and wrk2.

Pure functions: a result in, rich renderables out (tests render them to text). The percentile
table puts latency (from the intended send time: what users got) beside service time (from the
actual send) and the probe's own schedule lag, so a reader sees at once whether the probe kept
its schedule; the phase table says where the slowest 1 % spent their time.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from diagnoser.probe.result import Percentiles, ProbeResult

__all__ = ["render_report"]

_ROWS = (("p50", "p50"), ("p75", "p75"), ("p90", "p90"), ("p99", "p99"), ("p99.9", "p999"),
         ("p99.99", "p9999"), ("max", "max"))  # fmt: skip
_PHASE_NAMES = {
    "schedule_lag": "schedule lag (probe)",
    "connect": "TCP connect",
    "tls": "TLS handshake",
    "ttfb": "waiting (first byte)",
    "body": "download (body)",
}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f}"


def _cell(p: Percentiles, key: str) -> str:
    value: float | None = getattr(p, key)
    return _ms(value)


def _summary(result: ProbeResult) -> Text:
    text = Text()
    text.append(f"{result.target}\n", style="bold")
    text.append(
        f"requested {result.requested_rate:g} req/s, achieved {result.achieved_rate:.1f} req/s over "
        f"{result.duration_s:.1f} s; sent {result.sent}, completed {result.completed}, "
        f"failed {result.failures.total}; connections opened {result.connections_opened}"
    )
    if result.aborted:
        text.append(f"\nstopped early: {result.abort_reason}", style="bold red")
    return text


def _percentile_table(result: ProbeResult) -> Table:
    table = Table(title="Latency (ms)", title_justify="left")
    table.add_column("percentile")
    table.add_column("latency (from intended send)", justify="right")
    table.add_column("service time (from actual send)", justify="right")
    table.add_column("schedule lag", justify="right")
    for label, key in _ROWS:
        table.add_row(
            label,
            _cell(result.latency_ms, key),
            _cell(result.service_time_ms, key),
            _cell(result.schedule_lag_ms, key),
        )
    return table


def _phase_table(result: ProbeResult) -> Table:
    table = Table(title="Phases (ms) and share of the slowest 1 %", title_justify="left")
    table.add_column("phase")
    table.add_column("count", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    table.add_column("share of p99", justify="right")
    shares = result.phase_share_p99
    phases = result.phases_ms
    for key, name in _PHASE_NAMES.items():
        share = getattr(shares, key)
        if key == "schedule_lag":
            stats: Percentiles | None = result.schedule_lag_ms
        else:
            stats = getattr(phases, key, None)
        if stats is None:
            table.add_row(name, "-", "-", "-", f"{share:.0%}")
        else:
            table.add_row(name, str(stats.count), _ms(stats.p50), _ms(stats.p99), f"{share:.0%}")
    return table


def _protocol(result: ProbeResult) -> str:
    """What the statuses are: HTTP status codes, or gRPC status names for a grpc(s):// target."""
    return "gRPC" if result.target.startswith(("grpc://", "grpcs://")) else "HTTP"


def _outcome_table(result: ProbeResult) -> Table:
    """One row per answer status and per failure that is not a status: a 404 is counted once."""
    table = Table(title="Outcomes", title_justify="left")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    failures = result.failures.model_dump()
    protocol = _protocol(result)
    if protocol == "gRPC":
        # DEADLINE_EXCEEDED is counted as a timeout, not as a status failure.
        unexpected = {s: n for s, n in result.status_counts.items() if s not in ("OK", "DEADLINE_EXCEEDED")}
    else:
        unexpected = {s: n for s, n in result.status_counts.items() if not str(s).startswith(("2", "3"))}
    # Status failures are the statuses themselves when the numbers agree (the usual case: a
    # non-2xx/3xx answer failed the status check); only then can the rows say so without a
    # second row counting the same answers again.
    status_rows_say_it = failures.get("status", 0) == sum(unexpected.values())
    for status, count in result.status_counts.items():
        if status_rows_say_it and status in unexpected:
            table.add_row(Text(f"{protocol} {status} (failure: status)", style="red"), str(count))
        else:
            table.add_row(f"{protocol} {status}", str(count))
    for kind, count in failures.items():
        if count and not (kind == "status" and status_rows_say_it):
            table.add_row(Text(f"failure: {kind}", style="red"), str(count))
    return table


def _examples(result: ProbeResult) -> Text:
    text = Text("Sampled failures\n", style="bold")
    lines: dict[str, int] = {}
    for example in result.examples:
        where = f"{_protocol(result)} {example.status}" if example.status is not None else "no response"
        line = f"  {example.kind}: {where}"
        if example.kind == "truncated" and example.content_length is not None:
            line += f", Content-Length {example.content_length}, received {example.received_bytes} bytes"
        if example.body is not None:
            line += f", body {example.body!r}"
        if example.error:
            line += f" ({example.error})"
        lines[line] = lines.get(line, 0) + 1
    for line, seen in lines.items():
        text.append(line + (f" (x{seen})" if seen > 1 else "") + "\n")
    return text


def render_report(result: ProbeResult) -> RenderableType:
    """The full human report of one probe run."""
    parts: list[RenderableType] = [_summary(result), _percentile_table(result), _phase_table(result)]
    parts.append(_outcome_table(result))
    if result.examples:
        parts.append(_examples(result))
    for warning in result.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    return Group(*parts)
