"""Query-shape analysis of a search request body: its shape (literals replaced by ``?``) and anti-patterns.

A search slow log entry's ``source`` is the request body. :func:`analyse_source` parses it (undoing
the second escaping the ES 8 JSON layout adds), replaces its literal values by ``?`` so searches
that differ only in their values group together, and walks its query clauses for the patterns
that make searches expensive (:data:`ANTI_PATTERNS`, each with its fix in
:data:`ANTI_PATTERN_FIXES`)::

    analysis = analyse_source('{"from":20000,"size":10,"query":{"match_all":{}}}')
    analysis.shape            # '{"from":"?","size":"?","query":{"match_all":{}}}'
    analysis.anti_patterns    # frozenset({'deep_pagination', 'unfiltered_source'})
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from diagnoser.sources.elasticsearch.slowlog_entries import parse_json

__all__ = ["ANTI_PATTERNS", "ANTI_PATTERN_FIXES", "MAX_RESULT_WINDOW", "QueryAnalysis", "analyse_source"]

#: Anti-patterns :func:`analyse_source` can flag, with the reason each one costs.
ANTI_PATTERNS: dict[str, str] = {
    "deep_pagination": "from + size beyond 10,000: every shard collects and sorts from + size hits",
    "leading_wildcard": "a wildcard or query_string term starting with * or ? scans the term dictionary",
    "regexp": "regexp queries walk the term dictionary through an automaton",
    "script": "a script in the query or sort runs per matching document",
    "scoring_query_context": "exact-match clauses (term, range...) scored; in a filter they would be cached",
    "track_total_hits": "track_total_hits: true counts every match on a large result set",
    "unfiltered_source": "whole _source returned: no _source filtering on a request that returns hits",
    "highlight": "highlighting re-analyses the returned text fields",
}

#: What to do about each anti-pattern, for recommendations.
ANTI_PATTERN_FIXES: dict[str, str] = {
    "deep_pagination": "page with search_after and a point in time instead of from/size",
    "leading_wildcard": "index an n-gram, reversed or wildcard-type field instead of *prefix searches",
    "regexp": "replace the regexp with terms on a keyword or n-gram field",
    "script": "compute the scripted value at index time and query or sort on that field",
    "scoring_query_context": "move exact-match clauses (term, terms, range, exists) into bool.filter",
    "track_total_hits": "set track_total_hits to false or a bound such as 10000",
    "unfiltered_source": "return only the needed fields with _source includes or fields",
    "highlight": "drop highlight where it is not shown, or limit it to one short field",
}

#: The window within which Elasticsearch allows ``from + size`` (``index.max_result_window``).
MAX_RESULT_WINDOW = 10_000
_TERM_LEVEL = frozenset({"term", "terms", "range", "exists", "ids", "prefix", "terms_set"})


class QueryAnalysis(NamedTuple):
    """A request body reduced to its shape, and the anti-patterns found in it."""

    shape: str
    anti_patterns: frozenset[str]
    parsed: bool = True
    #: The request body as JSON text (the log's extra escaping undone), ``None`` when unparsed.
    request: str | None = None



# The shape is made from the request text with three regex passes (C speed) rather than by
# rebuilding the parsed tree in Python: Elasticsearch serialises a search source
# deterministically, so equal structures give equal text once literals are replaced. The parsed
# tree is walked only along query clauses, to find anti-patterns.

# Each pattern starts at a token boundary (after a key's colon, or after "[" or ","), so a match
# can never pair the closing quote of one string with the opening quote of the next.
_KEYED_STRING = re.compile(r'("(?:[^"\\]|\\.)*"\s*:\s*)"(?:[^"\\]|\\.)*"')
_LISTED_STRING = re.compile(r'(?<=[\[,])(\s*)"(?:[^"\\]|\\.)*"(?!\s*:)')
_SCALAR_VALUE = re.compile(r"(?<=[:\[,])\s*(?:-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)(?=\s*[,\]}])")
_REPEATED = re.compile(r'\[\s*"\?"(?:\s*,\s*"\?")+\s*\]')
_QS_REGEXP = re.compile(r"(^|[\s:(])/[^/]+/")
_QS_TOKENS = re.compile(r"[\s()]+")
_SCORING_CLAUSES = ("must", "should")
_NESTING = ("nested", "has_child", "has_parent", "boosting", "dis_max")
_NESTED_QUERIES = ("query", "queries", "positive", "negative")


def _decode_source(source: str) -> tuple[Any, str]:
    """The request body as JSON and as JSON text; ``(None, "")`` when it does not parse.

    The ES 8 JSON layout escapes the body a second time (``{\\"query\\":...}``): the quick undo
    is a replace, checked by parsing; the exact double decode is the fallback.
    """
    text = source.strip()
    if not text:
        return None, ""
    candidates = [text.replace('\\"', '"'), text] if text.startswith('{\\"') else [text]
    for candidate in candidates:
        try:
            return parse_json(candidate), candidate
        except (ValueError, RecursionError):
            continue
    if '\\"' in text:
        try:
            unescaped = json.loads('"' + text + '"')
            return json.loads(unescaped), unescaped
        except (ValueError, RecursionError, TypeError):
            pass
    return None, ""


# Keys with the brackets they open: equal skeletons mean equal shapes (Elasticsearch writes keys
# in a fixed order; lists of literals collapse in the shape anyway), so the costlier
# value-replacing passes run once per skeleton. The pattern starts with a literal quote, which
# the regex engine scans for quickly: about 6 us a body where keys and all brackets took 14.
_SKELETON = re.compile(r'"[^"\\]*":[{\[]*')
_SHAPE_CACHE: dict[str, str] = {}
_SHAPE_CACHE_SIZE = 4096


def _shape_of(text: str) -> str:
    skeleton = "".join(_SKELETON.findall(text))
    shape = _SHAPE_CACHE.get(skeleton)
    if shape is None:
        shape = _normalise_literals(text)
        if len(_SHAPE_CACHE) >= _SHAPE_CACHE_SIZE:
            _SHAPE_CACHE.clear()
        _SHAPE_CACHE[skeleton] = shape
    return shape


def _normalise_literals(text: str) -> str:
    shape = _KEYED_STRING.sub(r'\1"?"', text)
    shape = _LISTED_STRING.sub(r'\1"?"', shape)
    shape = _SCALAR_VALUE.sub('"?"', shape)
    # Lists of literals (terms, fields, ids) are one shape whatever their length.
    return _REPEATED.sub('["?"]', shape)


class _Walk:
    """One pass over the query clauses of a request body, collecting anti-patterns."""

    __slots__ = ("flags",)

    def __init__(self) -> None:
        self.flags: set[str] = set()

    def query(self, node: Any, scoring: bool) -> None:
        """Visit a query clause; ``scoring`` is false inside filter, must_not and constant_score."""
        if isinstance(node, list):
            for item in node:
                self.query(item, scoring)
            return
        if not isinstance(node, dict):
            return
        for key, body in node.items():
            if key == "bool" and isinstance(body, dict):
                for clause, sub in body.items():
                    if clause in _SCORING_CLAUSES:
                        self.query(sub, scoring)
                    elif clause in ("filter", "must_not"):
                        self.query(sub, False)
            elif key == "constant_score" and isinstance(body, dict):
                self.query(body.get("filter"), False)
            elif key in ("script", "script_score"):
                self.flags.add("script")
                if key == "script_score" and isinstance(body, dict):
                    self.query(body.get("query"), scoring)
            elif key == "function_score" and isinstance(body, dict):
                self.function_score(body, scoring)
            elif key in _NESTING and isinstance(body, dict):
                for nested_key in _NESTED_QUERIES:
                    if nested_key in body:
                        self.query(body[nested_key], scoring)
            elif key == "wildcard":
                if self.leading_wildcard_term(body):
                    self.flags.add("leading_wildcard")
            elif key == "regexp":
                self.flags.add("regexp")
            elif key in ("query_string", "simple_query_string"):
                self.query_string(body)
            elif scoring and key in _TERM_LEVEL:
                self.flags.add("scoring_query_context")

    def function_score(self, body: dict[str, Any], scoring: bool) -> None:
        self.query(body.get("query"), scoring)
        if "script_score" in body:
            self.flags.add("script")
        functions = body.get("functions")
        if isinstance(functions, list) and any(
            isinstance(f, dict) and "script_score" in f for f in functions
        ):
            self.flags.add("script")

    @staticmethod
    def leading_wildcard_term(body: Any) -> bool:
        if not isinstance(body, dict):
            return False
        for spec in body.values():
            pattern = spec
            if isinstance(spec, dict):
                pattern = spec.get("value", spec.get("wildcard"))
            if isinstance(pattern, str) and pattern[:1] in ("*", "?"):
                return True
        return False

    def query_string(self, body: Any) -> None:
        if not isinstance(body, dict):
            return
        text = body.get("query")
        if not isinstance(text, str):
            return
        if body.get("allow_leading_wildcard", True) is not False:
            for token in _QS_TOKENS.split(text):
                term = token.split(":", 1)[1] if ":" in token and not token.startswith("\\") else token
                if term.lstrip("+-!")[:1] in ("*", "?"):
                    self.flags.add("leading_wildcard")
                    break
        if _QS_REGEXP.search(text):
            self.flags.add("regexp")

    def request(self, body: dict[str, Any], total_hits: int | None) -> None:
        self.query(body.get("query"), True)
        self.query(body.get("post_filter"), False)
        sort = body.get("sort")
        if sort is not None:
            keys = sort if isinstance(sort, list) else [sort]
            if any(isinstance(key, dict) and "_script" in key for key in keys):
                self.flags.add("script")
        if "script_fields" in body:
            self.flags.add("script")
        size = body.get("size", 10)
        start = body.get("from", 0)
        if isinstance(size, int) and isinstance(start, int) and start + size > MAX_RESULT_WINDOW:
            self.flags.add("deep_pagination")
        # A large result set is what makes exact counting expensive; unknown counts are flagged.
        if body.get("track_total_hits") is True and (total_hits is None or total_hits >= MAX_RESULT_WINDOW):
            self.flags.add("track_total_hits")
        source_filter = body.get("_source", True)
        if source_filter is True and size != 0 and "stored_fields" not in body:
            self.flags.add("unfiltered_source")
        if "highlight" in body:
            self.flags.add("highlight")


# The search slow log is written per shard: one slow search on a five-shard index is up to five
# lines with the same body. Analyses are kept by body text, in a bounded table.
_ANALYSIS_CACHE: dict[tuple[str, bool], QueryAnalysis] = {}
_ANALYSIS_CACHE_SIZE = 8192


def analyse_source(source: str, *, total_hits: int | None = None) -> QueryAnalysis:
    """Reduce a search request body to its shape (literals replaced by ``?``) and its anti-patterns."""
    # Only "large result set or unknown" matters to the analysis (track_total_hits), not the count.
    key = (source, total_hits is None or total_hits >= MAX_RESULT_WINDOW)
    cached = _ANALYSIS_CACHE.get(key)
    if cached is not None:
        return cached
    analysis = _analyse(source, total_hits)
    if len(_ANALYSIS_CACHE) >= _ANALYSIS_CACHE_SIZE:
        _ANALYSIS_CACHE.clear()
    _ANALYSIS_CACHE[key] = analysis
    return analysis


def _analyse(source: str, total_hits: int | None) -> QueryAnalysis:
    body, text = _decode_source(source)
    if not isinstance(body, dict):
        return QueryAnalysis(shape="(unparsed)", anti_patterns=frozenset(), parsed=False)
    walk = _Walk()
    try:
        walk.request(body, total_hits)
    except RecursionError:
        return QueryAnalysis(shape="(too deep)", anti_patterns=frozenset(), parsed=False)
    if '": ' in text or ', "' in text:
        # Elasticsearch writes compact JSON; other writers (shippers, hand-made logs) are made
        # compact too, so the shape passes see one layout.
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return QueryAnalysis(shape=_shape_of(text), anti_patterns=frozenset(walk.flags), request=text)

