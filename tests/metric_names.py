"""Metric names: what the components export, and what a PromQL expression reads.

The chart's alerts and Grafana dashboard must only query series the code
exports; the tests compare the two sets, so renaming a metric without the
chart fails them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client import CollectorRegistry

PROMETHEUS_SERIES = frozenset({"up"})
"""Series Prometheus itself writes for every scrape target."""

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
}
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"}
)
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_.:$])[A-Za-z_:][A-Za-z0-9_:]*")


def families(registries: Iterable[CollectorRegistry]) -> dict[str, str]:
    """Metric family name -> type, for every family the registries collect."""
    out: dict[str, str] = {}
    for registry in registries:
        for family in registry.collect():
            out[family.name] = family.type
    return out


def series_names(registries: Iterable[CollectorRegistry]) -> dict[str, str]:
    """Every series name a scrape of the registries can show -> its family name."""
    out: dict[str, str] = {}
    for name, kind in families(registries).items():
        for suffix in _SUFFIXES.get(kind, ("",)):
            out[name + suffix] = name
    return out


def component_registries() -> list[CollectorRegistry]:
    """The registries of the operator and the extender, as their processes build them."""
    from chronotope.controllers.metrics import OperatorMetrics
    from chronotope.extender.server import Metrics

    return [OperatorMetrics().registry, Metrics().registry]


def names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, labels, durations left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # label values
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges, subqueries, $__rate_interval
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end() :].lstrip()
        word = match.group(0)
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function or aggregation, or an operator keyword
        names.add(word)
    return names
