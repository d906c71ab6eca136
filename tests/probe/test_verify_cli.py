"""``diagnose verify`` as a user runs it: one confirm probe against the delay server, exit 0 or 1.

A route that answers in a millisecond holds an SLO of a second whatever else the machine runs; a
route that answers after 400 ms can never hold 100 ms (the server's delay is a floor, not a
measurement): neither verdict depends on this machine's speed. A rate over ``probe.max_rate`` and
a probe file's host outside ``probe.allowed_hosts`` are refused (exit 2) before any request.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from tests.probe.conftest import DelayServer


def _config(tmp_path: Path, **probe: object) -> Path:
    lines = ["probe:"] + [f"  {key}: {json.dumps(value)}" for key, value in probe.items()]
    path = tmp_path / "diagnoser.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _probe_file(tmp_path: Path, target: str) -> Path:
    path = tmp_path / "checkout.yaml"
    path.write_text(
        f"target: {target}\nservice: checkout\nnamespace: shop\nschedule: {{rate: 1, duration_s: 1}}\n",
        encoding="utf-8",
    )
    return path


def test_a_fast_target_is_confirmed_and_exits_0(server: DelayServer, tmp_path: Path) -> None:
    # A probe file (its host listed): the file's request, sent at --rate for --duration.
    probe = _probe_file(tmp_path, f"{server.url}/delay?ms=1")
    config = _config(tmp_path, allowed_hosts=["127.0.0.1"])
    result = run_cli(
        "verify", str(probe), "--config", str(config), "--rate", "20", "--duration", "1",
        "--slo-p99-ms", "1000", "--before-p99-ms", "2400", "--format", "json",
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert found["confirmed"] is True and found["failed_on"] is None
    assert (found["rate"], found["requested_rate"], found["capped_by"]) == (20.0, 20.0, None)
    assert found["sent"] == 20 and found["probe"]["sent"] == 20
    assert found["text"].startswith("p99 at 20 req/s: 2.4 s -> ") and found["text"].endswith(", confirmed")
    assert server.stats()["count"] == 20


def test_a_slow_target_is_not_confirmed_and_exits_1(server: DelayServer) -> None:
    result = run_cli(
        "verify", f"{server.url}/delay?ms=400", "--rate", "10", "--duration", "1", "--slo-p99-ms", "100",
        "--before-p99-ms", "1900",
    )  # fmt: skip
    assert result.code == 1, result.stdout + result.stderr
    line = result.stdout.splitlines()[0]
    assert line.startswith("not confirmed: p99 still ") and line.endswith(" at 10 req/s (SLO 100 ms; 1.9 s before)"), line
    assert "10 requests over" in result.stdout


def test_a_rate_over_the_cap_and_a_host_not_allowed_are_refused_before_any_request(
    server: DelayServer, tmp_path: Path
) -> None:
    config = _config(tmp_path, max_rate=50, allowed_hosts=["127.0.0.1"])
    over = run_cli("verify", f"{server.url}/delay?ms=1", "--config", str(config), "--rate", "80",
                   "--duration", "1", "--slo-p99-ms", "300")  # fmt: skip
    assert over.code == 2, over.stdout + over.stderr
    said = " ".join(over.stderr.split())
    assert "rate 80 req/s exceeds the cap of 50 req/s (probe.max_rate" in said, said
    # The same server under a name that is not listed: nobody typed the probe file's target.
    port = server.url.rsplit(":", 1)[1]
    probe = _probe_file(tmp_path, f"http://localhost:{port}/delay?ms=1")
    refused = run_cli("verify", str(probe), "--config", str(config), "--rate", "5", "--duration", "1",
                      "--slo-p99-ms", "300")  # fmt: skip
    assert refused.code == 2, refused.stdout + refused.stderr
    assert "host 'localhost' is not in probe.allowed_hosts" in " ".join(refused.stderr.split())
    bad = run_cli("verify", f"{server.url}/delay?ms=1", "--rate", "0", "--slo-p99-ms", "300")
    assert bad.code == 2 and "--rate must be positive" in bad.stderr
    assert server.stats()["count"] == 0
