"""Limits no configuration can lift, and addresses a name must not lead the probe to.

Through ``diagnose probe`` as a user runs it: environment variables and config files cannot
raise the rate, duration, timeout or connection caps past their documented ceilings; a probe
file cannot ask for more connections than the cap; an allowed *name* that resolves to a
loopback, link-local or cloud-metadata address is refused unless that address is allowed itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnoser.config import ProbeSettings
from tests.conftest import run_cli
from tests.probe.conftest import DelayServer


@pytest.mark.parametrize(
    ("variable", "value", "args", "expected"),
    [
        ("DIAGNOSER_PROBE__MAX_RATE", "2000", ["--rate", "1500", "--duration", "1"], "probe.max_rate"),
        ("DIAGNOSER_PROBE__MAX_DURATION_S", "1e11", ["--rate", "1", "--duration", "1e11"], "probe.max_duration_s"),
        ("DIAGNOSER_PROBE__REQUEST_TIMEOUT_S", "1e6", ["--rate", "1", "--duration", "1"], "probe.request_timeout_s"),
        ("DIAGNOSER_PROBE__MAX_CONNECTIONS", "20000", ["--rate", "1", "--duration", "1"], "probe.max_connections"),
    ],
)
def test_the_environment_cannot_raise_a_cap_past_its_ceiling(
    server: DelayServer, variable: str, value: str, args: list[str], expected: str
) -> None:
    result = run_cli("probe", f"{server.url}/delay", *args, env={variable: value})
    assert result.code == 2, result.stdout
    assert expected in result.stderr and "less than or equal to" in result.stderr
    assert server.stats()["count"] == 0


def test_a_probe_file_cannot_open_more_connections_than_the_cap(tmp_path: Path, server: DelayServer) -> None:
    probe_file = tmp_path / "many.yaml"
    probe_file.write_text(
        f"target: {server.url}/delay\nmax_connections: 20000\nschedule: {{rate: 10, duration_s: 0.5}}\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text("probe: {allowed_hosts: ['127.0.0.1']}\n")
    result = run_cli("probe", str(probe_file), "--config", str(config))
    assert result.code == 2
    assert "max_connections 20000 exceeds the cap of 1000" in result.stderr
    assert server.stats()["count"] == 0


def test_an_allowed_name_resolving_to_loopback_needs_the_address_allowed(tmp_path: Path, server: DelayServer) -> None:
    port = server.url.rsplit(":", 1)[1]
    probe_file = tmp_path / "by-name.yaml"
    probe_file.write_text(f"target: http://localhost:{port}/delay?ms=1\nschedule: {{rate: 10, duration_s: 0.3}}\n")
    name_only = tmp_path / "name-only.yaml"
    name_only.write_text("probe: {allowed_hosts: [localhost]}\n")
    refused = run_cli("probe", str(probe_file), "--config", str(name_only))
    assert refused.code == 2, refused.stdout
    assert "'localhost' resolves to" in refused.stderr and "a loopback address" in refused.stderr
    assert server.stats()["count"] == 0
    with_address = tmp_path / "with-address.yaml"
    with_address.write_text("probe: {allowed_hosts: [localhost, 127.0.0.1, '::1']}\n")
    allowed = run_cli("probe", str(probe_file), "--config", str(with_address), "--format", "json")
    assert allowed.code == 0, allowed.stderr
    assert json.loads(allowed.stdout)["sent"] == 3
    # A typed URL is the user's own choice: the address typed, or localhost, needs no entry.
    typed = run_cli("probe", f"http://localhost:{port}/delay?ms=1", "-r", "10", "-d", "0.2", "--format", "json")
    assert typed.code == 0, typed.stderr


@pytest.mark.parametrize(
    ("host", "address", "explicit", "allowed_hosts", "refused"),
    [
        ("metadata.internal", "169.254.169.254", False, ["metadata.internal"], "cloud metadata"),
        ("metadata.internal", "169.254.169.254", True, [], "cloud metadata"),  # typed, but a name
        ("169.254.169.254", "169.254.169.254", True, [], None),  # the address itself, typed
        ("svc.example", "fe80::1", False, ["svc.example"], "link-local"),
        ("svc.example", "::ffff:127.0.0.1", False, ["svc.example"], "loopback"),
        ("svc.example", "0.0.0.0", False, ["svc.example"], "unspecified"),
        ("svc.example", "10.0.0.7", False, ["svc.example"], None),
        ("svc.example", "127.0.0.1", False, ["svc.example", "127.0.0.1"], None),
        ("svc.example", "::1", False, ["svc.example", "[::1]"], None),
        ("169.254.169.254", "169.254.169.254", False, ["169.254.169.254"], None),  # named literally
        # A pattern never covers a special address, however broad: each needs its literal entry.
        ("svc.example", "127.0.0.1", False, ["svc.example", "127.0.0.*"], "loopback"),
        ("svc.example", "127.0.0.1", False, ["1*"], "loopback"),
        ("169.254.169.254", "169.254.169.254", False, ["*"], "cloud metadata"),
        ("metadata.internal", "169.254.169.254", False, ["*"], "cloud metadata"),
        ("svc.example", "fd00:ec2::254", False, ["*"], "cloud metadata"),
        ("svc.example", "fe80::1", False, ["fe80::*"], "link-local"),
        ("svc.example", "10.0.0.7", False, ["*"], None),  # an ordinary address: the pattern is enough
    ],
)
def test_the_resolved_address_rule(
    host: str, address: str, explicit: bool, allowed_hosts: list[str], refused: str | None
) -> None:
    from diagnoser.probe.spec import address_refusal

    reason = address_refusal(host, address, ProbeSettings(allowed_hosts=allowed_hosts), explicit_target=explicit)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and f"a {refused} address" in reason
