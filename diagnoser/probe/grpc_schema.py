"""The message types of a gRPC probe: a ``.proto`` compiled at run time, or the server's reflection.

:func:`resolve_grpc_spec` runs once, when a probe is prepared and before any probe call: it
compiles ``grpc.proto`` with grpcio-tools' ``protoc`` (``--include_imports``, the file's own
directory, ``grpc.import_paths`` and the well-known types on the include path) or asks the
server's reflection service (``grpc.reflection.v1``, then ``v1alpha``) for the file that declares
the service and everything it imports. The result is a ``FileDescriptorSet`` kept in the spec;
the method is looked up in it (unary only) and every request body is parsed as its input message,
so an unknown method, a proto that does not compile, JSON that does not fit the message or a
server without reflection is a :class:`~diagnoser.errors.ConfigError` before the first call.

:class:`GrpcSchema` is what a run builds from the spec: the method's request and response
classes, request bytes from JSON, response messages as JSON (protobuf's ``json_format``, field
names as written in the ``.proto``).
"""

from __future__ import annotations

import base64
import importlib.resources
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_reflection.v1alpha import reflection_pb2

from diagnoser.config import ProbeSettings
from diagnoser.errors import ConfigError, ProbeSafetyError
from diagnoser.probe.grpc_target import GrpcTarget, parse_grpc_target
from diagnoser.probe.open_loop import USER_AGENT
from diagnoser.probe.spec import ProbeSpec, address_refusal

__all__ = ["GrpcSchema", "compile_proto", "reflect_descriptors", "resolve_grpc_spec"]

_PROTOC_TIMEOUT_S = 60.0
_REFLECTION_TIMEOUT_S = 5.0
#: v1 first (grpc-go, grpc-java and others serve both); grpcio-reflection serves v1alpha only.
_REFLECTION_VERSIONS = ("v1", "v1alpha")


@dataclass(frozen=True)
class ReflectionLimits:
    """How much of a server's reflection is read before it is taken for a broken or hostile one.

    A service's definition and its imports are a few files (the googleapis annotations, the
    well-known types: a dozen or two, imported a handful of levels deep); a server that answers
    with an import chain that never ends, or thousands of files, is refused with one clear error
    instead of being followed for as long as it likes. ``seconds`` bounds the whole resolution
    (every request within it), and a run's deadline can shorten it.
    """

    max_files: int = 256
    max_depth: int = 32
    seconds: float = 15.0
    #: The files' serialized size in all.
    max_bytes: int = 16 * 1024 * 1024
    #: ``seconds`` is what was left of a run's deadline (the error says so).
    from_deadline: bool = False

    def within(self, seconds: float | None) -> ReflectionLimits:
        """These limits, with at most ``seconds`` (what is left of a run's deadline, ``None``: no
        deadline) for the whole resolution, and always :data:`MIN_REFLECTION_S`: a start-up that
        spent the deadline leaves the server a moment to answer, as the rules get one."""
        if seconds is None or seconds >= self.seconds:
            return self
        bounded = max(MIN_REFLECTION_S, seconds)
        return ReflectionLimits(self.max_files, self.max_depth, bounded, self.max_bytes, from_deadline=True)


#: The least time a resolution gets, however little of the deadline is left.
MIN_REFLECTION_S = 1.0


DEFAULT_REFLECTION_LIMITS = ReflectionLimits()


def compile_proto(proto: Path, import_paths: list[Path]) -> bytes:
    """``proto`` and its imports compiled to a serialized ``FileDescriptorSet``."""
    if not proto.is_file():
        raise ConfigError(f"--proto {proto}: no such file")
    well_known = Path(str(importlib.resources.files("grpc_tools") / "_proto"))
    source, paths = proto.resolve(), [p.resolve() for p in import_paths]
    # The file is named by the first include path that holds it, so the user's paths come first
    # (a file under one of them keeps its package-relative name for its imports); its own
    # directory is added only when none of them holds it.
    holds_it = any(source.is_relative_to(p) for p in paths)
    includes = [*paths, *([] if holds_it else [source.parent]), well_known]
    with tempfile.TemporaryDirectory(prefix="diagnoser-proto-") as directory:
        out = Path(directory) / "descriptors.pb"
        command = [
            sys.executable, "-m", "grpc_tools.protoc", *(f"-I{p}" for p in includes),
            "--include_imports", f"--descriptor_set_out={out}", str(source),
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"--proto {proto}: protoc did not run: {exc}") from exc
        if done.returncode != 0 or not out.exists():
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            raise ConfigError(f"--proto {proto}: does not compile: {lines[0] if lines else 'protoc failed'}")
        return out.read_bytes()


if TYPE_CHECKING:
    _Reflection = grpc.StreamStreamMultiCallable[
        reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse
    ]


def _reflection_request(stream: _Reflection, kind: str, name: str, timeout_s: float) -> Any:
    """One reflection request on its own stream: its one answer (``None`` if the stream ended without)."""
    request = reflection_pb2.ServerReflectionRequest()
    setattr(request, kind, name)
    responses = stream(iter([request]), timeout=timeout_s)
    return next(iter(responses), None)


def _too_slow(target: GrpcTarget, limits: ReflectionLimits) -> ConfigError:
    budget = f"{limits.seconds:g} s"
    if limits.from_deadline:
        budget = f"the {limits.seconds:.1f} s left of the run's deadline"
    return ConfigError(
        f"{target.authority}: server reflection took longer than {budget}; "
        "give the service's definition with --proto FILE"
    )


def _reflect_files(
    stream: _Reflection, target: GrpcTarget, limits: ReflectionLimits, deadline: float
) -> bytes:
    """The file declaring the service and every file it imports, as a ``FileDescriptorSet``.

    Within ``limits``: a chain of imports deeper than ``max_depth``, more than ``max_files``
    files or ``max_bytes``, or longer than ``seconds`` in all is a :class:`ConfigError`, as is an
    answer whose bytes are not a ``FileDescriptorProto``.
    """
    service = target.service
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    size = 0
    # (kind, name, depth): depth 0 is the service's own file, 1 what it imports, and so on.
    wanted: list[tuple[str, str, int]] = [("file_containing_symbol", service, 0)]
    asked: set[tuple[str, str]] = set()
    while wanted:
        kind, name, depth = wanted.pop(0)
        if (kind, name) in asked or (kind == "file_by_filename" and name in files):
            continue
        asked.add((kind, name))
        if depth > limits.max_depth:
            raise ConfigError(
                f"{target.authority}: server reflection: imports nested deeper than {limits.max_depth} "
                f"files (at {name}); give the service's definition with --proto FILE"
            )
        if len(asked) > limits.max_files:
            raise ConfigError(
                f"{target.authority}: server reflection: more than {limits.max_files} files to read; "
                "give the service's definition with --proto FILE"
            )
        left = deadline - time.monotonic()
        if left <= 0:
            raise _too_slow(target, limits)
        answer = _reflection_request(stream, kind, name, min(_REFLECTION_TIMEOUT_S, left))
        if answer is None:
            raise ConfigError(f"{target.authority}: server reflection closed the stream without an answer")
        if answer.HasField("error_response"):
            error = answer.error_response
            what = f"service {service}" if kind == "file_containing_symbol" else f"file {name}"
            raise ConfigError(
                f"the server's reflection does not know {what}: {error.error_message or error.error_code}"
            )
        for raw in answer.file_descriptor_response.file_descriptor_proto:
            size += len(raw)
            if size > limits.max_bytes or len(files) >= limits.max_files:
                raise ConfigError(
                    f"{target.authority}: server reflection answered more than {limits.max_files} files "
                    f"or {limits.max_bytes} bytes; give the service's definition with --proto FILE"
                )
            try:
                proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
            except DecodeError as exc:
                raise ConfigError(
                    f"{target.authority}: server reflection answered bytes that are not a file descriptor "
                    f"(asked for {name}): {exc}"
                ) from exc
            if proto.name not in files:
                files[proto.name] = proto
                wanted.extend(("file_by_filename", d, depth + 1) for d in proto.dependency)
    return descriptor_pb2.FileDescriptorSet(file=list(files.values())).SerializeToString()


def reflect_descriptors(
    channel: grpc.Channel, target: GrpcTarget, limits: ReflectionLimits = DEFAULT_REFLECTION_LIMITS
) -> bytes:
    """Ask the server's reflection (v1, then v1alpha) for the service's files, within ``limits``."""
    deadline = time.monotonic() + limits.seconds
    for version in _REFLECTION_VERSIONS:
        stream = cast(
            "_Reflection",
            channel.stream_stream(
                f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
            ),
        )
        try:
            return _reflect_files(stream, target, limits, deadline)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                continue
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() >= deadline - 0.1:
                raise _too_slow(target, limits) from exc  # the last request had only what was left
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "error"
            raise ConfigError(
                f"{target.authority}: server reflection failed ({name}: {details}); give --proto FILE"
            ) from exc
    raise ConfigError(
        f"{target.authority} does not offer server reflection (grpc.reflection.v1 or v1alpha): "
        "give the service's definition with --proto FILE"
    )


def _pool_from(serialized: bytes) -> descriptor_pool.DescriptorPool:
    """A descriptor pool holding every file of a ``FileDescriptorSet``, imports added first."""
    files = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(serialized).file}
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:
        if name in added or name not in files:
            return
        added.add(name)
        for dependency in files[name].dependency:
            add(dependency)
        pool.AddSerializedFile(files[name].SerializeToString())

    for name in files:
        add(name)
    return pool


def _find_method(pool: descriptor_pool.DescriptorPool, target: GrpcTarget) -> MethodDescriptor:
    try:
        service = pool.FindServiceByName(target.service)
    except KeyError:
        raise ConfigError(f"{target.path}: no service {target.service} in the definition") from None
    method = service.methods_by_name.get(target.method)
    if method is None:
        known = ", ".join(sorted(service.methods_by_name)) or "none"
        raise ConfigError(f"{target.path}: {target.service} has no method {target.method} (it has: {known})")
    if method.client_streaming or method.server_streaming:
        raise ConfigError(f"{target.path}: a streaming method; the probe calls unary methods only")
    return method


@dataclass(frozen=True)
class GrpcSchema:
    """The called method's message classes, built from a spec's resolved descriptors."""

    target: GrpcTarget
    request_class: type[Message]
    response_class: type[Message]

    @classmethod
    def of(cls, spec: ProbeSpec) -> GrpcSchema:
        if spec.grpc is None or spec.grpc.descriptor_set is None:
            raise ConfigError(
                f"probe {spec.name}: the gRPC message types are not resolved yet"
                " (diagnoser.probe.entry.resolve_target resolves them)"
            )
        target = parse_grpc_target(spec.target)
        try:
            pool = _pool_from(base64.b64decode(spec.grpc.descriptor_set))
        except (DecodeError, TypeError, ValueError, KeyError) as exc:  # protobuf's refusals of a bad set
            raise ConfigError(f"{target.authority}: the service's definition does not load: {exc}") from exc
        method = _find_method(pool, target)
        return cls(
            target=target,
            request_class=message_factory.GetMessageClass(method.input_type),
            response_class=message_factory.GetMessageClass(method.output_type),
        )

    def encode_request(self, body: bytes | None) -> bytes:
        """A request body (JSON, or none for an empty message) as the request's wire bytes."""
        message = self.request_class()
        if body is not None and body.strip():
            try:
                json_format.Parse(body, message)
            except json_format.ParseError as exc:
                name = self.request_class.DESCRIPTOR.full_name
                raise ConfigError(f"--data does not fit {name}: {str(exc).splitlines()[0]}") from exc
        return message.SerializeToString()

    def response_json(self, payload: bytes) -> dict[str, Any]:
        """A response's wire bytes as JSON; ``ValueError`` for bytes that are not that message."""
        try:
            message = self.response_class.FromString(payload)
        except DecodeError as exc:
            raise ValueError(f"not a {self.response_class.DESCRIPTOR.full_name}: {exc}") from exc
        return json_format.MessageToDict(message, preserving_proto_field_name=True)


def dial_address(target: GrpcTarget, settings: ProbeSettings, *, explicit_target: bool | None) -> str:
    """The address to connect to (``ipv4:a.b.c.d:port``), checked by the resolved-address rule.

    The probe connects to the address it checked, not to the name (which could resolve
    elsewhere the next time); the name stays the call's authority and the TLS server name.
    """
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"{target.authority}: the name does not resolve: {exc.strerror or exc}") from exc
    refusals: list[str] = []
    for family, *_rest, sockaddr in infos:
        address = str(sockaddr[0])
        if explicit_target is not None:
            reason = address_refusal(target.host, address, settings, explicit_target=explicit_target)
            if reason is not None:
                refusals.append(reason)
                continue
        if family == socket.AF_INET6:
            return f"ipv6:[{address}]:{target.port}"
        return f"ipv4:{address}:{target.port}"
    raise ProbeSafetyError(f"probe refused: {'; '.join(dict.fromkeys(refusals))}")


def channel_options(spec: ProbeSpec, target: GrpcTarget) -> list[tuple[str, Any]]:
    """Options of every channel the probe opens: its own connection, no retries, the body cap."""
    options: list[tuple[str, Any]] = [
        ("grpc.default_authority", target.authority),
        # Channels to one address share connections unless told not to: a pool of one.
        ("grpc.use_local_subchannel_pool", 1),
        # No retries, ever: a retry multiplies the load the probe puts on a struggling server.
        ("grpc.enable_retries", 0),
        ("grpc.max_receive_message_length", spec.expect.max_body_bytes),
        ("grpc.primary_user_agent", USER_AGENT),
    ]
    if target.tls:
        options.append(("grpc.ssl_target_name_override", target.host))
    return options


def channel_credentials(target: GrpcTarget, verify_tls: bool) -> grpc.ChannelCredentials | None:
    """``None`` for plaintext; the default roots; or, with ``verify_tls: false``, the certificate
    the server presents pinned as the only root (gRPC has no switch that accepts any certificate)."""
    if not target.tls:
        return None
    if verify_tls:
        return grpc.ssl_channel_credentials()
    import ssl

    try:
        pem = ssl.get_server_certificate((target.host, target.port), timeout=_REFLECTION_TIMEOUT_S)
    except OSError as exc:
        raise ConfigError(f"{target.authority}: cannot read its TLS certificate: {exc}") from exc
    return grpc.ssl_channel_credentials(root_certificates=pem.encode())


#: A target's resolved types are reused this long: the daemon's probe runs every minute or so and
#: resolves once, not at every run; a redeployed service's new types are read within it.
DESCRIPTOR_CACHE_S = 600.0


class _DescriptorCache:
    """Resolved ``FileDescriptorSet``s by target (and proto file, with its modification time)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], tuple[float, bytes]] = {}
        self._lock = threading.Lock()  # resolutions run in threads (the daemon's probe job)

    @staticmethod
    def key(spec: ProbeSpec) -> tuple[Any, ...]:
        assert spec.grpc is not None
        proto = spec.grpc.proto
        try:
            changed = proto.stat().st_mtime_ns if proto is not None else None
        except OSError:
            changed = None
        imports = tuple(str(p) for p in spec.grpc.import_paths)
        return (spec.target, spec.verify_tls, str(proto) if proto else None, changed, imports)

    def get(self, key: tuple[Any, ...]) -> bytes | None:
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry[0] > DESCRIPTOR_CACHE_S:
            return None
        return entry[1]

    def put(self, key: tuple[Any, ...], value: bytes) -> None:
        with self._lock:
            self._entries[key] = (time.monotonic(), value)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


DESCRIPTORS = _DescriptorCache()


def _descriptors(
    spec: ProbeSpec, target: GrpcTarget, settings: ProbeSettings, explicit: bool, limits: ReflectionLimits
) -> bytes:
    """The spec's descriptors: from the cache, else compiled or reflected (and then cached).

    A cached answer never skips the resolved-address rule: the target is checked each time."""
    assert spec.grpc is not None
    if spec.grpc.proto is None:
        dial_address(target, settings, explicit_target=explicit)  # ProbeSafetyError if refused
    key = DESCRIPTORS.key(spec)
    cached = DESCRIPTORS.get(key)
    if cached is not None:
        return cached
    found = _resolve_descriptors(spec, target, settings, explicit, limits)
    DESCRIPTORS.put(key, found)
    return found


def _resolve_descriptors(
    spec: ProbeSpec, target: GrpcTarget, settings: ProbeSettings, explicit: bool, limits: ReflectionLimits
) -> bytes:
    assert spec.grpc is not None
    if spec.grpc.proto is not None:
        return compile_proto(spec.grpc.proto, spec.grpc.import_paths)
    address = dial_address(target, settings, explicit_target=explicit)
    credentials = channel_credentials(target, spec.verify_tls)
    options = channel_options(spec, target)
    channel = (
        grpc.secure_channel(address, credentials, options)
        if credentials is not None
        else grpc.insecure_channel(address, options)
    )
    try:
        return reflect_descriptors(channel, target, limits)
    finally:
        channel.close()


def resolve_grpc_spec(
    spec: ProbeSpec,
    settings: ProbeSettings,
    *,
    explicit_target: bool,
    within_s: float | None = None,
    limits: ReflectionLimits = DEFAULT_REFLECTION_LIMITS,
) -> ProbeSpec:
    """``spec`` with its message types resolved and checked (a non-gRPC spec as it is).

    Compiles the proto or asks the server's reflection (after the resolved-address rule), within
    ``limits`` and at most ``within_s`` seconds (what is left of a run's deadline), or reuses
    what the same target resolved to in the last :data:`DESCRIPTOR_CACHE_S`; looks the method up
    and parses every request body as its input; raises ``ConfigError`` (or ``ProbeSafetyError``)
    before any probe call.
    """
    if spec.grpc is None:
        return spec
    target = parse_grpc_target(spec.target)
    options = spec.grpc
    if options.descriptor_set is None:
        found = _descriptors(spec, target, settings, explicit_target, limits.within(within_s))
        encoded = base64.b64encode(found).decode()
        options = options.model_copy(update={"descriptor_set": encoded})
        spec = spec.model_copy(update={"grpc": options})
    schema = GrpcSchema.of(spec)
    for body in spec.request_bodies():
        schema.encode_request(body)
    check_metadata(spec.headers)
    return spec


#: What gRPC accepts as a metadata key (lower case once sent; HTTP/2 header names).
_METADATA_KEY = re.compile(r"^[0-9A-Za-z_.-]+$")


def check_metadata(headers: dict[str, str]) -> None:
    """``ConfigError`` for metadata gRPC would refuse at every call: refused once, up front."""
    for key, value in headers.items():
        if not _METADATA_KEY.match(key) or key.lower().startswith("grpc-"):
            raise ConfigError(f"headers: {key!r} is not a metadata key gRPC allows (a-z, 0-9, '-', '_', '.')")
        if key.lower().endswith("-bin"):
            raise ConfigError(f"headers: {key!r} is binary metadata, which a probe file cannot carry")
        if not value.isascii() or not value.isprintable():
            raise ConfigError(f"headers: the value of {key!r} must be printable ASCII")
