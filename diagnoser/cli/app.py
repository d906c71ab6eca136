"""The ``diagnose`` Typer application and the kit every command is built from.

Each command lives in its own module of :mod:`diagnoser.cli` and registers itself on :data:`app`.
What they share is here, so no command has its own: the ``--config`` option
(:data:`ConfigOption`), the output formats (:class:`OutputFormat`, :data:`FormatOption`), the
error printer (:func:`fail`: one line on stderr, exit 2 for usage and configuration errors),
settings and rules loading, and the loop runner (:func:`run_loop`: the one event loop of
:func:`diagnoser.probe.entry.run_event_loop`, with Ctrl-C handed to the run's own stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Collection, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from diagnoser.config import Settings, load_settings
from diagnoser.daemon.logs import MaskingFormatter
from diagnoser.engine import load_ruleset
from diagnoser.engine.run import check_inputs
from diagnoser.errors import ConfigError
from diagnoser.probe.entry import GrpcRequest, run_event_loop
from diagnoser.ruleset import RuleSet

if TYPE_CHECKING:
    from diagnoser.sources.kubernetes.credentials import Credentials

__all__ = [
    "ConfigOption",
    "FormatOption",
    "GrpcDataOption",
    "GrpcImportPathOption",
    "GrpcMetadataOption",
    "GrpcProtoOption",
    "OutputFormat",
    "PrometheusOption",
    "app",
    "check_format",
    "check_inputs_or_exit",
    "configure_logging",
    "fail",
    "grpc_request",
    "load_cli_rules",
    "load_cli_settings",
    "rules_app",
    "run_loop",
    "stderr",
    "stdout",
]

T = TypeVar("T")

app = typer.Typer(
    name="diagnose",
    help="Find why a service is slow or failing: the root cause, the evidence and a number to act on.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
rules_app = typer.Typer(help="List, lint and test rules.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")

stdout = Console(soft_wrap=False)
stderr = Console(stderr=True)


class OutputFormat(StrEnum):
    """What ``--format`` may say, for every command (a command may print only some of them)."""

    table = "table"
    json = "json"
    markdown = "markdown"


FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")]


def check_format(output: OutputFormat, printed: Collection[OutputFormat]) -> OutputFormat:
    """``output`` when the command prints it; else a usage error (exit 2) naming what it prints."""
    if output not in printed:
        names = " or ".join(f.value for f in OutputFormat if f in printed)
        raise fail(f"--format {output.value}: this command prints {names}")
    return output


def _print_version(value: bool) -> None:
    if value:
        from diagnoser import __version__

        sys.stdout.write(f"diagnose {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _global_options(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Find why a service is slow or failing: the root cause, the evidence and a number to act on."""


def fail(message: str, code: int = 2, console: Console = stderr) -> typer.Exit:
    """Print ``error: message`` to stderr; the exit to raise (usage and configuration: 2)."""
    console.print("[red]error:[/red] ", end="")
    console.print(message, markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config file (DIAGNOSER_* variables override it).")
]
GrpcDataOption = Annotated[
    str | None,
    typer.Option("--data", help="gRPC request message as JSON, or @FILE (grpc:// targets)."),
]
GrpcProtoOption = Annotated[
    Path | None,
    typer.Option("--proto", help="The service's .proto (compiled at run time); default: server reflection."),
]
GrpcImportPathOption = Annotated[
    list[Path] | None,
    typer.Option("--import-path", "-I", help="Where --proto's imports are found (repeatable)."),
]

GrpcMetadataOption = Annotated[
    list[str] | None,
    typer.Option("--metadata", "-H", help="gRPC metadata 'key: value' sent with every call (repeatable)."),
]


def grpc_request(
    data: str | None,
    proto: Path | None,
    import_paths: list[Path] | None,
    metadata: list[str] | None = None,
) -> GrpcRequest:
    """The gRPC flags every probing command shares, as :func:`~diagnoser.probe.build_spec` takes them."""
    pairs: dict[str, str] = {}
    for item in metadata or []:
        key, colon, value = item.partition(":")
        if not colon or not key.strip():
            raise fail(f"--metadata {item!r}: give it as 'key: value'")
        pairs[key.strip().lower()] = value.strip()
    return GrpcRequest(data=data, proto=proto, import_paths=list(import_paths or []), metadata=pairs)


PrometheusOption = Annotated[
    str | None, typer.Option("--prometheus-url", help="PromQL API base URL (Prometheus, Thanos, Mimir...).")
]


def load_cli_settings(config: Path | None, overrides: dict[str, Any] | None = None) -> Settings:
    """The settings of ``--config`` and the environment, with the command's flags over them."""
    try:
        return load_settings(config, overrides=overrides or None)
    except ConfigError as exc:
        raise fail(str(exc)) from exc


def run_loop(main: Coroutine[Any, Any, T], *, on_interrupt: Callable[[], None] | None = None) -> T:
    """Run ``main`` on the one event loop; with ``on_interrupt``, Ctrl-C calls it (the run's own
    stop, so in-flight requests settle and the partial result is printed, not a traceback)."""
    if on_interrupt is None:
        return run_event_loop(main)
    stop = on_interrupt

    async def interruptible() -> T:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, stop)
        try:
            return await main
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    return run_event_loop(interruptible())


def load_cli_rules(settings: Settings, extra_dirs: list[Path] | None = None) -> RuleSet:
    """The rules the settings select plus ``--rules`` directories; rule file problems printed."""
    for directory in extra_dirs or []:
        if not directory.exists():
            raise fail(f"--rules: {directory} does not exist")
    if extra_dirs:
        settings = settings.model_copy(update={"rule_dirs": [*settings.rule_dirs, *extra_dirs]})
    try:
        ruleset = load_ruleset(settings)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    for problem in ruleset.problems:
        stderr.print("[yellow]rule error:[/yellow] ", end="")
        stderr.print(str(problem), markup=False, highlight=False, soft_wrap=True)
    return ruleset


def check_inputs_or_exit(settings: Settings, *, daemon: bool = False) -> Credentials | None:
    """Exit 2 on inputs that cannot work: missing paths, a kubeconfig that does not load.

    Returns the Kubernetes credentials loaded on the way, so the run does not read them again.
    """
    try:
        return check_inputs(settings, daemon=daemon)
    except ConfigError as exc:
        raise fail(str(exc)) from exc


#: Client libraries whose INFO/WARNING chatter (urllib3 retries, elastic_transport node
#: failures, httpx requests) repeats what the report already says; shown from -vv on.
_LIBRARY_LOGGERS = (
    "urllib3", "elastic_transport", "elasticsearch", "httpx", "httpcore", "kubernetes", "asyncio",
    "aiohttp", "apscheduler", "py.warnings",
)  # fmt: skip


def configure_logging(verbosity: int) -> None:
    """Warnings of diagnoser's own by default; its debug log with -v; every library's with -vv.

    Lines go out with the credentials of any URL in them removed: httpx logs each request's
    full URL, and a ``prometheus.url`` may carry ``?access_token=...``.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbosity >= 2 else logging.WARNING, handlers=[handler])
    logging.captureWarnings(True)  # library warnings.warn() calls go through logging too
    if verbosity >= 1:
        logging.getLogger("diagnoser").setLevel(logging.DEBUG)
    if verbosity < 2:
        for name in _LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
