"""Rank findings, and turn source failures into findings, so a diagnosis reads most important first.

A source that could not be read becomes one ``source_unavailable`` finding (its errors
collapsed to one entry per message, counting the rules affected); a finding whose rule
``yields_to`` another rule that found the same thing is dropped; a cause that another cause
explains (the 503s a service sheds, explained by the database at its connection limit) folds into
it: its advice defers to that cause's, since more replicas or bigger pools would add load to the
very limit that is reached.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from diagnoser.config.parts import FindingStyle
from diagnoser.models import Evidence, Finding, Severity, SourceError
from diagnoser.ruleset import Rule

__all__ = [
    "AgreeingRows",
    "agrees",
    "collapse_errors",
    "fold_explained",
    "rank_findings",
    "unavailable_findings",
    "without_yielding",
]


def agrees(labels: Mapping[str, str], other: Mapping[str, str]) -> bool:
    """Whether two label sets agree on every label they share."""
    return all(other[k] == v for k, v in labels.items() if k in other)


class AgreeingRows:
    """One condition's rows, looked up by the labels they agree with (:func:`agrees`).

    A rule with hundreds of candidates (a service's routes, a cluster's pods) matched each one
    against every row of every other condition: quadratic in the rows. Here the rows are indexed
    once per set of shared label names, so each lookup costs its own hits; the rows come back in
    their order.
    """

    #: Rows with more distinct label-name sets than this are scanned (each set is one index).
    _MAX_SHAPES = 16

    def __init__(self, rows: Sequence[Evidence]) -> None:
        self._rows = rows
        self._shapes: dict[frozenset[str], list[int]] = {}
        for position, row in enumerate(rows):
            self._shapes.setdefault(frozenset(row.labels), []).append(position)
        self._indexes: dict[tuple[frozenset[str], tuple[str, ...]], dict[tuple[str, ...], list[int]]] = {}

    def agreeing(self, labels: Mapping[str, str]) -> list[Evidence]:
        if len(self._shapes) > self._MAX_SHAPES:
            return [row for row in self._rows if agrees(labels, row.labels)]
        hits: list[int] = []
        for names, positions in self._shapes.items():
            shared = tuple(sorted(names.intersection(labels)))
            index = self._indexes.get((names, shared))
            if index is None:
                index = {}
                for position in positions:
                    row_labels = self._rows[position].labels
                    index.setdefault(tuple(row_labels[k] for k in shared), []).append(position)
                self._indexes[(names, shared)] = index
            hits.extend(index.get(tuple(labels[k] for k in shared), ()))
        if len(self._shapes) > 1:
            hits.sort()
        return [self._rows[position] for position in hits]


def without_yielding(findings: list[Finding], rules: Sequence[Rule]) -> list[Finding]:
    """Drop a finding whose rule yields to another rule that found the same thing (same labels)."""
    yields = {rule.id: set(rule.yields_to) for rule in rules if rule.yields_to}
    if not yields:
        return findings
    kept = []
    for finding in findings:
        stronger = yields.get(finding.rule_id, set())
        if any(
            other.rule_id in stronger and agrees(_identity(finding), _identity(other)) for other in findings
        ):
            continue
        kept.append(finding)
    return kept


def _identity(finding: Finding) -> dict[str, str]:
    return {k: v for k, v in finding.labels.items() if k not in ("job",)}


def collapse_errors(errors: list[SourceError]) -> list[SourceError]:
    """One entry per (source, message), saying how many rules it affected.

    A source whose endpoint failed (down, stuck, not its API) explains the rules of that source
    the deadline cut short: on a loaded machine the slow endpoint's own timeout and the deadline
    can both be reached in one run, and that is one cause, reported once.
    """
    failed_endpoints = {e.source: e.message for e in errors if e.scope == "endpoint"}
    counts: dict[tuple[str, str], list[str]] = {}
    for error in errors:
        message = error.message
        if error.scope == "deadline" and error.source in failed_endpoints:
            message = failed_endpoints[error.source]
        counts.setdefault((error.source, message), []).append(error.rule_id or "")
    collapsed = []
    for (source, message), rule_ids in counts.items():
        affected = len({r for r in rule_ids if r})
        suffix = f" ({affected} rules affected)" if affected > 1 else ""
        named = sorted({r for r in rule_ids if r})
        collapsed.append(SourceError(source=source, message=message + suffix, rules=named))
    return collapsed


def unavailable_findings(errors: list[SourceError], style: FindingStyle) -> list[Finding]:
    by_source: dict[str, list[SourceError]] = {}
    for error in errors:
        if error.source != "engine":
            by_source.setdefault(error.source, []).append(error)
    findings = []
    for source, source_errors in sorted(by_source.items()):
        first = source_errors[0].message
        more = f" (+{len(source_errors) - 1} more errors)" if len(source_errors) > 1 else ""
        findings.append(
            style.finding(
                rule_id=f"sources/{source}-unavailable",
                runbook="sources/source-unavailable",
                labels={"source": source},
                cause="source_unavailable",
                kind="cause",
                severity=Severity.warning,
                title=f"{source} could not be read",
                summary=f"{first}{more}",
                evidence=[Evidence(source=source, query="", detail=e.message) for e in source_errors[:5]],
                recommendation=(
                    f"Rules that need {source} were not evaluated: the diagnosis is incomplete. "
                    f"Check that {source} is reachable from diagnoser and that its credentials are valid."
                ),
            )
        )
    return findings


def fold_explained(findings: Iterable[Finding]) -> list[Finding]:
    """Fold each cause that another actionable cause explains into it.

    The explained finding stays (what users see is still true: the service sheds 503s), but its
    recommendation defers to the explaining cause: adding replicas to a service whose database
    is at max_connections, or connections to its pool, adds load to the limit that is already
    reached. The explaining cause gains an evidence row naming what it explains. Findings in
    different namespaces never fold (one team's limit is not another's 503s).
    """
    findings = list(findings)
    explaining = [f for f in findings if f.kind == "cause" and f.is_actionable and f.explains]
    causes: list[Finding | None] = [
        next(
            (
                other
                for other in explaining
                if other is not finding
                and finding.kind == "cause"
                and finding.cause in other.explains
                and finding.cause != other.cause
                and _same_namespace(finding, other)
            ),
            None,
        )
        for finding in findings
    ]
    folded = []
    for finding, cause in zip(findings, causes, strict=True):
        evidence = [
            Evidence(source="engine", query="", detail=f"explains {other.rule_id}: {other.title}")
            for other, by in zip(findings, causes, strict=True)
            if by is finding
        ]
        update: dict[str, object] = {}
        if cause is not None:
            update["recommendation"] = (
                f"{cause.title} explains this: act on that first ({cause.runbook_url}). Do not add "
                "replicas or connections for it here: they would add load to the limit that is reached."
            )
            evidence.append(
                Evidence(source="engine", query="", detail=f"explained by {cause.rule_id}: {cause.title}")
            )
        # Ranking twice (a caller that ranks what was ranked) adds nothing twice.
        evidence = [row for row in evidence if row not in finding.evidence]
        if evidence:
            update["evidence"] = [*finding.evidence, *evidence]
        folded.append(finding.model_copy(update=update) if update else finding)
    return folded


def _same_namespace(one: Finding, other: Finding) -> bool:
    return one.labels.get("namespace", "") == other.labels.get("namespace", "") or not (
        one.labels.get("namespace") and other.labels.get("namespace")
    )


def rank_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most important first: causes that explain an active symptom, symptoms, other causes; info last.

    Among causes that explain a symptom, one that also explains another cause present comes
    first (it is upstream of it), as among symptoms one that explains another (``target_unreachable``
    before the error ratio it makes); then one on the same service (namespace and job) as an active
    symptom before one elsewhere; then by severity, then by rule id for stability.
    """
    findings = fold_explained(findings)
    symptoms = [f for f in findings if f.kind == "symptom" and f.is_actionable]
    active = {f.cause for f in symptoms}
    services = {_service(f) for f in symptoms} - {("", "")}
    active_causes = {f.cause for f in findings if f.kind == "cause" and f.is_actionable}

    def key(finding: Finding) -> tuple[bool, int, int, int, int, str]:
        upstream = finding.kind == "cause" and bool(active_causes.intersection(finding.explains))
        # A symptom that explains another (a target refusing connections, its error ratio) leads it.
        leading = finding.kind == "symptom" and bool(active.intersection(finding.explains) - {finding.cause})
        if finding.kind == "cause" and (upstream or active.intersection(finding.explains)):
            group = 0
        elif finding.kind == "symptom":
            group = 1
        else:
            group = 2
        same_service = 0 if _service(finding) in services else 1
        return (
            finding.severity == Severity.info,
            group,
            # A cause that explains another present cause (a database at its connection limit,
            # the 503s a client service sheds because of it) is the root: it comes first, even
            # from another service.
            0 if upstream or leading else 1,
            same_service,
            -finding.severity.rank,
            finding.rule_id,
        )

    return sorted(findings, key=key)


def _service(finding: Finding) -> tuple[str, str]:
    return finding.labels.get("namespace", ""), finding.service
