"""Metric names in PromQL expressions and in a Prometheus text exposition.

A small lexer, not a parser: it drops string literals, label matchers (``{...}``), range and
subquery brackets (``[...]``), label lists of ``by``/``without``/``on``/``ignoring``/
``group_left``/``group_right``, and function names (an identifier followed by ``(``); what is
left of the identifiers are metric names, and keywords, which are known. Grafana variables
(``$job``, ``$__rate_interval``) only ever appear inside the dropped parts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES: Final = re.compile(r"\{[^{}]*\}")
_BRACKETS: Final = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST: Final = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT: Final = re.compile(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
KEYWORDS: Final = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
     "inf", "nan", "atan2"}
)  # fmt: skip
_HISTOGRAM_SUFFIXES: Final = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects."""
    text = _STRING.sub(" ", expr)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


_MATCHER: Final = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(" + _STRING.pattern + r")\s*(?:,|$)")


def selectors(expr: str) -> list[tuple[str, frozenset[tuple[str, str, str]]]]:
    """Each metric selector of an expression, in order: its metric name and its label matchers
    ``(label, operator, quoted value)``, empty for a name without braces.

    Same lexer as :func:`metric_names`, which keeps the positions: string literals and label
    matchers are blanked out before the identifiers are read, and a metric name owns the braces
    that follow it. Raises ValueError for matchers it cannot read."""
    text = _STRING.sub(lambda m: " " * len(m.group()), expr)
    braces = {m.start(): m.end() for m in _BRACES.finditer(text)}
    text = _BRACES.sub(lambda m: " " * len(m.group()), text)
    text = _BRACKETS.sub(lambda m: " " * len(m.group()), text)
    text = _LABEL_LIST.sub(lambda m: " " * len(m.group()), text)
    out = []
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        start = m.end()
        while start < len(expr) and expr[start].isspace():
            start += 1
        matchers: frozenset[tuple[str, str, str]] = frozenset()
        if start in braces:
            body = expr[start + 1 : braces[start] - 1]
            pos, found = 0, []
            while pos < len(body) and body[pos:].strip():
                mm = _MATCHER.match(body, pos)
                if mm is None or mm.end() == pos:
                    raise ValueError(f"unreadable label matchers of {name}: {{{body}}}")
                found.append((mm.group(1), mm.group(2), mm.group(3)))
                pos = mm.end()
            matchers = frozenset(found)
        out.append((name, matchers))
    return out


def exposed_names(exposition: str) -> set[str]:
    """Every series name a /metrics page exposes, including families registered without samples yet.

    A labelled metric that has never been incremented shows only its HELP and TYPE lines; its
    series names follow from its type (counter ``_total``, histogram ``_bucket``/``_sum``/
    ``_count``)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in _HISTOGRAM_SUFFIXES)
        else:
            names.add(family.name)
    return names


def base_name(series: str) -> str:
    """The family a histogram series belongs to (``x_bucket`` -> ``x``); other names unchanged."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def all_metric_names(exprs: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for e in exprs:
        out |= metric_names(e)
    return out
