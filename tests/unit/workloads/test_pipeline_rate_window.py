"""The window a pipeline's traffic query spans, which keys the tuner's scaling table."""

from __future__ import annotations

import pytest

from chronotope.workloads.pipeline import DEFAULT_RATE_WINDOW_S, rate_window_s


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
