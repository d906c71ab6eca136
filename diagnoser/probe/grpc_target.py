"""gRPC targets of the probe: ``grpc://host:port/package.Service/Method`` and ``grpcs://``.

This module only reads targets and holds the options a gRPC probe carries in its spec; it does
not import grpcio, so an HTTP probe never pays for it. A target names one unary method::

    grpc://127.0.0.1:50051/features.v1.Features/Get     # plaintext HTTP/2 (h2c)
    grpcs://features.internal:443/features.v1.Features/Get

The request message is the spec's body (JSON, the protobuf JSON mapping), the metadata are its
``headers``, the per-call deadline its ``timeout_s``, TLS its ``verify_tls``. The message types
come from ``grpc.proto`` (compiled at run time with grpcio-tools) or, without it, from the
server's reflection service; either way they are kept in the spec as an encoded
``FileDescriptorSet`` (``descriptor_set``) once resolved, so a spec copied to another process
carries everything a call needs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "GRPC_SCHEMES",
    "GrpcOptions",
    "GrpcTarget",
    "grpc_options_for",
    "grpc_paths_beside",
    "is_grpc_url",
    "parse_grpc_target",
]

GRPC_SCHEMES = ("grpc", "grpcs")

# gRPC's core logs a failed TLS handshake or connect at INFO to stderr, outside Python's logging,
# which would put lines of its own beside the probe's one-line errors. Set before grpcio loads
# (it is imported only by the gRPC modules, after this one); GRPC_VERBOSITY set by the user wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
#: ``package.Service/Method``: a fully qualified service (package optional) and a method name.
_METHOD_PATH = re.compile(r"^/(?P<service>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)/(?P<method>[A-Za-z_]\w*)$")


def is_grpc_url(target: str) -> bool:
    return target.startswith(("grpc://", "grpcs://"))


@dataclass(frozen=True)
class GrpcTarget:
    """A parsed gRPC target: where to connect and which method to call."""

    host: str
    port: int
    tls: bool
    service: str
    method: str

    @property
    def path(self) -> str:
        """The HTTP/2 ``:path`` of the call: ``/package.Service/Method``."""
        return f"/{self.service}/{self.method}"

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_grpc_target(url: str) -> GrpcTarget:
    """``grpc://host:port/package.Service/Method`` parsed; ``ValueError`` saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in GRPC_SCHEMES or not parts.hostname:
        raise ValueError(f"a gRPC target is grpc://host:port/package.Service/Method, got {url!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"a gRPC target has no query, fragment or credentials: {url!r}")
    match = _METHOD_PATH.match(parts.path)
    if match is None:
        raise ValueError(
            f"a gRPC target's path is /package.Service/Method, got {parts.path or '(none)'!r} in {url!r}"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r}: {exc}") from None
    tls = parts.scheme == "grpcs"
    return GrpcTarget(
        host=parts.hostname,
        port=port if port is not None else (443 if tls else 80),
        tls=tls,
        service=match["service"],
        method=match["method"],
    )


class GrpcOptions(BaseModel):
    """How a gRPC probe finds its message types and how many HTTP/2 channels it opens."""

    model_config = ConfigDict(extra="forbid")

    #: A ``.proto`` file declaring the service; without it the server's reflection is asked.
    proto: Path | None = None
    #: Directories its imports are looked up in (``protoc -I``); the file's own directory is one.
    import_paths: list[Path] = Field(default_factory=list)
    #: HTTP/2 connections, each carrying many concurrent calls: a few are plenty.
    channels: int = Field(default=2, ge=1, le=16)
    #: The resolved message types (base64 ``FileDescriptorSet``); filled in when the probe is
    #: prepared, so that it is compiled or reflected once per run, not once per process.
    descriptor_set: str | None = None


def grpc_options_for(target: str, options: GrpcOptions | None) -> GrpcOptions | None:
    """A spec's gRPC options: the defaults for a gRPC target without any, ``None`` for HTTP.

    Raises ``ValueError`` for a gRPC target that does not parse, and for options on an HTTP one.
    """
    if urlsplit(target).scheme not in GRPC_SCHEMES:
        if options is not None:
            raise ValueError("grpc options apply to grpc:// and grpcs:// targets only")
        return None
    parse_grpc_target(target)
    return options if options is not None else GrpcOptions()


def grpc_paths_beside(options: dict[str, Any], directory: Path) -> dict[str, Any]:
    """A probe file's ``grpc.proto`` and ``grpc.import_paths``, relative ones read beside the file."""

    def beside(value: Any) -> Any:
        return str(directory / value) if isinstance(value, str) and not Path(value).is_absolute() else value

    options = dict(options)
    if "proto" in options:
        options["proto"] = beside(options["proto"])
    if isinstance(options.get("import_paths"), list):
        options["import_paths"] = [beside(v) for v in options["import_paths"]]
    return options
