"""``diagnose serve``: the command that runs the always-on daemon.

    diagnose serve --config /etc/diagnoser/config.yaml --log-format json
    diagnose serve --prometheus-url http://prometheus:9090 --listen 0.0.0.0:8080 \
        --state /var/lib/diagnoser/state.sqlite3

It stops gracefully on SIGTERM or SIGINT (exit 0); a configuration error exits 2 before anything
starts.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from diagnoser.cli.app import (
    ConfigOption,
    PrometheusOption,
    app,
    check_inputs_or_exit,
    check_listen,
    configured_sources,
    fail,
    load_cli_settings,
    run_loop,
)
from diagnoser.config import Settings, parse_listen_address
from diagnoser.daemon.logs import configure_logging
from diagnoser.errors import ConfigError, DiagnoserError

__all__ = ["LogFormat", "LogLevel", "serve_command"]

log = logging.getLogger("diagnoser.serve")


class LogFormat(StrEnum):
    text = "text"
    json = "json"


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


@app.command("serve")
def serve_command(
    config: ConfigOption = None,
    prometheus_url: PrometheusOption = None,
    log_format: Annotated[LogFormat, typer.Option("--log-format", help="Log lines as text or JSON.")] = (
        LogFormat.text
    ),
    log_level: Annotated[
        LogLevel, typer.Option("--log-level", case_sensitive=False, help="The lowest level logged.")
    ] = LogLevel.INFO,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            help="Libraries' routine lines too: each HTTP request, the scheduler's skipped runs.",
        ),
    ] = 0,
    listen: Annotated[
        str | None, typer.Option("--listen", help="host:port for /healthz, /readyz, /metrics, /alertmanager.")
    ] = None,
    state: Annotated[
        Path | None, typer.Option("--state", help="SQLite state file (findings, notification outbox).")
    ] = None,
    replay_dead_letters: Annotated[
        bool, typer.Option("--replay-dead-letters", help="Put every dead letter back in the outbox; exit.")
    ] = False,
) -> None:
    """Run the daemon: probe and diagnose on a schedule, notify Slack once per incident."""
    overrides: dict[str, Any] = {}
    if prometheus_url:
        overrides["prometheus"] = {"url": prometheus_url}
    daemon: dict[str, Any] = {}
    if listen:
        daemon["listen"] = listen
    if state:
        daemon["state_path"] = str(state)
    if daemon:
        overrides["daemon"] = daemon
    settings = load_cli_settings(config, overrides)
    if replay_dead_letters:
        _replay(settings.daemon.state_path)
        return
    credentials = check_inputs_or_exit(settings, daemon=True)
    if not configured_sources(settings):
        raise fail(
            "no source configured: set prometheus.url, kubernetes, elasticsearch or "
            "daemon.probe_files (or give --prometheus-url)"
        )
    try:
        check_listen("--listen", *parse_listen_address(settings.daemon.listen))
        _check_receivers(settings)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    configure_logging(settings, log_format=log_format.value, level=log_level.value, verbose=verbose)
    from diagnoser.daemon import run_daemon

    try:
        # The loop every probe runs on, so the daemon's probe measures as diagnose probe does.
        run_loop(run_daemon(settings, credentials=credentials))
    except (DiagnoserError, OSError) as exc:  # e.g. the listen port is taken, the state dir unwritable
        log.error("cannot run the daemon: %s", exc)
        raise typer.Exit(2) from exc
    _exit_without_waiting_for_blocked_threads()


def _check_receivers(settings: Settings) -> None:
    """Every receiver's config valid and buildable before the daemon starts (ConfigError)."""
    from diagnoser.notify.receivers import build_receivers, receiver_configs

    webhook_url = settings.daemon.notify_webhook_url
    build_receivers(receiver_configs(settings.notify, slack=settings.slack, webhook_url=webhook_url))


def _replay(path: Path) -> None:
    """Requeue the dead letters of the state file at ``path`` in their places; say how many."""
    from diagnoser.daemon.state import StateStore

    if not Path(path).is_file():  # a mistyped path must not become an empty state
        raise fail(f"--state {path}: no state file there, so no dead letters to replay")
    try:
        store = StateStore(Path(path))
    except DiagnoserError as exc:
        raise fail(str(exc)) from exc
    try:
        count = store.retry_dead_letters()
    finally:
        store.close()
    typer.echo(f"{count} dead-lettered notification(s) queued again in {path}")


def _exit_without_waiting_for_blocked_threads() -> None:
    """Exit now even if a source's worker thread is still blocked in a read.

    The daemon has stopped and closed its state; a thread stuck on a hung Prometheus or API
    server would otherwise hold the interpreter's exit (it joins worker threads) until its
    socket timeout, far beyond the shutdown bound Kubernetes allows before SIGKILL.
    """
    main = threading.main_thread()
    blocked = [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]
    if not blocked:
        return
    log.info("exiting without waiting for %d worker thread(s) blocked in I/O", len(blocked))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
