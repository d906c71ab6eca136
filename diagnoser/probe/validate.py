"""Validators: does a response that arrived look like a good answer?

A status check alone passes the answers that hurt most quietly: a ``200`` with an empty body,
``{}``, or ``{"features": {}}``. :func:`check_response` returns the first failure kind of one
response (or ``None``); kinds are counted separately in the result.

JSON paths are a small subset of JSONPath: ``$.a.b``, ``$.items[0].id``, ``$["odd key"]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from diagnoser.probe.spec import Expectations

__all__ = [
    "FAILURE_KINDS",
    "check_message",
    "check_response",
    "has_no_values",
    "parse_json_path",
    "resolve_json_path",
]

#: Every failure kind the probe counts, in the order they are reported.
FAILURE_KINDS: tuple[str, ...] = (
    "status",
    "empty_body",
    "empty_json",
    "missing_path",
    "truncated",
    "too_large",
    "timeout",
    "connect_error",
    "read_error",
)

_PATH_TOKEN = re.compile(r"""\.([A-Za-z_][\w\-]*)|\[(\d+)\]|\[\"([^\"]*)\"\]|\['([^']*)'\]""")

PathStep = str | int


def parse_json_path(path: str) -> list[PathStep]:
    """``$.features.items[0]`` -> ``["features", "items", 0]``; raises ``ValueError`` on bad syntax."""
    if not path.startswith("$"):
        raise ValueError(f"JSON path must start with '$', got {path!r}")
    steps: list[PathStep] = []
    pos = 1
    while pos < len(path):
        match = _PATH_TOKEN.match(path, pos)
        if match is None:
            raise ValueError(f"JSON path {path!r}: cannot parse at {path[pos:]!r}")
        name, index, dq, sq = match.groups()
        if index is not None:
            steps.append(int(index))
        else:
            steps.append(name if name is not None else (dq if dq is not None else sq))
        pos = match.end()
    return steps


_MISSING = object()


def resolve_json_path(document: Any, steps: list[PathStep]) -> Any:
    """The value at ``steps`` in ``document``, or the ``_MISSING`` sentinel."""
    value = document
    for step in steps:
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                return _MISSING
            value = value[step]
        else:
            if not isinstance(value, dict) or step not in value:
                return _MISSING
            value = value[step]
    return value


def has_no_values(value: Any) -> bool:
    """True when a JSON value holds no scalar at all: ``{}``, ``[]``, ``null``, ``{"a": {}, "b": []}``.

    ``{"items": [], "total": 0}`` holds a value (``0``) and so is not empty: an honest "nothing
    found" answer carries at least a count or a flag.
    """
    if value is None:
        return True
    if isinstance(value, dict):
        return all(has_no_values(v) for v in value.values())
    if isinstance(value, list):
        return all(has_no_values(v) for v in value)
    return False


def _looks_like_json(content_type: str | None, body: bytes) -> bool:
    if content_type and "json" in content_type.lower():
        return True
    stripped = body.lstrip()[:1]
    return stripped in (b"{", b"[")


def check_response(
    expect: Expectations,
    json_path: list[PathStep] | None,
    *,
    status: int,
    content_type: str | None,
    content_length: int | None,
    body: bytes,
    method: str = "GET",
) -> str | None:
    """The first failure kind of a complete response, or ``None`` when it is a good answer."""
    if expect.status is not None:
        if status not in expect.status:
            return "status"
    elif not 200 <= status < 300:
        return "status"
    if content_length is not None and len(body) < content_length and method != "HEAD":
        return "truncated"
    if method == "HEAD" or status in (204, 304):
        return None
    if expect.non_empty_body and not body.strip():
        return "empty_body"
    wants_json = expect.json_path is not None or (
        expect.non_empty_json and _looks_like_json(content_type, body)
    )
    if not wants_json or not body.strip():
        return None
    try:
        document = json.loads(body)
    except ValueError:
        # A body that claims JSON and does not parse is as useless as an empty one.
        return "empty_json" if expect.json_path is None else "missing_path"
    if expect.non_empty_json and has_no_values(document):
        return "empty_json"
    if json_path is not None:
        value = resolve_json_path(document, json_path)
        if value is _MISSING or has_no_values(value) or value == "":
            return "missing_path"
    return None


def check_message(
    expect: Expectations,
    json_path: list[PathStep] | None,
    payload: bytes,
    to_json: Callable[[bytes], Any],
) -> tuple[str | None, str | None]:
    """``(failure kind or None, the message as JSON text)`` for a gRPC ``OK`` answer.

    The same expectations as for an HTTP body, on the message as protobuf's JSON mapping (fields
    left at their defaults are absent): a message with nothing set (zero bytes) is
    ``empty_body``; one whose JSON holds no value (``{"features": {}}``) is ``empty_json``; a
    ``json_path`` that is absent or empty is ``missing_path``. Bytes that are not the response
    message are a ``read_error``.
    """
    if not payload:
        if expect.non_empty_body:
            return "empty_body", "{}"
        return ("missing_path", "{}") if json_path is not None else (None, None)
    if not expect.non_empty_json and json_path is None:
        return None, None
    try:
        document = to_json(payload)
    except ValueError:
        return "read_error", None
    failure: str | None = None
    if expect.non_empty_json and has_no_values(document):
        failure = "empty_json"
    elif json_path is not None:
        value = resolve_json_path(document, json_path)
        if value is _MISSING or has_no_values(value) or value == "":
            failure = "missing_path"
    # The text only for a failure's example: a good answer costs no dump.
    return failure, json.dumps(document, separators=(",", ":")) if failure else None
