"""Checks over the Kubernetes API, one module per check, each registering the kind ``k8s.<check>``.

A rule condition names the check and tunes it with that check's own parameters::

    when:
      - k8s: {check: pod_startup, budget_seconds: "${params.budget_seconds}", statistic: p99}

Each check returns one evidence row per thing to act on (one HPA, one workload, one PVC...), so
the engine emits one finding per row; a failed read is returned as the source's
:class:`~diagnoser.models.SourceError`. What several checks share is in
:mod:`diagnoser.checks.k8s.common`. Adding a check is one module here (found by
:func:`~diagnoser.checks.registry.load_check_kinds`), its rule and runbook under
``rules/kubernetes/`` and its test.

The API shows the cluster as it is now: with ``diagnose now --at`` in the past, time windows
(events, terminations, pod starts) end at that instant but objects are read as they are today.
"""

from __future__ import annotations
