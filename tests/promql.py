"""What a PromQL query reads, parsed by promql-parser: for the rules' and the dashboard's tests."""

from __future__ import annotations

import re
from collections.abc import Iterator

import promql_parser

from observability.metrics import COUNTERS, GAUGES, HISTOGRAMS

# Every series name Plumb's /metrics exposes (counters with _total, histograms' parts).
PLUMB_SERIES = (
    {f"{m.name}_total" for m in COUNTERS}
    | {m.name for m in GAUGES}
    | {f"{m.name}_{part}" for m in HISTOGRAMS for part in ("bucket", "sum", "count")}
)


def selected_names(query: str) -> Iterator[str]:
    """The metric name of every vector selector in `query` (raises ValueError if it does not parse)."""
    yield from _walk(promql_parser.parse(query))


def label_matchers(query: str) -> Iterator[tuple[str, str, str]]:
    """(label, operator, value) of every label matcher in `query`: ("task", "=~", "audits.+")."""
    for selector in _selectors(promql_parser.parse(query)):
        for matcher in selector.matchers.matchers:
            yield matcher.name, _OPERATORS[str(matcher.op)], matcher.value


# MatchOp values are not hashable: keyed by their names.
_OPERATORS = {
    str(promql_parser.MatchOp.Equal): "=",
    str(promql_parser.MatchOp.NotEqual): "!=",
    str(promql_parser.MatchOp.Re): "=~",
    str(promql_parser.MatchOp.NotRe): "!~",
}


def _walk(node) -> Iterator[str]:
    for selector in _selectors(node):
        if selector.name:
            yield selector.name


def _selectors(node) -> Iterator[promql_parser.VectorSelector]:
    if isinstance(node, promql_parser.VectorSelector):
        yield node
        return
    for attribute in ("lhs", "rhs", "expr", "vector_selector", "param"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, str | int | float):
            yield from _selectors(child)
    for argument in getattr(node, "args", None) or []:
        yield from _selectors(argument)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, - for spaces."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
