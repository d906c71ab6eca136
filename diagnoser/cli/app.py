"""The ``diagnose`` Typer application and the kit every command is built from.

Each command lives in its own module of :mod:`diagnoser.cli` and registers itself on :data:`app`.
What they share is here, so no command has its own: the ``--config`` option
(:data:`ConfigOption`), the output formats (:class:`OutputFormat` for commands that print all
three, :class:`TableOrJson` for those that print two: a format is offered only where it works),
numbers (:func:`finite`: NaN and infinities are usage errors), groups of flags a command takes as
one parameter (:class:`FlagGroup`, :func:`grouped`), the gRPC flags (:class:`GrpcFlags`), the
error printer (:func:`fail`: one line on stderr, exit 2 for usage and configuration errors; usage
errors Typer finds itself are printed the same way), settings and rules loading (with what the
settings cannot check alone: PromQL in ``metrics:`` and ``signals:``), the one logging set-up
(:func:`configure_logging`) and the loop runner (:func:`run_loop`: the one event loop of
:func:`diagnoser.probe.entry.run_event_loop`, with Ctrl-C handed to the run's own stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import os
import select
import signal
import socket
import sys
import typing
from collections.abc import Callable, Coroutine, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

from diagnoser import promql
from diagnoser.config import Settings, load_settings
from diagnoser.engine import RulePack, load_ruleset
from diagnoser.engine.run import check_inputs
from diagnoser.errors import ConfigError, ExpressionError
from diagnoser.probe.entry import GrpcRequest, run_event_loop
from diagnoser.ruleset import RuleSet
from diagnoser.sources.registry import SourceSettings

if TYPE_CHECKING:
    from diagnoser.sources.kubernetes.credentials import Credentials

__all__ = [
    "AtOption",
    "ConfigOption",
    "FlagGroup",
    "FormatOption",
    "GrpcFlags",
    "OutputFormat",
    "PrometheusOption",
    "TableOrJson",
    "TableOrJsonOption",
    "app",
    "check_inputs_or_exit",
    "check_listen",
    "configure_logging",
    "configured_sources",
    "deprecated",
    "fail",
    "finite",
    "grouped",
    "load_cli_rules",
    "load_cli_settings",
    "rules_app",
    "run_loop",
    "stderr",
    "stdout",
    "write_out",
]

T = TypeVar("T")
R = TypeVar("R")

#: Click's base exception, found through Typer's public one (Typer vendors Click in some versions).
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class _OneLineErrors(TyperGroup):
    """The command group, printing a usage error Typer finds (an unknown option, a value that is
    not a number) as every command prints its own: one ``error:`` line, exit 2."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        def run(standalone: bool) -> Any:
            return super(_OneLineErrors, self).main(
                args, prog_name, complete_var, standalone_mode=standalone,
                windows_expand_args=windows_expand_args, **extra,
            )  # fmt: skip

        if not standalone_mode:
            return run(False)
        try:
            code = run(False)
        except _CLICK_ERROR as exc:
            context = getattr(exc, "ctx", None)
            hint = f" (see {context.command_path} --help)" if context is not None else ""
            message = str(exc.format_message()).replace("Value error, ", "")  # type: ignore[attr-defined]
            fail(f"{message}{hint}")
            sys.exit(getattr(exc, "exit_code", 2))
        except typer.Abort:
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="diagnose",
    help="Find why a service is slow or failing: the root cause, the evidence and a number to act on.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=_OneLineErrors,
)
rules_app = typer.Typer(help="List, lint and test rules.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")

stdout = Console(soft_wrap=False)
stderr = Console(stderr=True)


def write_out(text: str) -> None:
    """Write all of ``text`` to standard output (a JSON or Markdown document), to the last byte.

    A write to a full pipe may return short: measured, ``diagnose now --format json`` of 107 kB
    into a reader that was busy elsewhere handed over 65,536 bytes (the pipe's capacity) in one
    ``write(2)`` that returned short, and Python's buffered stdout took it as done, so the reader
    got a cut document. Here every byte is written, waiting for the pipe to drain where it must.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (captured in-process): it keeps all
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    data = memoryview(text.encode(sys.stdout.encoding or "utf-8", errors="replace"))
    while data:
        try:
            written = os.write(fd, data)
        except BlockingIOError:  # a non-blocking descriptor that is full: wait until it drains
            select.select([], [fd], [])
            continue
        data = data[written:]


class OutputFormat(StrEnum):
    """``--format`` of the commands that print all three (``now``, ``capacity``, ``rules list``)."""

    table = "table"
    json = "json"
    markdown = "markdown"


class TableOrJson(StrEnum):
    """``--format`` of the commands that print no Markdown (``probe``, ``signals``)."""

    table = "table"
    json = "json"


FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")]
TableOrJsonOption = Annotated[TableOrJson, typer.Option("--format", "-f", help="Output format.")]


def finite(text: str) -> float:
    """A number flag's value: neither NaN nor infinite (``typer.Option(parser=finite)``)."""
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise typer.BadParameter(f"{text!r} is not a finite number")
    return value


class FlagGroup:
    """Base of a frozen dataclass of flags that a command takes as one parameter.

    Each field is a flag, annotated as a command parameter would be; :func:`grouped` shows Typer
    the fields and hands the command one object per group::

        @dataclass(frozen=True)
        class Pace(FlagGroup):
            rate: Annotated[float, typer.Option("--rate", parser=finite)] = 10.0
            duration: Annotated[float, typer.Option("--duration", parser=finite)] = 10.0

        @app.command()
        @grouped
        def run(target: str, pace: Pace) -> None: ...
    """


def _is_group(annotation: Any) -> bool:
    return (
        isinstance(annotation, type)
        and issubclass(annotation, FlagGroup)
        and dataclasses.is_dataclass(annotation)
    )


def grouped(function: Callable[..., R]) -> Callable[..., R]:
    """``function`` with each :class:`FlagGroup` parameter shown to Typer as the group's fields."""
    hints = typing.get_type_hints(function, include_extras=True)
    flat: list[inspect.Parameter] = []
    groups: dict[str, tuple[type[Any], list[str]]] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        annotation = hints.get(name, parameter.annotation)
        if not _is_group(annotation):
            flat.append(parameter.replace(annotation=annotation, kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        field_hints = typing.get_type_hints(annotation, include_extras=True)
        names = []
        for item in dataclasses.fields(annotation):
            default = item.default if item.default is not dataclasses.MISSING else inspect.Parameter.empty
            flat.append(
                inspect.Parameter(
                    item.name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=default,
                    annotation=field_hints[item.name],
                )
            )
            names.append(item.name)
        groups[name] = (annotation, names)
    seen = [p.name for p in flat]
    if len(seen) != len(set(seen)):
        raise TypeError(f"{function.__name__}: two flags share a name in its groups")

    @functools.wraps(function)
    def command(**values: Any) -> R:
        for name, (group, names) in groups.items():
            values[name] = group(**{n: values.pop(n) for n in names})
        return function(**values)

    command.__signature__ = inspect.Signature(flat)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in flat}
    del command.__wrapped__  # Typer must read the flat signature
    return command


def deprecated(old: str, new: str) -> None:
    """Say on stderr that ``old`` still works and that ``new`` is its name now."""
    stderr.print(f"warning: {old} is deprecated, use {new}", markup=False, highlight=False)


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


@dataclasses.dataclass(frozen=True)
class GrpcFlags(FlagGroup):
    """The gRPC flags of every probing command (``probe``, ``now --probe``, ``capacity``)."""

    data: Annotated[
        str | None, typer.Option("--data", help="gRPC request message as JSON, or @FILE (grpc:// targets).")
    ] = None
    proto: Annotated[
        Path | None,
        typer.Option(
            "--proto", help="The service's .proto (compiled at run time); default: server reflection."
        ),
    ] = None
    import_path: Annotated[
        list[Path] | None,
        typer.Option("--import-path", "-I", help="Where --proto's imports are found (repeatable)."),
    ] = None
    metadata: Annotated[
        list[str] | None,
        typer.Option(
            "--metadata", "-H", help="gRPC metadata 'key: value' sent with every call (repeatable)."
        ),
    ] = None

    def request(self) -> GrpcRequest:
        """These flags as :func:`~diagnoser.probe.build_spec` takes them (``--metadata`` checked)."""
        pairs: dict[str, str] = {}
        for item in self.metadata or []:
            key, colon, value = item.partition(":")
            if not colon or not key.strip():
                raise fail(f"--metadata {item!r}: give it as 'key: value'")
            pairs[key.strip().lower()] = value.strip()
        return GrpcRequest(
            data=self.data, proto=self.proto, import_paths=list(self.import_path or []), metadata=pairs
        )


PrometheusOption = Annotated[
    str | None, typer.Option("--prometheus-url", help="PromQL API base URL (Prometheus, Thanos, Mimir...).")
]
AtOption = Annotated[
    str | None,
    typer.Option(
        "--at", help="As of this instant: RFC 3339 with a zone, unix seconds, or a time ago (-30m)."
    ),
]


def load_cli_settings(config: Path | None, overrides: dict[str, Any] | None = None) -> Settings:
    """The settings of ``--config`` and the environment, with the command's flags over them.

    What the settings cannot check alone is checked here too, before anything runs: every
    ``metrics:`` rename gives a query that parses, every ``signals:`` value is PromQL.
    """
    try:
        settings = load_settings(config, overrides=overrides or None)
        check_promql_settings(settings)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    return settings


def check_promql_settings(settings: Settings) -> None:
    """``ConfigError`` for a ``metrics:`` rename or a ``signals:`` value Prometheus could not parse.

    A rename is checked by what it does: a query reading the exporter's name, renamed as every
    rule's query is (:func:`diagnoser.promql.rename_metrics`), must still parse.
    """
    problems: list[str] = []
    for name, renamed in settings.metrics.items():
        if not _plausible_metric_name(renamed):
            problems.append(f"metrics.{name}: {renamed!r} is not a metric name (a name, not a selector)")
            continue
        try:
            promql.parse(promql.rename_metrics(f"rate({name}[5m])", {name: renamed}))
        except ExpressionError:
            problems.append(f"metrics.{name}: {renamed!r} is not a metric name a query can read")
    for name, expression in settings.signals.items():
        try:
            promql.parse(expression)
        except ExpressionError as exc:
            reason = getattr(exc, "reason", None) or str(exc)
            problems.append(f"signals.{name}: {expression!r} is not PromQL ({reason})")
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))


#: Characters no exporter puts in a metric name: Prometheus 3 accepts any UTF-8 in a quoted name, so
#: only these (a selector's braces and quotes, white space) tell a rename that is a typo or a
#: selector (``'redis clients{'``, ``'up{job="x"}'``) from a dotted OpenTelemetry name.
_NOT_IN_NAMES = frozenset('{}"\'\n\t\r ')


def _plausible_metric_name(name: str) -> bool:
    return bool(name) and not (_NOT_IN_NAMES & set(name))


def check_listen(flag: str, host: str, port: int) -> None:
    """``ConfigError`` when ``host:port`` cannot be listened on now (taken, or not this machine's).

    Checked before a command starts anything, so a port in use is one line, not a failure after
    start-up. The listener binds again when it starts (with the same ``SO_REUSEADDR``).
    """
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ConfigError(f"{flag} {host}:{port}: {exc.strerror or exc}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise ConfigError(f"{flag} {host}:{port}: cannot listen there: {exc.strerror or exc}") from exc


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
        ruleset = load_ruleset(RulePack.from_settings(settings))
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    for problem in ruleset.problems:
        stderr.print("[yellow]rule error:[/yellow] ", end="")
        stderr.print(str(problem), markup=False, highlight=False, soft_wrap=True)
    return ruleset


def configured_sources(settings: Settings) -> list[str]:
    """The sources ``settings`` configure (the probe counts when the daemon has probe files)."""
    sources: list[str] = list(SourceSettings.from_settings(settings).configured())
    if settings.daemon.probe_files:
        sources.append("probe")
    return sources


def check_inputs_or_exit(settings: Settings, *, daemon: bool = False) -> Credentials | None:
    """Exit 2 on inputs that cannot work: missing paths, a kubeconfig that does not load.

    Returns the Kubernetes credentials loaded on the way, so the run does not read them again.
    """
    try:
        return check_inputs(settings.input_paths(daemon=daemon), settings.kubernetes)
    except ConfigError as exc:
        raise fail(str(exc)) from exc


#: Client libraries whose INFO/WARNING chatter (urllib3 retries, elastic_transport node
#: failures, httpx requests) repeats what the report already says; shown from -vv on.
_LIBRARY_LOGGERS = (
    "urllib3", "elastic_transport", "elasticsearch", "httpx", "httpcore", "kubernetes", "asyncio",
    "aiohttp", "apscheduler", "py.warnings",
)  # fmt: skip


def configure_logging(verbosity: int, settings: Settings | None = None) -> None:
    """A one-shot command's logging, on the one set-up (:func:`diagnoser.daemon.logs.configure_logging`).

    Warnings of diagnoser's own by default; its debug log with -v; every library's with -vv.
    Lines go out with the settings' secrets masked and the credentials of any URL in them
    removed: httpx logs each request's full URL, and a ``prometheus.url`` may carry
    ``?access_token=...``.
    """
    from diagnoser.daemon.logs import configure_logging as set_up

    set_up(settings, level="DEBUG" if verbosity >= 2 else "WARNING", verbose=max(0, verbosity - 1))
    logging.captureWarnings(True)  # library warnings.warn() calls go through logging too
    if verbosity >= 1:
        logging.getLogger("diagnoser").setLevel(logging.DEBUG)
    if verbosity < 2:
        for name in _LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
