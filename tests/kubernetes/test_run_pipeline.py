"""One run, end to end, against the fixture API server: its one clock and its credentials read once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from diagnoser.config import KubernetesSettings, LeaderElectionSettings, Settings
from diagnoser.daemon.leader import LeaseElector
from diagnoser.engine import DiagnosisConfig, run_diagnosis
from diagnoser.engine.run import check_inputs
from diagnoser.probe.result import ProbeResult
from diagnoser.ruleset import RuleSet, load_rules
from tests.fixtures.k8s import scenarios
from tests.fixtures.k8s.objects import AT
from tests.fixtures.k8s_server import Fault

RULE = "kubernetes/oom-killed-api"
#: The API server answers the pods list this late; the deadline leaves the rules more, unless the
#: probe has spent it.
PODS_DELAY_S = 0.8
DEADLINE_S = 2.0
PROBE_S = 1.5


def oom_rule() -> RuleSet:
    loaded = load_rules([])
    return RuleSet(rules={RULE: loaded.rules[RULE]})


def kubernetes(kubeconfig: Path) -> KubernetesSettings:
    return KubernetesSettings(enabled=True, kubeconfig=kubeconfig, context="fixture")


async def test_the_probe_spends_the_runs_deadline(serve, tmp_path: Path) -> None:
    server = serve(scenarios.oom_killed(), faults={"pods": Fault(delay_s=PODS_DELAY_S)})
    settings = Settings(
        kubernetes=kubernetes(server.write_kubeconfig(tmp_path / "kubeconfig")), deadline_s=DEADLINE_S
    )

    async def slow_probe() -> ProbeResult | None:
        await asyncio.sleep(PROBE_S)
        return None

    # Without a probe the slow API server still answers within the deadline...
    alone = await run_diagnosis(DiagnosisConfig.from_settings(settings), rules=oom_rule(), at=AT)
    assert [f.rule_id for f in alone.findings] == [RULE], alone.errors
    # ...but the probe's seconds come out of the same budget: what is left is too short.
    after_probe = await run_diagnosis(DiagnosisConfig.from_settings(settings), rules=oom_rule(), at=AT, probe=slow_probe)
    assert RULE not in [f.rule_id for f in after_probe.findings]
    assert [e.message for e in after_probe.errors] == ["no answer before the diagnosis deadline"]


async def test_the_kubeconfig_is_read_once_per_run(serve, tmp_path: Path) -> None:
    server = serve(scenarios.oom_killed())
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    settings = Settings(kubernetes=kubernetes(kubeconfig))
    credentials = check_inputs(settings.input_paths(), settings.kubernetes)
    assert credentials is not None
    kubeconfig.unlink()  # read by the input check: neither the source nor leader election reads it again
    diagnosis = await run_diagnosis(DiagnosisConfig.from_settings(settings), rules=oom_rule(), at=AT, credentials=credentials)
    assert diagnosis.errors == []
    assert [f.rule_id for f in diagnosis.findings] == [RULE]
    elector = LeaseElector.from_settings(settings.kubernetes, LeaderElectionSettings(), credentials=credentials)
    elector.close()
