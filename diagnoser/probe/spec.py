"""Probe definitions: what to send, on which schedule, what a good answer is, and the safety checks.

A definition lives in ``probes/<name>.yaml``::

    target: http://127.0.0.1:8080/v1/features?user=42
    method: GET
    headers: {Accept: application/json}
    schedule: {kind: constant, rate: 50, duration_s: 30, arrivals: poisson}
    expect:
      status: [200]
      json_path: $.features          # must exist and be non-empty
    timeout_s: 2

or is built from a URL typed on the command line with :func:`spec_from_url`. Every model
forbids unknown keys, so a typo is an error naming its field rather than a silently ignored
setting. :func:`enforce_safety` refuses a spec that exceeds the configured caps or, for a
probe file, targets a host outside the allowlist, before any request is sent.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import math
import socket
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from diagnoser.config import (
    PROBE_MAX_CONNECTIONS_CEILING,
    PROBE_REQUEST_TIMEOUT_CEILING_S,
    ProbeSettings,
)
from diagnoser.config.addresses import METADATA_ADDRESSES, listed_literally, special_kind
from diagnoser.errors import ConfigError, ProbeSafetyError
from diagnoser.probe.caps import LoadCaps, effective_caps, probe_caps
from diagnoser.probe.grpc_target import GRPC_SCHEMES, GrpcOptions, grpc_options_for, grpc_paths_beside
from diagnoser.yamlfile import read_yaml

__all__ = [
    "METADATA_ADDRESSES",
    "ConstantSchedule",
    "Expectations",
    "ProbeSpec",
    "RampSchedule",
    "Schedule",
    "Segment",
    "StepsSchedule",
    "address_refusal",
    "check_resolved_addresses",
    "effective_caps",
    "enforce_safety",
    "load_probe_file",
    "spec_from_url",
    "with_bodies_inline",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Segment(_Strict):
    """A stretch of the schedule whose rate moves linearly from ``start_rate`` to ``end_rate``."""

    start_rate: float = Field(ge=0)
    end_rate: float = Field(ge=0)
    duration_s: float = Field(gt=0)

    @property
    def expected_requests(self) -> float:
        return (self.start_rate + self.end_rate) / 2 * self.duration_s


class ConstantSchedule(_Strict):
    """``rate`` requests per second for ``duration_s`` seconds."""

    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0)
    duration_s: float = Field(gt=0)
    #: ``uniform`` spaces requests evenly; ``poisson`` draws exponential gaps (independent users).
    arrivals: Literal["uniform", "poisson"] = "uniform"

    def segments(self) -> list[Segment]:
        return [Segment(start_rate=self.rate, end_rate=self.rate, duration_s=self.duration_s)]


class Step(_Strict):
    rate: float = Field(ge=0)
    duration_s: float = Field(gt=0)


class StepsSchedule(_Strict):
    """A staircase: each step holds its rate for its duration."""

    kind: Literal["steps"]
    steps: list[Step] = Field(min_length=1)
    arrivals: Literal["uniform", "poisson"] = "uniform"

    def segments(self) -> list[Segment]:
        return [Segment(start_rate=s.rate, end_rate=s.rate, duration_s=s.duration_s) for s in self.steps]


class RampSchedule(_Strict):
    """Rate grows linearly from ``from_rate`` to ``to_rate`` over ``ramp_s``, then holds ``to_rate``."""

    kind: Literal["ramp"]
    from_rate: float = Field(default=1.0, ge=0)
    to_rate: float = Field(gt=0)
    ramp_s: float = Field(gt=0)
    #: Seconds to hold ``to_rate`` after the ramp.
    hold_s: float = Field(default=0.0, ge=0)
    arrivals: Literal["uniform", "poisson"] = "uniform"

    def segments(self) -> list[Segment]:
        segments = [Segment(start_rate=self.from_rate, end_rate=self.to_rate, duration_s=self.ramp_s)]
        if self.hold_s > 0:
            segments.append(Segment(start_rate=self.to_rate, end_rate=self.to_rate, duration_s=self.hold_s))
        return segments


Schedule = Annotated[ConstantSchedule | StepsSchedule | RampSchedule, Field(discriminator="kind")]


class Expectations(_Strict):
    """What a good answer looks like; each failed expectation is counted under its own kind."""

    #: Accepted status codes; ``None`` accepts any 2xx. A 503 is a failure unless listed.
    status: list[int] | None = None
    #: A 2xx with zero body bytes is a failure (turn off for 204/HEAD endpoints).
    non_empty_body: bool = True
    #: A JSON body without any value in it (``{}``, ``[]``, ``{"features": {}}``) is a failure.
    non_empty_json: bool = True
    #: A JSON path (``$.features``, ``$.items[0].id``) that must exist and be non-empty.
    json_path: str | None = None
    #: Bodies larger than this are a failure (and are not read further).
    max_body_bytes: int = Field(default=10 * 1024 * 1024, gt=0)

    @field_validator("json_path")
    @classmethod
    def _json_path_syntax(cls, value: str | None) -> str | None:
        if value is not None:
            from diagnoser.probe.validate import parse_json_path

            parse_json_path(value)
        return value


class ProbeSpec(_Strict):
    """One probe: target, request, schedule, expectations and per-probe limits."""

    name: str = "probe"
    target: str
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] = "GET"
    headers: dict[str, str] = Field(default_factory=dict)
    #: One body, or several sent in rotation. ``body_file`` reads one from disk.
    body: str | None = None
    bodies: list[str] | None = None
    body_file: Path | None = None
    schedule: Schedule
    expect: Expectations = Field(default_factory=Expectations)
    #: Per-request timeout; a request still running then counts as ``timeout``. No retries, ever.
    timeout_s: float | None = Field(default=None, gt=0)
    #: Connection pool size; default: enough for the peak rate at the timeout (Little's law).
    max_connections: int | None = Field(default=None, ge=1)
    verify_tls: bool = True
    #: Error ratio over ``abort_window_s`` that stops the run; defaults come from the config.
    abort_error_ratio: float | None = Field(default=None, gt=0, le=1)
    abort_window_s: float | None = Field(default=None, gt=0)
    #: Seed for Poisson arrivals, so a run can be repeated exactly.
    seed: int | None = None
    #: A ``grpc(s)://`` target's message types and channels; the body is the request as JSON.
    grpc: GrpcOptions | None = None
    #: The service the target is served by (and its namespace), as incidents name it: a
    #: ``diagnose capacity`` run of this file is recorded as that service's capacity.
    service: str | None = None
    namespace: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _constant_by_default(cls, data: Any) -> Any:
        # ``schedule: {rate: 10, duration_s: 30}`` is the common case: no ``kind`` needed for it.
        if (
            isinstance(data, dict)
            and isinstance(data.get("schedule"), dict)
            and "kind" not in data["schedule"]
        ):
            data = {**data, "schedule": {"kind": "constant", **data["schedule"]}}
        return data

    @field_validator("target")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018  (ValueError for a port that is not one)
        except ValueError as exc:
            raise ValueError(f"target {value!r} is not a URL: {exc}") from None
        if parts.scheme not in ("http", "https", *GRPC_SCHEMES) or not parts.hostname:
            raise ValueError(
                f"target must be an http:// or https:// URL with a host (or grpc://, grpcs://), got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _grpc_options_for_grpc_targets(self) -> ProbeSpec:
        self.grpc = grpc_options_for(self.target, self.grpc)
        return self

    @property
    def is_grpc(self) -> bool:
        return urlsplit(self.target).scheme in GRPC_SCHEMES

    @model_validator(mode="after")
    def _one_body_source(self) -> ProbeSpec:
        given = [n for n in ("body", "bodies", "body_file") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give only one of body, bodies, body_file (got {', '.join(given)})")
        if self.bodies is not None and not self.bodies:
            raise ValueError("bodies must list at least one body")
        return self

    @property
    def host(self) -> str:
        return urlsplit(self.target).hostname or ""

    @property
    def peak_rate(self) -> float:
        return max(max(s.start_rate, s.end_rate) for s in self.schedule.segments())

    @property
    def duration_s(self) -> float:
        return sum(s.duration_s for s in self.schedule.segments())

    @property
    def mean_rate(self) -> float:
        return sum(s.expected_requests for s in self.schedule.segments()) / self.duration_s

    def request_bodies(self, base_dir: Path | None = None) -> list[bytes | None]:
        """The bodies to rotate through (``[None]`` when the request has no body)."""
        if self.bodies is not None:
            return [b.encode() for b in self.bodies]
        if self.body is not None:
            return [self.body.encode()]
        if self.body_file is not None:
            path = (
                self.body_file
                if self.body_file.is_absolute() or base_dir is None
                else base_dir / self.body_file
            )
            try:
                return [path.read_bytes()]
            except OSError as exc:
                raise ConfigError(
                    f"probe {self.name}: cannot read body_file {path}: {exc.strerror or exc}"
                ) from exc
        return [None]


def _describe(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
    )


def with_bodies_inline(spec: ProbeSpec) -> ProbeSpec:
    """``spec`` with its ``body_file`` read into ``body``, as it is sent to workers (who read no file).

    Raises :class:`ConfigError` for a file that cannot be read or is not UTF-8 text."""
    if spec.body_file is None:
        return spec
    (content,) = spec.request_bodies()
    try:
        text = (content or b"").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"probe {spec.name}: body_file {spec.body_file} is not UTF-8 text, and workers are sent the body "
            "itself: run it in one process (--workers 1)"
        ) from exc
    return spec.model_copy(update={"body": text, "body_file": None})


def load_probe_file(path: Path) -> ProbeSpec:
    """Read and validate ``probes/<name>.yaml``; raises :class:`ConfigError` naming file and fields."""
    data = read_yaml(path, "probe file")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a probe file must be a mapping, got {type(data).__name__}")
    data.setdefault("name", path.stem)
    if isinstance(data.get("body_file"), str) and not Path(data["body_file"]).is_absolute():
        data["body_file"] = str(path.parent / data["body_file"])
    if isinstance(data.get("grpc"), dict):
        data["grpc"] = grpc_paths_beside(data["grpc"], path.parent)
    try:
        return ProbeSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid probe: {_describe(exc)}") from exc


def spec_from_url(
    url: str, *, rate: float, duration_s: float, ramp_s: float | None = None, method: str = "GET"
) -> ProbeSpec:
    """A probe for a URL typed on the command line: constant ``rate``, or a ramp up to it first."""
    schedule: dict[str, object]
    if ramp_s is not None and ramp_s > 0:
        if ramp_s > duration_s:
            raise ConfigError(f"--ramp ({ramp_s:g} s) must not exceed --duration ({duration_s:g} s)")
        schedule = {
            "kind": "ramp",
            "from_rate": min(1.0, rate),
            "to_rate": rate,
            "ramp_s": ramp_s,
            "hold_s": duration_s - ramp_s,
        }
    else:
        schedule = {"kind": "constant", "rate": rate, "duration_s": duration_s}
    try:
        return ProbeSpec.model_validate(
            {"name": "cli", "target": url, "method": method, "schedule": schedule}
        )
    except ValidationError as exc:
        raise ConfigError(f"invalid probe: {_describe(exc)}") from exc


def host_allowed(host: str, allowed: list[str]) -> bool:
    """Exact host names, or shell patterns such as ``*.staging.example.com``."""
    host = host.lower()
    return any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in allowed)


def enforce_safety(
    spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool, caps: LoadCaps | None = None
) -> None:
    """Refuse (``ProbeSafetyError``) a spec over the caps, or a file's host outside the allowlist.

    ``explicit_target`` is true for a URL the user typed on the command line: that is their
    explicit intent and needs no allowlist entry. The caps apply to everyone; only the config
    (``probe.max_rate``, ``probe.max_duration_s``) raises them. ``caps`` replaces the probe's rate
    and duration caps with a load test's (:func:`~diagnoser.probe.caps.capacity_caps`).
    """
    problems: list[str] = []
    _, _, max_timeout, max_connections = effective_caps(settings)
    load = caps if caps is not None else probe_caps(settings)
    if spec.peak_rate > load.max_rate:
        problems.append(
            f"rate {spec.peak_rate:g} req/s exceeds the cap of {load.max_rate:g} req/s "
            f"({load.rate_setting}, at most {load.rate_ceiling:g})"
        )
    if spec.duration_s > load.max_duration_s:
        problems.append(
            f"duration {spec.duration_s:g} s exceeds the cap of {load.max_duration_s:g} s "
            f"({load.duration_setting}, at most {load.duration_ceiling:g})"
        )
    timeout = spec.timeout_s if spec.timeout_s is not None else max_timeout
    if timeout > max_timeout and not math.isclose(timeout, max_timeout):
        problems.append(
            f"timeout {timeout:g} s exceeds probe.request_timeout_s ({max_timeout:g} s,"
            f" at most {PROBE_REQUEST_TIMEOUT_CEILING_S:g})"
        )
    if spec.max_connections is not None and spec.max_connections > max_connections:
        problems.append(
            f"max_connections {spec.max_connections} exceeds the cap of {max_connections}"
            f" (probe.max_connections, at most {PROBE_MAX_CONNECTIONS_CEILING})"
        )
    if not explicit_target and not host_allowed(spec.host, settings.allowed_hosts):
        allowed = ", ".join(settings.allowed_hosts) or "none configured"
        problems.append(
            f"host {spec.host!r} is not in probe.allowed_hosts ({allowed}); "
            "add it to the config, or type the URL on the command line"
        )
    if problems:
        raise ProbeSafetyError(f"probe {spec.name} refused: " + "; ".join(problems))


def address_refusal(host: str, address: str, settings: ProbeSettings, *, explicit_target: bool) -> str | None:
    """Why ``host`` may not be probed at ``address`` (one it resolved to), or ``None`` if it may.

    Loopback, link-local (cloud metadata among them) and unspecified addresses need explicit
    permission: the address typed as the URL's host on the command line (or ``localhost`` for
    loopback), or the address itself written as an ``allowed_hosts`` entry (``127.0.0.1``,
    ``::1`` or ``[::1]``). A pattern never counts: ``*``, ``1*`` or ``127.0.0.*`` were written
    for ordinary hosts, and letting them reach the metadata endpoint would turn this check off
    for anyone who allowed everything. An allowed *name* does not carry its DNS answer with it
    either: a name that resolves to such an address is refused, whatever the allowlist says
    about the name.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    kind = special_kind(ip)
    if kind is None:
        return None
    host = host.strip("[]").lower()
    typed_literally = host == address.lower() or (host == "localhost" and kind == "loopback")
    if explicit_target and typed_literally:
        return None
    if listed_literally(ip, settings.allowed_hosts):
        return None
    return (
        f"{host!r} resolves to {ip}, a {kind} address: add {ip} itself to probe.allowed_hosts"
        " (a pattern does not cover it), or type that address as the URL on the command line"
    )


async def check_resolved_addresses(
    spec: ProbeSpec, settings: ProbeSettings, *, explicit_target: bool
) -> None:
    """Refuse (``ProbeSafetyError``) a target whose name resolves to an address it may not use.

    The transport applies the same rule at each connection (a name can resolve differently
    later); this check refuses the run up front with a clear message. A name that does not
    resolve is left to the run, which reports it as a connect error.
    """
    host = spec.host.strip("[]")
    try:
        addresses = [ipaddress.ip_address(host).compressed]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            return
        addresses = sorted({str(info[4][0]) for info in infos})
    problems = [
        reason
        for address in addresses
        if (reason := address_refusal(host, address, settings, explicit_target=explicit_target))
    ]
    if problems:
        raise ProbeSafetyError(f"probe {spec.name} refused: " + "; ".join(problems))
