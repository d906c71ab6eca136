"""``diagnose verify``: is a fix confirmed? One open-loop run at the load that failed, judged by the SLO.

::

    diagnose verify http://checkout.shop.svc:8080/v1/quote --rate 95 --slo-p99-ms 300
    diagnose verify probes/checkout.yaml --rate 95 --slo-p99-ms 300 --before-p99-ms 2400
    diagnose verify URL --rate 95 --slo-p99-ms 300 --duration 30 --slo-error-ratio 0.001 --format json

It is the daemon's confirm probe, run once by hand (:mod:`diagnoser.probe.confirm`): a constant
``--rate`` for ``--duration`` seconds (default 10), held to the probe's caps and rules as
``diagnose probe`` is: a rate or a duration over ``probe.max_rate`` / ``probe.max_duration_s``
is refused, a probe file's host must be in ``probe.allowed_hosts``, the address rule applies. It
prints one line, ``p99 at 95 req/s: 2.4 s -> 140 ms, confirmed`` (the before from
``--before-p99-ms``) or ``not confirmed: p99 still 1.9 s at 95 req/s (SLO 300 ms; 2.4 s
before)``. Exit codes: 0 confirmed, 1 not confirmed, 2 usage, configuration or safety refusal,
130 interrupted.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from diagnoser.cli.app import (
    ConfigOption,
    GrpcFlags,
    TableOrJson,
    TableOrJsonOption,
    app,
    fail,
    finite,
    grouped,
    load_cli_settings,
    run_loop,
    stdout,
)
from diagnoser.cli.probe import INTERRUPTED_EXIT
from diagnoser.errors import DiagnoserError
from diagnoser.probe.confirm import confirm_spec, judge
from diagnoser.probe.entry import PreparedProbe, build_spec

__all__ = ["DEFAULT_DURATION_S", "verify_command"]

#: Long enough for a p99 over a few hundred requests at modest rates; short enough to run by hand.
DEFAULT_DURATION_S = 10.0


@app.command("verify")
@grouped
def verify_command(
    target: Annotated[
        str,
        typer.Argument(help="A URL (http(s)://, grpc(s)://) or a probe file (host in probe.allowed_hosts)."),
    ],
    *,
    rate: Annotated[
        float, typer.Option("--rate", "-r", parser=finite, help="Requests per second the fix must hold.")
    ],
    slo_p99_ms: Annotated[
        float, typer.Option("--slo-p99-ms", parser=finite, help="p99 latency SLO in ms the run must hold.")
    ],
    duration: Annotated[
        float, typer.Option("--duration", "-d", parser=finite, help="Seconds to run.")
    ] = DEFAULT_DURATION_S,
    slo_error_ratio: Annotated[
        float | None,
        typer.Option("--slo-error-ratio", "--error-ratio", parser=finite,
                     help="Error ratio the run may have (default: slo.error_ratio)."),
    ] = None,
    before_p99_ms: Annotated[
        float | None,
        typer.Option("--before-p99-ms", parser=finite, help="The p99 before the fix, for the line (ms)."),
    ] = None,
    output: TableOrJsonOption = TableOrJson.table,
    config: ConfigOption = None,
    grpc_flags: GrpcFlags,
) -> None:
    """Run one confirm probe at --rate and say whether the SLO holds: exit 0 confirmed, 1 not."""
    settings = load_cli_settings(config)
    error_ratio = slo_error_ratio if slo_error_ratio is not None else settings.slo.error_ratio
    for flag, value in (("--rate", rate), ("--slo-p99-ms", slo_p99_ms), ("--duration", duration)):
        if value <= 0:
            raise fail(f"{flag} must be positive, got {value:g}")
    if not 0 <= error_ratio <= 1:
        raise fail(f"--slo-error-ratio must be between 0 and 1, got {error_ratio:g}")
    if before_p99_ms is not None and before_p99_ms <= 0:
        raise fail(f"--before-p99-ms must be positive, got {before_p99_ms:g}")
    try:
        spec, explicit = build_spec(target, grpc=grpc_flags.request())
        # A rate typed over the caps is refused, as diagnose probe refuses it (never lowered silently).
        plan = confirm_spec(spec, rate=rate, duration_s=duration, settings=settings.probe, cap=False)
        probe = PreparedProbe(plan.spec, settings.probe, explicit_target=explicit)
        result = run_loop(probe(), on_interrupt=probe.stop)
    except DiagnoserError as exc:  # a bad target, a safety refusal, the resolved address refused
        raise fail(str(exc)) from exc
    confirmation = judge(
        result, plan, slo_p99_ms=slo_p99_ms, slo_error_ratio=error_ratio, before_p99_ms=before_p99_ms
    )
    if output is TableOrJson.json:
        body = {**confirmation.model_dump(mode="json"), "text": confirmation.text(),
                "probe": result.model_dump(mode="json")}  # fmt: skip
        sys.stdout.write(json.dumps(body) + "\n")
    else:
        stdout.print(confirmation.text(), markup=False, highlight=False, soft_wrap=True)
        p99 = "-" if confirmation.p99_ms is None else f"{confirmation.p99_ms:.1f} ms"
        stdout.print(
            f"{confirmation.target}: {confirmation.sent} requests over {confirmation.duration_s:g} s"
            f" ({confirmation.achieved_rate:.1f} req/s achieved), p99 {p99},"
            f" errors {confirmation.error_ratio:.2%} (SLO p99 {slo_p99_ms:g} ms, errors {error_ratio:.2%})",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
    if confirmation.failed_on == "interrupted":
        raise typer.Exit(INTERRUPTED_EXIT)
    raise typer.Exit(0 if confirmation.confirmed else 1)
