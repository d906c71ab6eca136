"""Readable output through the real CLI: 80 columns, whole ids and URLs, named evidence, quiet libraries."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time

from diagnoser.testing.processes import free_port
from tests.conftest import REPO, IncidentPrometheus, run_cli

_URL = re.compile(r"https?://\S+")


def _demo(prom: IncidentPrometheus, *extra: str, columns: int = 80) -> str:
    result = run_cli(
        "now", "--prometheus-url", prom.url, "--at", prom.at("35m"), "--slo-p99-ms", "250", *extra,
        env={"COLUMNS": str(columns)},
    )
    assert result.code == 1, result.stderr
    return result.stdout


def test_demo_table_fits_80_columns_and_never_splits_a_url(incident_prometheus: IncidentPrometheus) -> None:
    out = _demo(incident_prometheus)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    urls = [url for line in lines for url in _URL.findall(line)]
    assert urls, out  # the runbook base is printed whole
    # Every URL whole: a runbook up to its .md, or the runbook base printed once.
    assert all(url.endswith((".md", "/rules/<runbook>")) for url in urls), urls
    assert "runbook  pools/pool-exhaustion.md" in out
    assert "runbooks: https://github.com/diagnoser/diagnoser/blob/main/rules/<runbook>" in out
    # Each measurement named, with its unit; the wrapped lines read as one sentence.
    assert ("evidence connection pool exhaustion: 100 % (threshold 95 %), waiting: 30 requests waiting for a connection (threshold 0),"
            " limit: 10, in use: 10") in " ".join(out.split())


def test_wide_table_has_each_runbook_url_on_its_own_line(incident_prometheus: IncidentPrometheus) -> None:
    out = _demo(incident_prometheus, columns=160)
    runbooks = [line.strip() for line in out.splitlines() if line.strip().startswith("runbook ")]
    assert "runbook  https://github.com/diagnoser/diagnoser/blob/main/rules/pools/pool-exhaustion.md" in runbooks


def test_markdown_evidence_rows_carry_name_and_query(incident_prometheus: IncidentPrometheus) -> None:
    out = _demo(incident_prometheus, "--format", "markdown")
    assert "| evidence | value | threshold | labels | source and query | detail |" in out
    waiting = next(line for line in out.splitlines() if line.startswith("| waiting |"))
    assert "| 30 | 0 |" in waiting
    # Read for the candidate's job alone (the comparison the server applied is not part of it).
    assert "prometheus: `max by (namespace, job, db_client_connection_pool_name)" in waiting
    assert 'db_client_connection_pending_requests{job=~"checkout\\|"}[2m]))`' in waiting
    assert "via otel-semconv" in waiting


def test_rules_list_never_truncates_ids() -> None:
    ids = [row["id"] for row in json.loads(run_cli("rules", "list", "--format", "json").stdout)]
    for columns in (80, 200):
        out = run_cli("rules", "list", env={"COLUMNS": str(columns)}).stdout
        shown = {token for line in out.splitlines() for token in line.split()}
        assert set(ids) <= shown, sorted(set(ids) - shown)
        assert "…" not in out


def test_version_and_completion() -> None:
    version = run_cli("--version")
    assert version.code == 0
    assert re.fullmatch(r"diagnose \d+\.\d+\.\d+\S*\n", version.stdout)
    assert "--install-completion" in run_cli("--help").stdout


def test_library_loggers_are_quiet_unless_vv() -> None:
    args = ("now", "--prometheus-url", f"http://127.0.0.1:{free_port()}", "--elasticsearch-url",
            f"http://127.0.0.1:{free_port()}", "--format", "json")  # fmt: skip
    quiet = run_cli(*args)
    assert quiet.code == 1
    assert quiet.stderr == "", quiet.stderr
    assert run_cli(*args, "-v").stderr.count("elastic_transport") == 0
    loud = run_cli(*args, "-vv")
    assert "elastic_transport" in loud.stderr and "httpcore" in loud.stderr


def test_spinner_names_the_phase_on_a_terminal_only(incident_prometheus: IncidentPrometheus) -> None:
    args = [sys.executable, "-m", "diagnoser", "now", "--prometheus-url", incident_prometheus.url,
            "--at", incident_prometheus.at("35m"), "--format", "json"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    env.update(TERM="xterm", COLUMNS="100")
    primary, secondary = os.openpty()
    try:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=secondary, stdin=subprocess.DEVNULL,
                                   env=env, cwd=REPO)
        os.close(secondary)
        seen = b""
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.1)
            if ready:
                try:
                    seen += os.read(primary, 4096)
                except OSError:
                    break
        stdout = process.communicate(timeout=30)[0]
    finally:
        os.close(primary)
    assert b"evaluating" in seen and b"rules against prometheus" in seen, seen[:500]
    assert json.loads(stdout)["findings"]  # stdout stays clean JSON
    piped = run_cli("now", "--prometheus-url", incident_prometheus.url, "--at", incident_prometheus.at("35m"))
    assert "evaluating" not in piped.stderr
