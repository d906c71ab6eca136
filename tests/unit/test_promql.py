"""diagnoser.promql: the shipped pack's every query parses, prints back to the same tree, and
survives rewriting; the printer keeps what changes an answer; one duration parser."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import promql_parser
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from diagnoser.cli.timeparse import parse_instant
from diagnoser.config import Settings
from diagnoser.errors import ExpressionError, PromqlSyntaxError
from diagnoser.promql import (
    Replacement,
    duration_seconds,
    format_duration,
    grouping_labels,
    is_duration,
    is_selector,
    metric_names,
    normalise,
    parse,
    parse_selector,
    rename_metrics,
    rewrite,
)
from diagnoser.ruleset import load_rules
from diagnoser.ruleset.lint import LintInputs, lint_static, rule_queries


def _pack() -> list[tuple[str, str]]:
    """Every query the shipped rules can send: signal queries under every convention, trends as sent."""
    ruleset = load_rules([])
    assert ruleset.problems == []
    settings = Settings()
    return [(where, query) for rule in ruleset for where, query, _ in rule_queries(rule, LintInputs.from_settings(settings))]


PACK = _pack()


def test_the_pack_is_all_there() -> None:
    # Every rule family with PromQL, and every signal query expanded for every convention.
    assert len(PACK) > 100
    assert any("(otel-semconv)" in where for where, _ in PACK)
    assert any(".trend." in where for where, _ in PACK)


def test_every_shipped_query_parses_and_round_trips() -> None:
    problems = []
    for where, query in PACK:
        try:
            printed = normalise(query)
        except ExpressionError as exc:
            problems.append(f"{where}: {exc}")
            continue
        # Stable, and the same tree by the parser's own printer (an independent reading).
        if normalise(printed) != printed or str(promql_parser.parse(printed)) != str(parse(query)):
            problems.append(f"{where}: {query!r} printed as {printed!r}")
    assert problems == []


_NAME = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)


@hypothesis_settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_rewrite_print_parse_again_is_stable(data: st.DataObject) -> None:
    """Renaming every metric and grouping label of a pack query, then renaming back, is lossless."""
    _, query = data.draw(st.sampled_from(PACK))
    names = sorted(metric_names(query))
    labels = sorted({label for found in grouping_labels(query).values() for label in found})
    metrics = {name: f"m_{data.draw(_NAME)}_{i}" for i, name in enumerate(names)}
    relabel = {label: f"l_{data.draw(_NAME)}_{i}" for i, label in enumerate(labels)}

    def there(name: str) -> Replacement | None:
        return Replacement(metrics[name]) if name in metrics else None

    rewritten = rewrite(query, there, lambda label: relabel.get(label, label))
    assert normalise(rewritten) == rewritten
    assert metric_names(rewritten) == set(metrics.values())
    assert {label for found in grouping_labels(rewritten).values() for label in found} == set(relabel.values())

    back_metrics = {new: old for old, new in metrics.items()}
    back_labels = {new: old for old, new in relabel.items()}

    def back(name: str) -> Replacement | None:
        return Replacement(back_metrics[name]) if name in back_metrics else None

    assert rewrite(rewritten, back, lambda label: back_labels.get(label, label)) == normalise(query)


@pytest.mark.parametrize(
    ("query", "printed"),
    [
        ("x[5m:]", "x[5m:]"),  # a subquery at the default step, not the range x[5m]
        ("rate(x[500ms])", "rate(x[500ms])"),
        ("rate(x[90s])", "rate(x[1m30s])"),
        ('x{a="say \\"hi\\"", b=~"a\\\\d+"}', 'x{a="say \\"hi\\"", b=~"a\\\\d+"}'),
        ("x{a='single'}", 'x{a="single"}'),
        ("sum(x) by (a)", "sum by (a) (x)"),
        ("x offset -5m @ 100", "x offset -5m @ 100"),
        ("x[5m] offset 1h", "x[5m] offset 1h"),
        ("topk(3, x) > bool 1e-9", "topk(3, x) > bool 1e-09"),
        ("a / on(b) group_left c", "a / on (b) group_left () c"),
        ("-(a + b) * 2 ^ 3 ^ 2", "-(a + b) * 2 ^ 3 ^ 2"),
        ('label_replace(x, "dst", "$1", "src", "(.*)")', 'label_replace(x, "dst", "$1", "src", "(.*)")'),
    ],
)
def test_the_printer_keeps_what_changes_an_answer(query: str, printed: str) -> None:
    assert normalise(query) == printed
    assert normalise(printed) == printed


def test_metric_names_and_grouping_come_from_the_tree() -> None:
    query = 'sum by (le) (rate(h_bucket{q="a_total"}[5m])) / on (pool) group_right (x) {__name__="g", a="by"}'
    assert metric_names(query) == {"h_bucket", "g"}
    assert grouping_labels(query) == {"by": ["le"], "on": ["pool"], "group_right": ["x"]}


def test_rename_metrics_follows_histogram_series_and_leaves_the_rest_as_written() -> None:
    assert rename_metrics('sum by (le) (rate(h_bucket{job="h"}[5m])) + h_count', {"h": "x"}) == (
        'sum by (le) (rate(x_bucket{job="h"}[5m])) + x_count'
    )
    untouched = "max(hh_bucket)  by (le)"
    assert rename_metrics(untouched, {"h": "x"}) is untouched
    with pytest.raises(PromqlSyntaxError, match=r"sum\("):
        rename_metrics("sum(h", {"h": "x"})


def test_scaling_goes_where_the_value_is_read() -> None:
    replacements = {
        "b": Replacement("ms_bucket", (("state", "=", "used"),), 0.001, buckets=True),
        "s": Replacement("ms_sum", scale=0.001),
        "g": Replacement("ns", scale=1e-9),
    }
    query = "histogram_quantile(0.9, sum by (le) (rate(b[5m]))) + rate(s[5m]) + g"
    assert rewrite(query, replacements.get) == (
        '(histogram_quantile(0.9, sum by (le) (rate(ms_bucket{state="used"}[5m]))) * 0.001)'
        " + (rate(ms_sum[5m]) * 0.001) + (ns * 1e-09)"
    )
    with pytest.raises(ExpressionError, match="histogram_quantile"):
        rewrite("sum(rate(b[5m]))", replacements.get)


def test_selectors() -> None:
    assert parse_selector('m{state="used", x!~"a.*"}') == ("m", [("state", "=", "used"), ("x", "!~", "a.*")])
    # A metric named by __name__ (Prometheus 3 writes UTF-8 names so: {"http.server.duration"}).
    assert parse_selector('{"a.b", "c.d"="1"}') == ("a.b", [("c.d", "=", "1")])
    assert parse_selector('{__name__="m"}') == ("m", [])
    for bad in ("rate(m[5m])", "m offset 5m", '{__name__=~"m.*"}', "m{"):
        with pytest.raises(ValueError):
            parse_selector(bad)
    assert is_selector(' m{a="b"} ') and not is_selector("m + 1") and not is_selector("m{")


def test_a_query_that_does_not_parse_names_itself() -> None:
    with pytest.raises(PromqlSyntaxError) as caught:
        parse("sum(rate(x[5m])")
    assert caught.value.query == "sum(rate(x[5m])"
    assert "PromQL does not parse" in str(caught.value) and "sum(rate(x[5m])" in str(caught.value)


def test_lint_names_the_rule_whose_query_does_not_parse(tmp_path: Path) -> None:
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "broken.yaml").write_text(
        "cause: dependency_slow\nseverity: warning\ntitle: t\nsummary: s\n"
        "when:\n  - promql: {query: 'sum(rate(x_total[5m])'}\n",
        encoding="utf-8",
    )
    problems = lint_static(load_rules([tmp_path], include_builtin=False), LintInputs.from_settings(Settings()))
    assert len(problems) == 1
    assert "rule team/broken: field when[0].promql.query: PromQL does not parse" in problems[0]
    assert "sum(rate(x_total[5m])" in problems[0]


@pytest.mark.parametrize(
    ("text", "seconds", "in_promql"),
    [
        # Prometheus' spellings (ranges, offset, flags, rule files): what they meant before Go's joined.
        ("5m", 300.0, True), ("1h30m", 5400.0, True), ("250ms", 0.25, True), ("90s", 90.0, True),
        ("2d", 172_800.0, True), ("1w", 604_800.0, True), ("1y", 365 * 86400.0, True),
        ("1d12h", 129_600.0, True), ("5ms", 0.005, True),
        # Go's (time.Duration.String(), as the kubelet writes an image pull's time).
        ("1m2.345s", 62.345, False), ("1h2m3.5s", 3723.5, False), ("350ms", 0.35, True),
        ("2.5s", 2.5, False), ("1.5h", 5400.0, False), (".5s", 0.5, False), ("1.5\u00b5s", 1.5e-6, False),
        ("1.5\u03bcs", 1.5e-6, False), ("3us", 3e-6, False), ("40ns", 4e-8, False), ("0", 0.0, False),
        (" 3s ", 3.0, False),
    ],
)
def test_one_duration_parser_reads_every_spelling(text: str, seconds: float, in_promql: bool) -> None:
    assert duration_seconds(text) == pytest.approx(seconds, rel=1e-12)
    assert is_duration(text) is in_promql


@pytest.mark.parametrize("bad", ["", "5", "1m2", "5 m", "2 s", "-5m", "+5m", "5x", "ms", "1.2.3s", "1e3s", "."])
def test_durations_without_a_unit_or_with_a_sign_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"is not a duration like 30s, 5m, 1h30m or 1m2\.345s"):
        duration_seconds(bad)
    assert not is_duration(bad)


def test_durations_print_as_prometheus_writes_them() -> None:
    assert [format_duration(s) for s in (90, 3600, 0.25, 86400 * 8)] == ["1m30s", "1h", "250ms", "1w1d"]


def test_times_ago_on_the_command_line_use_the_duration_parser() -> None:
    now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert parse_instant("-1h30m", now=now) == now - timedelta(minutes=90)
    assert parse_instant("30m", now=now) == now - timedelta(minutes=30)
    with pytest.raises(ValueError, match="in the future"):
        parse_instant("+5m", now=now)
    with pytest.raises(ValueError, match="neither RFC 3339"):
        parse_instant("-5x", now=now)
