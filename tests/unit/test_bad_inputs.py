"""Every bad input to every command: one ``error:`` line on stderr, exit 2, nothing done.

A table of inputs a user gets wrong (files that are not UTF-8, YAML or the right shape, URLs
without a scheme or with a broken host, NaN and infinite numbers, out-of-range durations and
instants, unknown levels and formats, a port already taken, a state file that is not one, a
mistyped path that must not be created, PromQL that does not parse), each run as its own
``diagnose`` process (:mod:`tests.fixtures.cli_forks`: forked from one warm interpreter, the real
entry point, streams and exit status). Nothing here may reach a network beyond 127.0.0.1: the
URLs name a port nothing listens on, or are refused before use.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli, shared_bed

#: One worker builds the outcomes (a driver forking a child per case), not every worker that
#: picks a case.
pytestmark = shared_bed(__name__)

DRIVER = REPO / "tests" / "fixtures" / "cli_forks.py"


@dataclass(frozen=True)
class Case:
    """One bad invocation and a phrase its one error line must contain."""

    id: str
    args: tuple[str, ...]
    says: str
    env: dict[str, str] = field(default_factory=dict)
    #: A bad rule file is reported and the good ones still load (``rules list`` then exits 1).
    code: int = 2
    prefix: str = "error: "


PROM = "http://127.0.0.1:{refused}"
URL = "http://127.0.0.1:{refused}/"
TOKEN = {"DIAGNOSER_WORKER_TOKEN": "0123456789abcdef0123456789abcdef"}
CAP = ("capacity", URL, "--slo-p99-ms", "50")
NOW = ("now", "--prometheus-url", PROM)
SERVE = ("serve", "--prometheus-url", PROM, "--state", "{tmp}/state.sqlite3", "--listen", "127.0.0.1:0")

CASES = [
    # -- files: config, probe, rule tests --------------------------------------------------------
    Case("config-not-utf8", ("now", "--config", "{tmp}/latin1.yaml"), "not UTF-8"),
    Case("config-yaml-broken", ("now", "--config", "{tmp}/broken.yaml"), "not valid YAML"),
    Case("config-a-list", ("now", "--config", "{tmp}/list.yaml"), "must be a mapping"),
    Case("config-unknown-key", ("now", "--config", "{tmp}/typo.yaml"), "did you mean prometheus"),
    Case("config-a-directory", ("now", "--config", "{tmp}"), "cannot read config"),
    Case("config-bad-rename", (*NOW, "--config", "{tmp}/bad-rename.yaml"), "metrics.redis_connected_clients"),
    Case("config-bad-signal", (*NOW, "--config", "{tmp}/bad-signal.yaml"), "signals.queue_length"),
    Case("config-window", (*NOW, "--config", "{tmp}/window.yaml"), "window"),
    Case("probe-file-not-utf8", ("probe", "{tmp}/latin1-probe.yaml"), "not UTF-8"),
    Case("probe-file-yaml-broken", ("probe", "{tmp}/broken.yaml"), "not valid YAML"),
    Case("probe-file-a-list", ("probe", "{tmp}/list.yaml"), "must be a mapping"),
    Case("probe-file-unknown-key", ("probe", "{tmp}/probe-typo.yaml"), "rat"),
    Case("signal-file-not-utf8", (*NOW, "--config", "{tmp}/latin1-signals.yaml"), "not UTF-8"),
    Case(
        "rule-file-not-utf8",
        ("rules", "list", "--rules", "{tmp}/latin1-rules", "--format", "json"),
        "not UTF-8",
        code=1,
        prefix="rule error: ",
    ),
    Case("now-probe-file-not-utf8", (*NOW, "--probe", "{tmp}/latin1-probe.yaml"), "not UTF-8"),
    Case("rules-test-not-utf8", ("rules", "test", "{tmp}/latin1.yaml"), "not UTF-8"),
    Case("rules-test-yaml-broken", ("rules", "test", "{tmp}/broken.yaml"), "not valid YAML"),
    Case("rules-test-missing", ("rules", "test", "{tmp}/nowhere.yaml"), "nowhere.yaml"),
    # -- the environment --------------------------------------------------------------------------
    Case(
        "env-headers-not-json",
        NOW,
        "DIAGNOSER_PROMETHEUS__HEADERS",
        {"DIAGNOSER_PROMETHEUS__HEADERS": "X-Scope-OrgID: team"},
    ),
    Case("env-deadline-not-number", NOW, "deadline_s", {"DIAGNOSER_DEADLINE_S": "soon"}),
    Case("env-slo-nan", NOW, "slo.p99_ms", {"DIAGNOSER_SLO__P99_MS": "nan"}),
    # -- URLs -------------------------------------------------------------------------------------
    Case("prometheus-ipv6-broken", ("now", "--prometheus-url", "http://[::1:9090"), "prometheus.url"),
    Case("prometheus-no-scheme", ("now", "--prometheus-url", "127.0.0.1:9090"), "http:// or https://"),
    Case("prometheus-ftp", ("now", "--prometheus-url", "ftp://127.0.0.1/"), "http:// or https://"),
    Case("prometheus-no-host", ("now", "--prometheus-url", "http://"), "no host"),
    Case(
        "prometheus-port-out-of-range", ("now", "--prometheus-url", "http://127.0.0.1:99999"), "out of range"
    ),
    Case("prometheus-space", ("now", "--prometheus-url", "http://prom etheus:9090"), "prometheus.url"),
    Case("elasticsearch-no-scheme", ("now", "--elasticsearch-url", "es:9200"), "elasticsearch.urls"),
    Case("signals-ftp", ("signals", "--prometheus-url", "ftp://127.0.0.1/"), "http:// or https://"),
    Case("signals-ipv6-broken", ("signals", "--prometheus-url", "http://[::1"), "prometheus.url"),
    Case("capacity-prometheus-ftp", (*CAP, "--prometheus-url", "ftp://x/"), "http:// or https://"),
    Case("lint-prometheus-no-scheme", ("rules", "lint", "--prometheus-url", "localhost:9090"), "http://"),
    Case("serve-prometheus-no-scheme", ("serve", "--prometheus-url", "prometheus:9090"), "http://"),
    Case("probe-target-ftp", ("probe", "ftp://127.0.0.1/"), "http(s)://"),
    Case("probe-target-no-host", ("probe", "http:///path"), "host"),
    Case("probe-target-ipv6-broken", ("probe", "http://[::1/"), "http://[::1/"),
    Case("probe-grpc-no-method", ("probe", "grpc://127.0.0.1:{refused}"), "grpc://"),
    Case("now-probe-ftp", (*NOW, "--probe", "ftp://127.0.0.1/"), "http(s)://"),
    # -- instants ---------------------------------------------------------------------------------
    Case("at-overflow", (*NOW, "--at", "-99999999999999h"), "--at"),
    Case("at-huge-unix", (*NOW, "--at", "1e300"), "--at"),
    Case("at-nan", (*NOW, "--at", "nan"), "--at"),
    Case("at-garbage", (*NOW, "--at", "yesterday"), "--at"),
    Case("at-no-zone", (*NOW, "--at", "2026-01-01T00:00:00"), "no time zone"),
    Case("at-future", (*NOW, "--at", "+1h"), "future"),
    Case("signals-at-overflow", ("signals", "--prometheus-url", PROM, "--at", "-99999999999999h"), "--at"),
    # -- numbers ----------------------------------------------------------------------------------
    Case("now-deadline-zero", (*NOW, "--deadline", "0"), "deadline"),
    Case("now-deadline-nan", (*NOW, "--deadline", "nan"), "--deadline"),
    Case("now-deadline-inf", (*NOW, "--deadline", "inf"), "--deadline"),
    Case("now-slo-p99-nan", (*NOW, "--slo-p99-ms", "nan"), "--slo-p99-ms"),
    Case("now-slo-p99-negative", (*NOW, "--slo-p99-ms", "-5"), "slo.p99_ms"),
    Case("now-error-ratio-over-one", (*NOW, "--slo-error-ratio", "2"), "slo.error_ratio"),
    Case("now-probe-rate-nan", (*NOW, "--probe", URL, "--probe-rate", "nan"), "--probe-rate"),
    Case("now-probe-rate-zero", (*NOW, "--probe", URL, "--probe-rate", "0"), "rate"),
    Case("now-probe-duration-huge", (*NOW, "--probe", URL, "--probe-duration", "1e9"), "duration"),
    Case("now-probe-rate-word", (*NOW, "--probe-rate", "fast"), "--probe-rate"),
    Case("probe-rate-nan", ("probe", URL, "--rate", "nan"), "--rate"),
    Case("probe-rate-inf", ("probe", URL, "--rate", "inf"), "--rate"),
    Case("probe-rate-negative", ("probe", URL, "--rate", "-1"), "rate"),
    Case("probe-duration-nan", ("probe", URL, "--duration", "nan"), "--duration"),
    Case("probe-duration-zero", ("probe", URL, "--duration", "0"), "duration"),
    Case("probe-ramp-nan", ("probe", URL, "--ramp", "nan"), "--ramp"),
    Case("probe-ramp-over-duration", ("probe", URL, "--ramp", "20", "--duration", "5"), "--ramp"),
    Case("probe-workers-zero", ("probe", URL, "--workers", "0"), "--workers"),
    Case("capacity-max-rate-nan", (*CAP, "--max-rate", "nan"), "--max-rate"),
    Case("capacity-steps-nan", (*CAP, "--steps", "nan"), "--steps"),
    Case("capacity-steps-inf", (*CAP, "--steps", "100,inf"), "--steps"),
    Case("capacity-steps-words", (*CAP, "--steps", "a,b"), "--steps"),
    Case("capacity-steps-decreasing", (*CAP, "--steps", "300,200"), "--steps"),
    Case("capacity-warmup-nan", (*CAP, "--warmup-s", "nan"), "--warmup-s"),
    Case("capacity-warmup-negative", (*CAP, "--warmup-s", "-1"), "--warmup-s"),
    Case("capacity-pause-huge", (*CAP, "--pause-s", "1e9"), "--pause-s"),
    Case("capacity-pause-nan", (*CAP, "--pause-s", "nan"), "--pause-s"),
    Case("capacity-step-nan", (*CAP, "--step-s", "nan"), "--step-s"),
    Case("capacity-step-zero", (*CAP, "--step-s", "0"), "--step-s"),
    Case("capacity-slo-nan", ("capacity", URL, "--slo-p99-ms", "nan"), "--slo-p99-ms"),
    Case("capacity-slo-negative", ("capacity", URL, "--slo-p99-ms", "-50"), "slo.p99_ms"),
    Case("capacity-error-ratio-over-one", (*CAP, "--slo-error-ratio", "2"), "slo.error_ratio"),
    Case("capacity-growth-nan", (*CAP, "--growth", "nan"), "--growth"),
    Case("capacity-precision-nan", (*CAP, "--precision", "nan"), "--precision"),
    Case("capacity-expect-rps-nan", (*CAP, "--expect-rps", "nan"), "--expect-rps"),
    Case("capacity-start-rate-negative", (*CAP, "--start-rate", "-5"), "--start-rate"),
    Case("capacity-max-steps-zero", (*CAP, "--max-steps", "0"), "--max-steps"),
    # -- choices and formats ----------------------------------------------------------------------
    Case("serve-log-level-loud", (*SERVE, "--log-level", "LOUD"), "--log-level"),
    Case("serve-receiver-type", (*SERVE, "--config", "{tmp}/receiver.yaml"), "type 'pagerdooty' is not one of"),
    Case("serve-receiver-no-channel", (*SERVE, "--config", "{tmp}/receiver-channel.yaml"), "(oncall)"),
    Case("serve-log-format-xml", (*SERVE, "--log-format", "xml"), "--log-format"),
    Case("now-format-xml", (*NOW, "--format", "xml"), "--format"),
    Case("now-severity-loud", (*NOW, "--severity", "loud"), "severity"),
    Case("now-cause-unknown", (*NOW, "--cause", "gremlins"), "gremlins"),
    Case("probe-format-markdown", ("probe", URL, "--format", "markdown"), "--format"),
    Case(
        "signals-format-markdown", ("signals", "--prometheus-url", PROM, "--format", "markdown"), "--format"
    ),
    Case("now-unknown-flag", (*NOW, "--prometheus", PROM), "--prometheus"),
    Case(
        "probe-metadata-no-colon",
        ("probe", "grpc://127.0.0.1:{refused}/p.S/M", "-H", "novalue"),
        "--metadata",
    ),
    Case("now-data-without-probe", (*NOW, "--data", "{{}}"), "--probe grpc://"),
    # -- paths ------------------------------------------------------------------------------------
    Case("now-rules-missing", (*NOW, "--rules", "{tmp}/nowhere"), "does not exist"),
    Case("now-kubeconfig-missing", ("now", "--kubeconfig", "{tmp}/nowhere"), "does not exist"),
    Case("now-kubeconfig-garbage", ("now", "--kubeconfig", "{tmp}/list.yaml"), "kubeconfig"),
    Case("now-slowlog-missing", ("now", "--slowlog", "{tmp}/nowhere.log"), "does not exist"),
    Case("now-probe-missing", (*NOW, "--probe", "{tmp}/nowhere.yaml"), "nowhere.yaml"),
    Case(
        "probe-data-missing",
        ("probe", "grpc://127.0.0.1:{refused}/p.S/M", "--data", "@{tmp}/none.json"),
        "none.json",
    ),
    Case("capacity-plot-extension", (*CAP, "--plot", "{tmp}/knee.txt"), "--plot"),
    Case("capacity-plot-missing-dir", (*CAP, "--plot", "{tmp}/nowhere/knee.svg"), "--plot"),
    Case(
        "capacity-render-job-missing-dir",
        (
            *CAP,
            "--on-cluster",
            "1",
            "--advertise",
            "10.0.0.5:7070",
            "--listen",
            "127.0.0.1:0",
            "--render-job",
            "{tmp}/nowhere/job.yaml",
        ),
        "--render-job",
    ),
    Case(
        "serve-replay-state-mistyped",
        ("serve", "--replay-dead-letters", "--state", "{tmp}/stat.sqlite3"),
        "stat.sqlite3",
    ),
    # -- listening --------------------------------------------------------------------------------
    Case(
        "serve-listen-busy",
        ("serve", "--prometheus-url", PROM, "--state", "{tmp}/s2.sqlite3", "--listen", "127.0.0.1:{busy}"),
        "in use",
    ),
    Case("serve-listen-not-address", (*SERVE[:-1], "nohost"), "host:port"),
    Case("serve-listen-port-out-of-range", (*SERVE[:-1], "127.0.0.1:99999"), "port"),
    Case(
        "capacity-listen-busy",
        (*CAP, "--remote-workers", "1", "--listen", "127.0.0.1:{busy}"),
        "in use",
        TOKEN,
    ),
    Case(
        "capacity-listen-not-address",
        (*CAP, "--remote-workers", "1", "--listen", "nohost"),
        "--listen",
        TOKEN,
    ),
    Case(
        "capacity-remote-short-token",
        (*CAP, "--remote-workers", "1", "--listen", "127.0.0.1:0"),
        "128 bits",
        {"DIAGNOSER_WORKER_TOKEN": "x"},
    ),
    Case(
        "capacity-remote-no-token",
        (*CAP, "--remote-workers", "1", "--listen", "127.0.0.1:0"),
        "DIAGNOSER_WORKER_TOKEN",
    ),
    Case(
        "capacity-advertise-wildcard",
        (*CAP, "--on-cluster", "1", "--advertise", "0.0.0.0:7070", "--render-job", "-"),
        "--advertise",
    ),
    Case(
        "capacity-on-cluster-wildcard",
        (
            *CAP,
            "--on-cluster",
            "1",
            "--advertise",
            "10.0.0.5:7070",
            "--listen",
            "0.0.0.0:7070",
            "--render-job",
            "-",
        ),
        "wildcard",
    ),
    Case(
        "capacity-on-cluster-advertise-elsewhere",
        (*CAP, "--on-cluster", "1", "--advertise", "10.255.255.1:7070", "--render-job", "-"),
        "--listen",
    ),
    Case(
        "capacity-namespace-bad",
        (
            *CAP,
            "--on-cluster",
            "1",
            "--advertise",
            "10.0.0.5:7070",
            "--listen",
            "127.0.0.1:0",
            "--job-namespace",
            "Load_Test",
            "--render-job",
            "-",
        ),
        "Load_Test",
    ),
    Case("worker-coordinator-not-address", ("worker", "--coordinator", "nohost"), "--coordinator", TOKEN),
    Case("worker-coordinator-port", ("worker", "--coordinator", "127.0.0.1:99999"), "--coordinator", TOKEN),
    Case(
        "worker-index-negative",
        ("worker", "--coordinator", "127.0.0.1:{refused}", "--index", "-1"),
        "--index",
        TOKEN,
    ),
    Case("worker-no-token", ("worker", "--coordinator", "127.0.0.1:{refused}"), "DIAGNOSER_WORKER_TOKEN"),
    Case(
        "worker-short-token",
        ("worker", "--coordinator", "127.0.0.1:{refused}"),
        "128 bits",
        {"DIAGNOSER_WORKER_TOKEN": "abc"},
    ),
]

#: Files the cases name under {tmp}.
FILES: dict[str, bytes] = {
    "latin1.yaml": "prometheus:\n  url: http://127.0.0.1:9/  # caf\xe9\n".encode("latin-1"),
    "latin1-probe.yaml": "target: http://127.0.0.1:9/  # caf\xe9\n".encode("latin-1"),
    "broken.yaml": b"prometheus: [url\n",
    "list.yaml": b"- prometheus\n- url\n",
    "typo.yaml": b"promethus:\n  url: http://127.0.0.1:9/\n",
    "probe-typo.yaml": b"target: http://127.0.0.1:9/\nrat: 5\n",
    "bad-rename.yaml": b"metrics:\n  redis_connected_clients: 'redis clients{'\n",
    "receiver.yaml": b"notify:\n  receivers: [{name: pager, type: pagerdooty, routing_key: k}]\n",
    "receiver-channel.yaml": b"notify:\n  receivers: [{name: oncall, type: slack, token: xoxb-1}]\n",
    "bad-signal.yaml": b"signals:\n  queue_length: 'sum(rate(jobs_total[5m]'\n",
    "window.yaml": b"window: 5 minutes\n",
    "latin1-signals.yaml": b"signal_files: [latin1-signal.yaml]\n",
    "latin1-signal.yaml": "signals: {}  # caf\xe9\n".encode("latin-1"),
    "latin1-rules/broken.yaml": "cause: load_shedding  # caf\xe9\n".encode("latin-1"),
}


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``{tmp}`` with the files above, a ``{refused}`` port (bound, not listening), a ``{busy}`` one."""
    tmp = tmp_path_factory.mktemp("bad-inputs")
    for name, content in FILES.items():
        (tmp / name).parent.mkdir(exist_ok=True)
        (tmp / name).write_bytes(content)
    refused, busy = socket.socket(), socket.socket()
    refused.bind(("127.0.0.1", 0))
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        yield {"tmp": str(tmp), "refused": str(refused.getsockname()[1]), "busy": str(busy.getsockname()[1])}
    finally:
        refused.close()
        busy.close()


def _expand(case: Case, places: dict[str, str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    env.update({"COLUMNS": "200", "HOME": places["tmp"], **case.env})
    return {"args": [a.format(**places) for a in case.args], "env": env, "timeout": 20}


@pytest.fixture(scope="module")
def outcomes(places: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every case's exit code and streams, from one driver process forking a child per case."""
    cases = [_expand(case, places) for case in CASES]
    done = subprocess.run(
        [sys.executable, str(DRIVER)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60 + 20 * len(cases),
        check=True,
        cwd=places["tmp"],
    )
    return dict(zip((c.id for c in CASES), json.loads(done.stdout), strict=True))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_bad_input_is_one_error_line_and_exit_2(case: Case, outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes[case.id]
    shown = f"exit {outcome['code']}; stderr: {outcome['stderr'][-2000:]!r}"
    assert outcome["code"] == case.code, shown
    lines = _lines(outcome["stderr"])
    assert len(lines) == 1 and lines[0].startswith(case.prefix), shown
    assert case.says in lines[0], shown
    if case.code == 2:
        assert not outcome["stdout"].strip(), outcome["stdout"]


def test_a_mistyped_state_is_not_created_by_a_replay(
    outcomes: dict[str, dict[str, Any]], places: dict[str, str]
) -> None:
    assert outcomes["serve-replay-state-mistyped"]["code"] == 2
    assert not Path(places["tmp"], "stat.sqlite3").exists()


@pytest.mark.parametrize("case_id", ["config-not-utf8", "at-overflow", "serve-log-level-loud"])
def test_a_fresh_interpreter_says_the_same(
    case_id: str, outcomes: dict[str, dict[str, Any]], places: dict[str, str]
) -> None:
    """The forked children behave as ``diagnose`` started from a shell does (a few, compared).

    Only the program's name in a usage hint differs: ``python -m diagnoser`` there, the console
    script's ``diagnose`` in a fork (whose ``__main__`` is the driver)."""
    expanded = _expand(next(c for c in CASES if c.id == case_id), places)
    env = {k: v for k, v in expanded["env"].items() if k.startswith("DIAGNOSER_")}
    result = run_cli(*expanded["args"], env={**env, "HOME": places["tmp"]})
    fresh = [line.replace("python -m diagnoser", "diagnose") for line in _lines(result.stderr)]
    assert (result.code, fresh) == (outcomes[case_id]["code"], _lines(outcomes[case_id]["stderr"]))
