"""Unusable flags and config values: one line on stderr and exit 2, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli


def _one_line_error(result_stderr: str) -> str:
    lines = [line for line in result_stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result_stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["now", "--slowlog", "/no/such/path"], "elasticsearch.slowlog_paths[0]: /no/such/path does not exist"),
        (["now", "--kubeconfig", "/nope"], "kubernetes.kubeconfig: /nope does not exist"),
        (["now", "--prometheus-url", "http://127.0.0.1:1", "--rules", "/no/rules"], "--rules: /no/rules does not exist"),
        (["serve", "--listen", "nonsense", "--prometheus-url", "http://127.0.0.1:1"], "'nonsense' is not host:port"),
        (["serve", "--listen", "127.0.0.1:99999", "--prometheus-url", "http://127.0.0.1:1"], "is not host:port"),
        (["serve"], "no source configured"),
    ],
)
def test_unusable_flag_is_one_line_and_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    result = run_cli(*args, env={"HOME": str(tmp_path)}, timeout=30)
    assert result.code == 2, result.stdout + result.stderr
    assert expected in _one_line_error(result.stderr)
    assert "Traceback" not in result.stderr


def test_kubeconfig_that_cannot_load_is_a_config_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [\n")
    result = run_cli("now", "--kubeconfig", str(kubeconfig))
    assert result.code == 2
    assert "kubernetes: cannot load kubeconfig" in _one_line_error(result.stderr)


def test_misspelt_keys_get_did_you_mean(tmp_path: Path) -> None:
    config = tmp_path / "diagnoser.yaml"
    config.write_text("prometheus: {urll: http://127.0.0.1:1}\ndeadlin_s: 3\nslo: {p99: 250}\n")
    result = run_cli("now", "--config", str(config))
    assert result.code == 2
    line = _one_line_error(result.stderr)
    assert "prometheus.urll: unknown key (did you mean prometheus.url?)" in line
    assert "deadlin_s: unknown key (did you mean deadline_s?)" in line
    assert "slo.p99: unknown key (did you mean slo.p99_ms?)" in line
