"""Credentials out of URLs before a URL is stored, logged, rendered or sent anywhere.

A Prometheus or Elasticsearch URL may carry a user and password (``https://u:pw@prom:9090``) or
a token in its query string (``?access_token=...``). Every place that shows a URL goes through
:func:`redact_url`; text that may quote a URL it did not build (a client library's exception,
a log line, a rendered report) goes through :func:`scrub_text`, the last line of defence. ::

    >>> redact_url("http://u:secret@127.0.0.1:9090/prom?access_token=abc&x=1")
    'http://***@127.0.0.1:9090/prom?access_token=***&x=1'
    >>> scrub_text("cannot connect to http://u:secret@10.0.0.1:9090: refused")
    'cannot connect to http://***@10.0.0.1:9090: refused'
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["REDACTED", "redact_url", "scrub", "scrub_text"]

REDACTED = "***"

#: Query parameters that carry a credential by convention (OAuth, cloud SDKs, Grafana, ES,
#: signed webhook URLs).
_SECRET_NAMES = (
    r"access_token|token|api_key|apikey|key|code|password|passwd|pwd|secret|client_secret|"
    r"auth|authorization|sig|signature|x-amz-signature|x-amz-security-token|x-goog-signature"
)
_SECRET_PARAMS = re.compile(rf"(?i)^({_SECRET_NAMES})$")
#: ``scheme://userinfo@``: userinfo stops at the first '/', '@', whitespace or quote, so a '@'
#: later in a path or a sentence is not taken for one.
_USERINFO_IN_TEXT = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/@\s\"'<>]+@")
#: ``name=value`` of a secret query parameter inside a URL quoted in text.
_SECRET_PARAM_IN_TEXT = re.compile(rf"(?i)([?&](?:{_SECRET_NAMES})=)[^&\s\"'<>#]+")


def redact_url(url: str) -> str:
    """``url`` with its user information and secret query values replaced by ``***``.

    A string that does not parse as a URL is scrubbed as text instead, never returned as is.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = REDACTED + "@" + netloc.rpartition("@")[2]
        query = parts.query
        if query:
            pairs = []
            for pair in query.split("&"):
                name, sep, _value = pair.partition("=")
                pairs.append(f"{name}={REDACTED}" if sep and _SECRET_PARAMS.match(name) else pair)
            query = "&".join(pairs)
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # e.g. an invalid IPv6 netloc
        return scrub_text(url)


def scrub_text(text: str) -> str:
    """``text`` with credentials removed from every URL quoted in it."""
    if "://" in text:
        text = _USERINFO_IN_TEXT.sub(lambda m: m.group(1) + REDACTED + "@", text)
    if "=" not in text:
        return text
    # A path and query quoted without its scheme (``/hook?key=...``) loses its secrets too.
    return _SECRET_PARAM_IN_TEXT.sub(lambda m: m.group(1) + REDACTED, text)


def scrub(value: Any) -> Any:
    """A JSON-like value (a Slack payload) with :func:`scrub_text` applied to every string in it."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value
