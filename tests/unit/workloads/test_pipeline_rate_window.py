"""The window a pipeline's traffic query spans, which keys the tuner's scaling table."""

from __future__ import annotations

import pytest

from chronotope.workloads.pipeline import DEFAULT_RATE_WINDOW_S, rate_window_s, with_rate_window


@pytest.mark.parametrize(
    ("query", "seconds"),
    [
        ("rate(requests_total[5s])", 5.0),
        ('sum(rate(http_requests_total{job="ipl"}[ 1m ]))', 60.0),
        ("irate(x[500ms])", 0.5),
        ("sum(increase(x[2h])) / 7200", 7200.0),
        ("max_over_time(rate(x[10s])[5m:])", 10.0),  # the rate's range, not the subquery's
    ],
)
def test_the_first_range_selector_is_the_window(query: str, seconds: float) -> None:
    assert rate_window_s(query) == pytest.approx(seconds)


def test_a_query_without_a_range_gets_the_long_default() -> None:
    assert rate_window_s("pipeline:requests:rate5s") == DEFAULT_RATE_WINDOW_S == 60.0


@pytest.mark.parametrize(
    ("query", "window_s", "want"),
    [
        ("rate(requests_total[5s])", 20.0, "rate(requests_total[20s])"),
        (
            "sum(rate(a_total[1m])) + sum(rate(b_total[60s]))",
            120.0,
            "sum(rate(a_total[120s])) + sum(rate(b_total[120s]))",
        ),
        # a subquery or a window of another length is not the traffic's window
        (
            "max_over_time(rate(x[5s])[1m:]) + rate(y[30s])",
            10.0,
            "max_over_time(rate(x[10s])[1m:]) + rate(y[30s])",
        ),
        ("pipeline:requests:rate5s", 10.0, "pipeline:requests:rate5s"),
    ],
)
def test_the_traffic_query_is_asked_over_another_window(
    query: str, window_s: float, want: str
) -> None:
    assert with_rate_window(query, window_s) == want
    assert rate_window_s(want) == (window_s if want != query else rate_window_s(query))
