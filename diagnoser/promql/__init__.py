"""PromQL on a syntax tree: parsing, what a query reads, rewriting, printing, durations.

The one place diagnoser reads PromQL. Queries are parsed by ``promql-parser`` (a port of
Prometheus' own parser), never lexed with regular expressions, and trees are cached by query
text because every evaluation sends the same queries. It imports nothing of diagnoser but
:mod:`diagnoser.errors`: a query the parser cannot read raises
:class:`~diagnoser.errors.PromqlSyntaxError` (an ``ExpressionError``) naming the query, for the
caller to place (file, rule, field)::

    from diagnoser import promql

    promql.metric_names("sum by (le) (rate(x_bucket[5m])) > 0")    # {"x_bucket"}
    promql.rename_metrics("rate(h_count[5m])", {"h": "my_h"})      # "rate(my_h_count[5m])"
    promql.duration_seconds("1h30m")                               # 5400.0
"""

from __future__ import annotations

from diagnoser.promql.duration import UNIT_SECONDS, duration_seconds, format_duration, is_duration
from diagnoser.promql.histograms import (
    HISTOGRAM_PARTS,
    Kind,
    held,
    highest_bounds,
    histogram_bases,
    kind_from_names,
    read_histograms,
)
from diagnoser.promql.printer import (
    Hooks,
    format_number,
    is_legacy_label,
    is_legacy_metric,
    is_vector,
    label_name,
    quote,
    render,
    selector_text,
)
from diagnoser.promql.restrict import restrict
from diagnoser.promql.rewrite import (
    NUMERIC_LABELS,
    TYPE_AND_UNIT_LABELS,
    Replacement,
    number_spellings,
    numbers_as_numbers,
    rename_metrics,
    rewrite,
    without_type_and_unit,
)
from diagnoser.promql.syntax import (
    Expr,
    grouping_labels,
    is_selector,
    metric_names,
    parse,
    parse_selector,
    reach_seconds,
    selector_name,
    short_subqueries,
    walk,
)

__all__ = [
    "HISTOGRAM_PARTS",
    "NUMERIC_LABELS",
    "TYPE_AND_UNIT_LABELS",
    "UNIT_SECONDS",
    "Expr",
    "Hooks",
    "Kind",
    "Replacement",
    "duration_seconds",
    "format_duration",
    "format_number",
    "grouping_labels",
    "held",
    "highest_bounds",
    "histogram_bases",
    "is_duration",
    "is_legacy_label",
    "is_legacy_metric",
    "is_selector",
    "is_vector",
    "kind_from_names",
    "label_name",
    "metric_names",
    "normalise",
    "number_spellings",
    "numbers_as_numbers",
    "parse",
    "parse_selector",
    "quote",
    "reach_seconds",
    "read_histograms",
    "rename_metrics",
    "render",
    "restrict",
    "rewrite",
    "selector_name",
    "selector_text",
    "short_subqueries",
    "walk",
    "without_type_and_unit",
]


def normalise(query: str) -> str:
    """``query`` as the printer writes it: two queries with the same tree give the same text."""
    return render(parse(query))
