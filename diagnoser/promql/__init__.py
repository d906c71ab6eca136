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
from diagnoser.promql.printer import Hooks, format_number, quote, render
from diagnoser.promql.rewrite import Replacement, rename_metrics, rewrite
from diagnoser.promql.syntax import (
    Expr,
    grouping_labels,
    is_selector,
    metric_names,
    parse,
    parse_selector,
    selector_name,
    walk,
)

__all__ = [
    "UNIT_SECONDS",
    "Expr",
    "Hooks",
    "Replacement",
    "duration_seconds",
    "format_duration",
    "format_number",
    "grouping_labels",
    "is_duration",
    "is_selector",
    "metric_names",
    "normalise",
    "parse",
    "parse_selector",
    "quote",
    "rename_metrics",
    "render",
    "rewrite",
    "selector_name",
    "walk",
]


def normalise(query: str) -> str:
    """``query`` as the printer writes it: two queries with the same tree give the same text."""
    return render(parse(query))
