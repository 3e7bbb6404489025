"""Observed P99 against the SLO (`workloads.pipeline.observe_slo` and its parts)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineStatus
from chronotope.workloads.pipeline import (
    HISTORY_STEP_S,
    SloObservation,
    append_history,
    observe_slo,
    observed_ms,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)
SLO = 200.0


def _at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        (0.0995, 99.5),
        (0.0, 0.0),
        (1.23456, 1234.6),
        (float("nan"), "not a latency"),
        (float("inf"), "not a latency"),
        (-1.0, "not a latency"),
        ("Prometheus at http://p did not answer", "did not answer"),
    ],
)
def test_the_answer_in_seconds_becomes_ms_or_why_not(answer: float | str, want: Any) -> None:
    got = observed_ms(answer)
    if isinstance(want, float):
        assert got == want
    else:
        assert isinstance(got, str)
        assert want in got


def test_history_takes_a_point_at_most_every_step() -> None:
    history = append_history([], NOW, 99.0, 120.0)
    assert history == [{"time": "2030-01-01T00:00:00Z", "predictedMs": 99.0, "observedMs": 120.0}]
    # within the step no point is added: the newest one takes the latest reading
    same = append_history(history, _at(HISTORY_STEP_S - 1), 98.0, 130.0)
    assert same == [{"time": "2030-01-01T00:00:00Z", "predictedMs": 98.0, "observedMs": 130.0}]
    # ... and a failed read keeps the slot's last good one
    assert append_history(same, _at(HISTORY_STEP_S - 0.5), 98.0, None) == same
    later = append_history(same, _at(HISTORY_STEP_S), 99.0, 140.0)
    assert [p["observedMs"] for p in later] == [130.0, 140.0]
    assert later[-1]["time"] == "2030-01-01T00:00:30Z"
    # a point from the future (a skewed clock, a hand edit) adds nothing
    assert len(append_history(later, _at(0), 1.0, 1.0)) == 2
    # a failed read in a new slot is a point without `observedMs`
    gap = append_history(later, _at(2 * HISTORY_STEP_S), 99.0, None)
    assert gap[-1] == {"time": "2030-01-01T00:01:00Z", "predictedMs": 99.0}
    assert append_history([], NOW, None, None) == [{"time": "2030-01-01T00:00:00Z"}]


def test_passes_every_two_seconds_for_an_hour_append_once_per_step() -> None:
    history: list[dict[str, Any]] = []
    for i in range(1800):  # the controller's 2 s timer for an hour
        history = append_history(history, _at(2 * i), 99.0, float(i))
        assert len(history) <= 60
    times = [datetime.fromisoformat(p["time"].replace("Z", "+00:00")) for p in history]
    assert len(history) == 60
    assert all((b - a).total_seconds() == HISTORY_STEP_S for a, b in itertools.pairwise(times))
    assert history[-1]["observedMs"] == 1799.0  # the newest holds the latest reading


def test_history_keeps_the_newest_60_points_and_fits_the_crd() -> None:
    history: list[dict[str, Any]] = []
    for i in range(100):
        history = append_history(history, _at(i * HISTORY_STEP_S), 99.0, float(i))
    assert len(history) == 60
    assert [p["observedMs"] for p in history] == [float(i) for i in range(40, 100)]
    # the status model (and so the CRD's maxItems) accepts what the controller writes
    status = InferencePipelineStatus.model_validate({"p99History": history})
    assert len(status.p99_history) == 60
    too_long = [*history, {"time": "2031-01-01T00:00:00Z"}]
    with pytest.raises(ValueError, match="60"):
        InferencePipelineStatus.model_validate({"p99History": too_long})


def test_an_unparsable_last_time_starts_a_fresh_point() -> None:
    history = [{"time": "yesterday", "predictedMs": 1.0}]
    assert len(append_history(history, NOW, 2.0, 3.0)) == 2


def _pass(old: dict[str, Any], answer: float | str | None, seconds: float = 0) -> SloObservation:
    return observe_slo(old, SLO, answer, predicted_ms=150.0, now=_at(seconds), generation=3)


def _status(old: dict[str, Any], seen: SloObservation) -> dict[str, Any]:
    """The status after a pass, as the handler merges it (conditions by type)."""
    conditions = [c for c in old.get("conditions") or [] if c["type"] != "SloMet"]
    return old | seen.fields | {"conditions": [*conditions, seen.condition]}


@pytest.mark.parametrize(
    ("answer", "status", "reason", "events"),
    [
        (0.0995, "True", "ObservedWithinSlo", []),
        (0.2, "True", "ObservedWithinSlo", []),  # at the SLO meets it
        (0.4975, "False", "ObservedOverSlo", [("Warning", "SloViolated")]),
        ("Prometheus at http://p did not answer: refused", "Unknown", "NoObservation", []),
        (float("nan"), "Unknown", "NoObservation", []),
    ],
)
def test_the_first_observation_sets_slo_met(
    answer: float | str, status: str, reason: str, events: list[tuple[str, str]]
) -> None:
    seen = _pass({}, answer)
    assert (seen.condition["type"], seen.condition["status"]) == ("SloMet", status)
    assert seen.condition["reason"] == reason
    assert seen.condition["observedGeneration"] == 3
    assert [(k, r) for k, r, _ in seen.events] == events
    (point,) = seen.fields["p99History"]
    assert point["predictedMs"] == 150.0
    if status == "Unknown":
        assert seen.fields["observedP99Ms"] is None
        assert "observedMs" not in point
        assert "observed P99 unknown" in seen.condition["message"]
    else:
        assert isinstance(answer, float)
        assert seen.fields["observedP99Ms"] == point["observedMs"] == round(answer * 1000, 1)


def test_the_event_is_posted_once_per_transition() -> None:
    status: dict[str, Any] = {}
    reasons = []
    # within, over for three passes, a failed read while over, over again, back within
    answers: list[float | str] = [0.1, 0.5, 0.6, 0.5, "refused", 0.55, 0.1, 0.12]
    for t, answer in enumerate(answers):
        seen = _pass(status, answer, seconds=2 * t)
        reasons += [r for _, r, _ in seen.events]
        status = _status(status, seen)
    assert reasons == ["SloViolated", "SloRecovered"]
    assert status["conditions"][-1]["status"] == "True"


def test_a_failed_read_after_a_violation_does_not_repeat_the_event() -> None:
    # the condition is Unknown but the history remembers the last observation was over
    old = {
        "conditions": [{"type": "SloMet", "status": "Unknown", "reason": "NoObservation"}],
        "p99History": [{"time": "2029-12-31T23:59:00Z", "predictedMs": 150.0, "observedMs": 400.0}],
    }
    assert _pass(old, 0.45).events == []
    assert [r for _, r, _ in _pass(old, 0.1).events] == ["SloRecovered"]
    # with no observation ever, the first over the SLO is a violation
    fresh = {"conditions": [{"type": "SloMet", "status": "Unknown", "reason": "NoObservation"}]}
    assert [r for _, r, _ in _pass(fresh, 0.45).events] == ["SloViolated"]


def test_the_violation_message_names_observed_predicted_and_slo() -> None:
    seen = _pass({}, 0.4975)
    (kind, reason, message) = seen.events[0]
    assert (kind, reason) == ("Warning", "SloViolated")
    assert message == "observed P99 497.5 ms is over the SLO of 200 ms (predicted 150 ms)"
    assert seen.condition["message"] == message


def test_without_a_query_the_observation_is_removed_and_unknown() -> None:
    old = {
        "observedP99Ms": 120.0,
        "p99History": [{"time": "2029-12-31T23:59:00Z", "observedMs": 120.0}],
        "conditions": [{"type": "SloMet", "status": "True", "reason": "ObservedWithinSlo"}],
    }
    seen = _pass(old, None)
    assert seen.fields == {"observedP99Ms": None, "p99History": None}  # None removes them
    assert (seen.condition["status"], seen.condition["reason"]) == ("Unknown", "NoObservation")
    assert "observedP99Query" in seen.condition["message"]
    assert seen.events == []
