"""The chart's Grafana dashboard queries only what the components export, and all of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.metric_names import (
    PROMETHEUS_SERIES,
    component_registries,
    families,
    names_in,
    series_names,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "charts/chronotope/dashboards/chronotope.json"


def _panels() -> list[dict[str, Any]]:
    data = json.loads(DASHBOARD.read_text())
    return [p for p in data["panels"] if p["type"] != "row"]


def test_the_names_are_read_from_promql() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, verb) "
        '(rate(a_bucket{verb="filter"}[$__rate_interval])))'
        ' / on (job) group_left (pod) max(b_total offset 5m) > 1e3 and absent(up{job="x"} == 1)'
    )
    assert names_in(expr) == {"a_bucket", "b_total", "up"}


def test_the_registries_name_every_series_kind() -> None:
    names = series_names(component_registries())
    assert names["chronotope_trainingjob_reconcile_seconds_bucket"] == (
        "chronotope_trainingjob_reconcile_seconds"
    )
    assert names["chronotope_extender_decisions_total"] == "chronotope_extender_decisions"
    assert "chronotope_operator_leader" in names
    assert "chronotope_trainingjobs" in names  # from a custom collector
    assert "chronotope_extender_decisions" not in names  # a counter's samples end in _total


def test_every_panel_has_a_query_on_exported_metrics() -> None:
    exported = series_names(component_registries())
    panels = _panels()
    assert panels
    for panel in panels:
        exprs = [t.get("expr", "") for t in panel.get("targets", [])]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            used = names_in(expr)
            assert used, f"panel {panel['title']!r}: {expr!r} reads no metric"
            unknown = used - exported.keys() - PROMETHEUS_SERIES
            assert not unknown, f"panel {panel['title']!r} reads {sorted(unknown)}: not exported"


def test_every_exported_metric_has_a_panel() -> None:
    registries = component_registries()
    exported = series_names(registries)
    shown = {exported[n] for p in _panels() for t in p["targets"] for n in names_in(t["expr"])}
    assert set(families(registries)) - shown == set()


@pytest.mark.parametrize("bad", ["rate(chronotope_nosuch_total[5m])", "chronotope_trainingjob"])
def test_a_renamed_metric_is_caught(bad: str) -> None:
    exported = series_names(component_registries())
    assert names_in(bad) - exported.keys() - PROMETHEUS_SERIES
