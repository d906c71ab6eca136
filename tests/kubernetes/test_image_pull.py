"""``k8s.image_pull_backoff`` and its rule against the fixture API server: the registry and the kubelet's reason named."""

from __future__ import annotations

from typing import Any

import pytest

from diagnoser.checks.k8s.image_pull import ImageReference, classify_pull_error
from diagnoser.checks.registry import CheckContext, check_kinds
from diagnoser.engine import DiagnosisConfig, diagnose
from diagnoser.models import Evidence, SourceError
from diagnoser.ruleset import load_rules
from diagnoser.sources import Sources
from diagnoser.sources.kubernetes import KubernetesSource
from tests.fixtures.k8s import scenarios
from tests.fixtures.k8s.objects import AT

WEB = scenarios.WEB_NEXT_IMAGE


async def run_check(source: KubernetesSource, **params: Any) -> list[Evidence] | SourceError:
    ctx = CheckContext(at=AT, sources=Sources(kubernetes=source))
    kind = check_kinds()["k8s.image_pull_backoff"]
    return await kind.run(kind.params(**params), ctx)


@pytest.mark.parametrize(
    ("image", "registry", "repository", "version"),
    [
        ("nginx:1.25", "docker.io", "library/nginx", ":1.25"),
        ("nginx", "docker.io", "library/nginx", ""),
        ("bitnami/redis:7.2", "docker.io", "bitnami/redis", ":7.2"),
        ("docker.io/library/nginx:1.25", "docker.io", "library/nginx", ":1.25"),
        ("registry.example.com/shop/web:1.2", "registry.example.com", "shop/web", ":1.2"),
        ("localhost:5000/web:dev", "localhost:5000", "web", ":dev"),
        ("localhost/web", "localhost", "web", ""),
        ("registry:5000/team/api:2", "registry:5000", "team/api", ":2"),
        ("ghcr.io/org/app@sha256:" + "ab" * 32, "ghcr.io", "org/app", "@sha256:" + "ab" * 32),
        ("ghcr.io/org/app:1.0@sha256:" + "ab" * 32, "ghcr.io", "org/app", "@sha256:" + "ab" * 32),
    ],
)
def test_registry_is_parsed_as_the_runtime_resolves_it(image, registry, repository, version) -> None:
    assert ImageReference.parse(image) == ImageReference(registry, repository, version)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (scenarios.pull_error("not_found", "registry.example.com/shop/web:1.14.3"), "not found"),
        (scenarios.pull_error("unauthorized", "registry.example.com/shop/web:1.14.3"), "unauthorized"),
        (scenarios.pull_error("cannot_resolve", "registry.example.com/shop/web:1.14.3"), "cannot resolve"),
        (scenarios.pull_error("timeout", "registry.example.com/shop/web:1.14.3"), "timeout"),
        (
            'failed to pull and unpack image "docker.io/acme/api:2.0": failed to resolve reference '
            '"docker.io/acme/api:2.0": pull access denied, repository does not exist or may require '
            "authorization: server message: insufficient_scope: authorization failed",
            "unauthorized",
        ),
        (
            'failed to authorize: failed to fetch anonymous token: Get "https://auth.docker.io/token": '
            "dial tcp: lookup auth.docker.io: i/o timeout",
            "timeout",
        ),
        (
            "failed to copy: httpReadSeeker: failed open: unexpected status code https://registry-1.docker.io/v2/"
            "library/nginx/manifests/sha256:0f: 429 Too Many Requests - Server message: toomanyrequests: You "
            "have reached your pull rate limit.",
            "rate limited",
        ),
        (
            'Head "https://registry.internal/v2/a/manifests/1": tls: x509: certificate signed by unknown authority',
            "certificate",
        ),
        (
            'Head "https://registry.internal/v2/a/manifests/1": dial tcp 10.1.2.3:443: connect: connection refused',
            "unreachable",
        ),
        ("something else entirely", "unknown"),
    ],
)
def test_the_kubelet_message_gives_the_reason(message: str, reason: str) -> None:
    assert classify_pull_error(message) == reason


async def test_a_tag_that_does_not_exist(serve, source_for) -> None:
    source = source_for(serve(scenarios.image_pull_backoff()))
    rows = await run_check(source)
    assert isinstance(rows, list)
    assert len(rows) == 1, [r.labels for r in rows]
    labels = rows[0].labels
    assert labels["workload"] == "Deployment/web"
    assert labels["image"] == WEB
    assert labels["registry"] == "registry.example.com"
    assert labels["reason"] == "not found"
    assert labels["waiting"] == "ErrImagePull, ImagePullBackOff"
    assert labels["pods"] == f"web-{scenarios.WEB_NEXT_HASH}-f4g7h, web-{scenarios.WEB_NEXT_HASH}-w2x9c"
    assert labels["kubelet_message"].startswith("rpc error: code = NotFound desc = failed to pull and unpack")
    assert "check that shop/web:1.14.3 exists in registry.example.com" in labels["fix"]
    assert rows[0].value == 2.0


@pytest.mark.parametrize(
    ("failure", "secrets", "reason", "fix"),
    [
        ("unauthorized", (), "unauthorized", "credentials for registry.example.com"),
        ("unauthorized", ("regcred",), "unauthorized", "the pods use regcred"),
        ("cannot_resolve", (), "cannot resolve", "the nodes cannot resolve registry.example.com"),
        ("timeout", (), "timeout", "egress from the nodes"),
    ],
)
async def test_each_failure_gets_its_own_fix(serve, source_for, failure, secrets, reason, fix) -> None:
    source = source_for(serve(scenarios.image_pull_backoff(failure=failure, pull_secrets=secrets)))
    rows = await run_check(source)
    assert isinstance(rows, list)
    assert [r.labels["reason"] for r in rows] == [reason]
    assert fix in rows[0].labels["fix"]
    assert rows[0].labels["pull_secrets"] == (", ".join(secrets) or "none")


async def test_a_bare_image_name_comes_from_docker_hub(serve, source_for) -> None:
    cluster = scenarios.image_pull_backoff(image="nginx:1.255", resolved="docker.io/library/nginx:1.255")
    rows = await run_check(source_for(serve(cluster)))
    assert isinstance(rows, list)
    assert (rows[0].labels["image"], rows[0].labels["registry"]) == ("nginx:1.255", "docker.io")
    assert "library/nginx:1.255 exists in docker.io" in rows[0].labels["fix"]


async def test_the_reason_comes_from_the_back_off_message_once_events_expired(serve, source_for) -> None:
    # Kubernetes 1.32+ appends the last pull error to the back-off message.
    source = source_for(serve(scenarios.image_pull_backoff(failure="unauthorized", kubelet_1_32=True)))
    rows = await run_check(source)
    assert isinstance(rows, list)
    assert rows[0].labels["reason"] == "unauthorized"
    assert "401 Unauthorized" in rows[0].labels["kubelet_message"]


async def test_old_events_do_not_explain_and_the_reason_can_stay_unknown(serve, source_for) -> None:
    cluster = scenarios.image_pull_backoff()
    # Only the ImagePullBackOff pod, whose waiting message (before 1.32) says nothing of why.
    cluster.remove("pods", f"web-{scenarios.WEB_NEXT_HASH}-w2x9c", scenarios.NS)
    source = source_for(serve(cluster))
    within = await run_check(source)
    assert isinstance(within, list)
    assert within[0].labels["reason"] == "not found"
    rows = await run_check(source, window_minutes=0.5)  # the Failed events are older than that
    assert isinstance(rows, list)
    assert rows[0].labels["reason"] == "unknown"
    assert rows[0].labels["kubelet_message"] == "none (no Failed event in the window)"
    assert "kubectl describe pod -n shop" in rows[0].labels["fix"]


async def test_silent_when_every_image_pulls(serve, source_for) -> None:
    assert await run_check(source_for(serve(scenarios.healthy()))) == []


async def test_failed_read_is_a_source_error(serve, source_for) -> None:
    source = source_for(serve(scenarios.image_pull_backoff(), forbidden={"events"}))
    result = await run_check(source)
    assert isinstance(result, SourceError)
    assert "forbidden: list events" in result.message


async def test_the_rule_names_registry_reason_and_fix(serve, source_for) -> None:
    ruleset = load_rules([], include_builtin=True)
    rules = [rule for rule in ruleset if rule.id.startswith("kubernetes/") and rule.id.endswith("-api")]
    source = source_for(serve(scenarios.image_pull_backoff(failure="unauthorized")))
    diagnosis = await diagnose(rules, DiagnosisConfig(), Sources(kubernetes=source), at=AT)
    assert diagnosis.errors == []
    assert [f.rule_id for f in diagnosis.findings] == ["kubernetes/image-pull-backoff-api"]
    finding = diagnosis.findings[0]
    assert finding.cause == "image_pull_failure"
    assert finding.title == f"Image pull failing: {WEB} (unauthorized) for shop/Deployment/web"
    assert f"cannot pull {WEB} from registry.example.com: unauthorized" in finding.summary
    assert "imagePullSecrets" in finding.recommendation
    assert finding.runbook_url.endswith("kubernetes/image-pull-backoff-api.md")


async def test_docker_hub_denial_may_be_a_missing_repository(serve, source_for) -> None:
    cluster = scenarios.image_pull_backoff(
        failure="unauthorized", image="acme/api:2.0", resolved="docker.io/acme/api:2.0"
    )
    rows = await run_check(source_for(serve(cluster)))
    assert isinstance(rows, list)
    assert rows[0].labels["registry"] == "docker.io"
    assert "Docker Hub says the same of a repository that does not exist" in rows[0].labels["fix"]
