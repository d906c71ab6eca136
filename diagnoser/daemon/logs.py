"""Logging for the daemon: one line per event, text or JSON, with secrets masked on the way out.

Secrets live in :class:`pydantic.SecretStr` fields, which already print as ``**********``. As a
second line of defence, :func:`configure_logging` collects every secret value of the settings
(tokens, API keys, passwords, the webhook URL and its path) and the formatter masks any of them
that reaches a log line anyway, whether from diagnoser or from a library logging a request, and
strips the credentials of any URL quoted in a line (:func:`diagnoser.redact.scrub_text`). ::

    configure_logging(settings, log_format="json", level="INFO")
    logging.getLogger("diagnoser.daemon").info("diagnosis done", extra={"findings": 3})

Libraries' routine lines are left out unless asked for (``verbose``, ``diagnose serve -v``, or
``DEBUG``): httpx logs every Prometheus request at INFO (dozens per diagnosis), and APScheduler
warns "skipped: maximum number of running instances" at every tick of a job still running, which
is how ``max_instances=1`` is meant to work (a Slack call that hangs is reported by the delivery
itself when it times out).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr

from diagnoser.redact import scrub_text

__all__ = ["QUIET_LIBRARY_LOGGERS", "JsonFormatter", "MaskingFormatter", "configure_logging", "secret_values"]

MASK = "**********"
#: Attributes every LogRecord has; anything else came in through ``extra=`` and is logged too.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
#: Shorter values would mask ordinary words: such a "secret" is not one worth hiding.
_MIN_SECRET_LENGTH = 6
#: Libraries kept at WARNING unless verbose: a line per HTTP request (httpx) or per connection step.
QUIET_LIBRARY_LOGGERS = ("httpx", "httpcore", "urllib3", "elastic_transport")
#: APScheduler's warning when a run is skipped because the previous one still runs.
_SKIPPED_RUN = "skipped: maximum number of running instances"


def _not_a_skipped_run(record: logging.LogRecord) -> bool:
    return _SKIPPED_RUN not in str(record.msg)


def secret_values(model: Any) -> set[str]:
    """Every SecretStr value inside ``model`` (a settings object), plus the secret part of URLs."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, SecretStr):
            secret = value.get_secret_value()
            found.add(secret)
            parts = urlsplit(secret)
            if parts.scheme and parts.path.strip("/"):
                # A webhook URL's secret is its path; it may be logged without the host.
                found.add(parts.path)
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple | set):
            for item in value:
                walk(item)

    walk(model)
    return {s for s in found if len(s) >= _MIN_SECRET_LENGTH}


class MaskingFormatter(logging.Formatter):
    """A text formatter that replaces known secret values in the finished line."""

    def __init__(self, fmt: str | None = None, secrets: Iterable[str] = ()) -> None:
        super().__init__(fmt)
        # Longest first, so a secret containing another is masked whole.
        self.secrets = sorted(set(secrets), key=len, reverse=True)

    def mask(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        # A URL with credentials that no setting declared secret (a Prometheus URL is a plain
        # string) still loses them here.
        return scrub_text(text)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return self.mask(line)


class JsonFormatter(MaskingFormatter):
    """One JSON object per line: time, level, logger, message, extras and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return self.mask(json.dumps(entry, default=str))


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


def configure_logging(
    settings: Any = None,
    *,
    log_format: str = "text",
    level: str | int = "INFO",
    stream: TextIO | None = None,
    verbose: int = 0,
) -> logging.Handler:
    """Send every logger's records to ``stream`` (stderr) as text or JSON, secrets masked;
    libraries' routine lines only when ``verbose`` or at ``DEBUG``."""
    secrets = secret_values(settings) if settings is not None else set()
    handler = logging.StreamHandler(stream or sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(secrets=secrets))
    else:
        handler.setFormatter(
            MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", secrets=secrets)
        )
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # The scheduler logs every run at INFO; the daemon logs its own summary of each run.
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))
    chatty = verbose > 0 or root.level <= logging.DEBUG
    for name in QUIET_LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if chatty else max(logging.WARNING, root.level))
    scheduler = logging.getLogger("apscheduler.scheduler")
    scheduler.removeFilter(_not_a_skipped_run)  # configured twice (tests): one filter, not two
    if not chatty:
        scheduler.addFilter(_not_a_skipped_run)
    return handler
