"""Reading a histogram whichever kind Prometheus holds: classic buckets, native, or both.

Rules and users write histograms the classic way: ``x_bucket`` with ``le``, ``x_count``, ``x_sum``.
A Prometheus 3 scraping a client with native histograms stores one series ``x`` whose samples are
histograms, and none of those three. :func:`read_histograms` rewrites a query on its syntax tree
where each histogram is *read*, given what kind each family is (``kind_of(base)``):

* ``histogram_quantile(q, sum by (job, le) (rate(x_bucket[5m])))`` becomes
  ``histogram_quantile(q, sum by (job) (rate(x[5m])))`` (``le`` leaves every ``by`` between);
* ``rate(x_count[5m])`` becomes ``histogram_count(rate(x[5m]))``, ``_sum`` ``histogram_sum(...)``;
  an instant ``x_count`` becomes ``histogram_count(x)``;
* a bucket read alone, ``rate(x_bucket{le="0.3"}[5m])`` (observations up to 0.3), becomes
  ``histogram_fraction(-Inf, 0.3, rate(x[5m])) * histogram_count(rate(x[5m]))``.

Where a family has both kinds (a client exposing both, ``always_scrape_classic_histograms``, or a
history that changed kind), the read becomes ``(native or classic)``: per series, the native
answer where there is one, else the classic one, so the same observations are never counted
twice. ``histogram_*`` functions skip float samples, so reading a name that turns out to be no
native histogram answers nothing rather than something wrong. A read the rewrite cannot carry
(``max_over_time(x_count[5m])``: no native equivalent per sample) stays classic::

    read_histograms("rate(x_count[5m])", lambda base: "native")
    # 'histogram_count(rate(x[5m]))'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import promql_parser as pp

from diagnoser.promql.printer import Hooks, format_number, render, selector_text
from diagnoser.promql.syntax import match_op, metric_names, parse, selector_name, walk

__all__ = [
    "HISTOGRAM_PARTS",
    "Kind",
    "held",
    "highest_bounds",
    "histogram_bases",
    "kind_from_names",
    "read_histograms",
]

Kind = Literal["classic", "native", "both"]
#: The series a classic histogram has beside its buckets, by suffix.
HISTOGRAM_PARTS = ("_bucket", "_count", "_sum")
#: Range functions that commute with ``histogram_count``/``histogram_sum`` (linear in the counts),
#: so ``f(x_count[w])`` is ``histogram_count(f(x[w]))``.
_LINEAR_RANGE_FUNCTIONS = frozenset(
    {"rate", "increase", "irate", "delta", "idelta", "sum_over_time", "avg_over_time", "last_over_time"}
)
_PART_FUNCTIONS = {"_count": "histogram_count", "_sum": "histogram_sum"}


def histogram_bases(query: str) -> dict[str, str]:
    """Selector names of ``query`` that look like a classic histogram's series, mapped to their
    base name (``x_bucket`` -> ``x``). Only names: whether they are histograms is the caller's."""
    found: dict[str, str] = {}
    for name in metric_names(query):
        for suffix in HISTOGRAM_PARTS:
            if name.endswith(suffix) and len(name) > len(suffix):
                found[name] = name[: -len(suffix)]
    return found


def kind_from_names(base: str, names: set[str] | frozenset[str]) -> Kind | None:
    """What the metric names say ``base`` is: ``classic`` with its ``_bucket``/``_count``/``_sum``,
    ``native`` with a series of its own name (and no classic parts), ``both``, or ``None``."""
    classic = any(f"{base}{suffix}" in names for suffix in HISTOGRAM_PARTS)
    native = base in names
    if classic and native:
        return "both"
    return "classic" if classic else "native" if native else None


def highest_bounds(label_sets: Iterable[Mapping[str, str]], by: str) -> dict[str, float]:
    """The highest finite ``le`` among bucket series' labels, per value of the label ``by``
    (``""`` for series without it); series with no numeric ``le`` count for nothing."""
    bounds: dict[str, float] = {}
    for labels in label_sets:
        try:
            bound = float(labels.get("le", "nan"))
        except ValueError:
            continue
        key = labels.get(by, "")
        if math.isfinite(bound):
            bounds[key] = max(bound, bounds.get(key, bound))
    return bounds


def held(name: str, names: set[str] | frozenset[str]) -> bool:
    """True when a query reading ``name`` finds it: it exists, or it is a classic histogram's
    series (``x_bucket``, ``x_count``, ``x_sum``) of a family held as a native histogram ``x``."""
    if name in names:
        return True
    return any(name.endswith(suffix) and name[: -len(suffix)] in names for suffix in HISTOGRAM_PARTS)


@dataclass
class _Site:
    """Where a histogram's value is read: a node and the histogram selectors below it."""

    node: pp.Expr
    part: str
    selectors: list[pp.VectorSelector]
    #: Aggregations between the node and its selectors (their ``le`` goes, for buckets).
    aggregations: list[pp.AggregateExpr]
    kind: Kind
    #: For a bucket read on its own: the ``le`` bound it reads up to.
    bound: float | None = None


def read_histograms(query: str, kind_of: Callable[[str], Kind | None]) -> str:
    """``query`` reading each histogram of native or both kinds as it is held; unchanged otherwise.

    ``kind_of`` answers for a base name (``x`` of ``x_bucket``); ``None`` or ``classic`` leaves
    that family's reads as written. Raises :class:`~diagnoser.errors.PromqlSyntaxError` when the
    query does not parse.
    """
    bases = histogram_bases(query)
    kinds = {name: kind_of(base) for name, base in bases.items()}
    if not any(kind in ("native", "both") for kind in kinds.values()):
        return query
    tree = parse(query)
    sites: dict[int, _Site] = {}

    def visit(node: pp.Expr, ancestors: tuple[pp.Expr, ...]) -> None:
        if not isinstance(node, pp.VectorSelector):
            return
        name = selector_name(node)
        kind = kinds.get(name or "")
        if name is None or kind not in ("native", "both"):
            return
        suffix = name[len(bases[name]) :]
        site = _read_site(node, suffix, ancestors, kind)
        if site is None:
            return
        known = sites.get(id(site.node))
        if known is None:
            sites[id(site.node)] = site
        else:
            known.selectors.append(node)
            known.kind = "both" if "both" in (known.kind, kind) else known.kind

    walk(tree, visit)
    if not sites:
        return query
    texts = {key: _site_text(site, bases) for key, site in _outermost(sites, tree).items()}
    return render(tree, Hooks(text=texts))


def _read_site(
    selector: pp.VectorSelector, suffix: str, ancestors: tuple[pp.Expr, ...], kind: Kind
) -> _Site | None:
    if suffix == "_bucket":
        bound = _le_bound(selector)
        for index in range(len(ancestors) - 1, -1, -1):
            ancestor = ancestors[index]
            if isinstance(ancestor, pp.Call) and ancestor.func.name == "histogram_quantile":
                between = [a for a in ancestors[index + 1 :] if isinstance(a, pp.AggregateExpr)]
                return _Site(ancestor, suffix, [selector], between, kind)
        # A bucket read on its own: the observations up to its le (a fraction times the count).
        if bound is None:
            return None
        node = _range_function(selector, ancestors)
        return _Site(node, suffix, [selector], [], kind, bound) if node is not None else None
    node = _range_function(selector, ancestors)
    return _Site(node, suffix, [selector], [], kind) if node is not None else None


def _range_function(selector: pp.VectorSelector, ancestors: tuple[pp.Expr, ...]) -> pp.Expr | None:
    """The node whose value a count or sum read gives: ``rate(x_count[5m])`` or ``x_count`` itself."""
    if not ancestors or not isinstance(ancestors[-1], pp.MatrixSelector):
        return selector
    if len(ancestors) > 1 and isinstance(ancestors[-2], pp.Call):
        call = ancestors[-2]
        return call if call.func.name in _LINEAR_RANGE_FUNCTIONS else None
    return None


def _le_bound(selector: pp.VectorSelector) -> float | None:
    for matcher in selector.matchers.matchers:
        if matcher.name == "le" and match_op(matcher) == "=":
            try:
                return float(matcher.value)
            except ValueError:
                return None
    return None


def _outermost(sites: dict[int, _Site], tree: pp.Expr) -> dict[int, _Site]:
    """Sites not inside another site (an inner one is rewritten as part of the outer's text)."""
    inner: set[int] = set()

    def visit(node: pp.Expr, ancestors: tuple[pp.Expr, ...]) -> None:
        if id(node) in sites and any(id(a) in sites for a in ancestors):
            inner.add(id(node))

    walk(tree, visit)
    return {key: site for key, site in sites.items() if key not in inner}


def _site_text(site: _Site, bases: dict[str, str]) -> str:
    native_selectors = {id(s): _native_selector(s, bases) for s in site.selectors}
    hooks = Hooks(
        selector=lambda node: native_selectors.get(id(node)),
        drop={id(a): frozenset({"le"}) for a in site.aggregations},
    )
    inner = render(site.node, hooks)
    if site.part == "_bucket" and site.bound is None:
        native = inner  # histogram_quantile reads the native histograms as they are
    elif site.part == "_bucket":
        assert site.bound is not None
        fraction = f"histogram_fraction(-Inf, {format_number(site.bound)}, {inner})"
        native = f"({fraction} * histogram_count({inner}))"
    else:
        native = f"{_PART_FUNCTIONS[site.part]}({inner})"
    if site.kind == "native":
        return native
    return f"({native} or {render(site.node)})"


def _native_selector(selector: pp.VectorSelector, bases: dict[str, str]) -> str:
    name = selector_name(selector) or ""
    kept = [
        (m.name, match_op(m), m.value)
        for m in selector.matchers.matchers
        if m.name not in ("__name__", "le")
    ]
    return selector_text(bases[name], kept)
