"""The inference simulator: trace formats, rescaling, and the four policies' rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec
from chronotope.planners.inferline import PipelineModel, StageModel, model_from_spec
from chronotope.sim.inference import (
    InferenceRun,
    TunerSettings,
    cost_floor,
    deadline_floor,
    load_arrivals,
    rescale,
    run_policy,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param(
            "azure.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:48.1805900,396,109\n",
            id="azure",
        ),
        pytest.param("mooncake.jsonl", '{"timestamp": 1000}\n{"timestamp": 2500}\n', id="mooncake"),
        pytest.param("plain.txt", "7.0\n8.5\n", id="plain"),
    ],
)
def test_every_trace_format_gives_seconds_from_the_first(
    tmp_path: Path, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert load_arrivals(path) == pytest.approx([0.0, 1.5])


def test_rescale_sets_the_mean_rate_and_keeps_the_shape() -> None:
    a = np.array([0.0, 1.0, 1.5, 4.0])
    b = rescale(a, 3.0)
    assert (len(b) - 1) / b[-1] == pytest.approx(3.0)
    assert b / b[-1] == pytest.approx(a / a[-1])


def _sample_model() -> PipelineModel:
    doc = yaml.safe_load((ROOT / "manifests/samples/inferencepipeline-video.yaml").read_text())
    return model_from_spec(InferencePipelineSpec.model_validate(doc["spec"]), {})


def _steady_run(policy: str, seed: int) -> InferenceRun:
    """A policy on 60 s of steady 300 queries/s, planned on the first 15 s."""
    arrivals = np.cumsum(np.random.default_rng(seed).exponential(1 / 300, 18000))
    planning, serving = arrivals[arrivals < 15], arrivals[arrivals >= 15] - 15
    run = run_policy(policy, _sample_model(), planning, serving, seed=0)
    assert isinstance(run, InferenceRun)
    return run


def test_policies_on_a_bursty_trace() -> None:
    model = _sample_model()
    rng = np.random.default_rng(0)
    # 60 s at 150 qps, then 60 s at 450 qps: the tuner must scale up
    arrivals = np.concatenate(
        [np.cumsum(rng.exponential(1 / 150, 9000)), 60 + np.cumsum(rng.exponential(1 / 450, 27000))]
    )
    arrivals = np.sort(arrivals[arrivals < 120])
    planning, serving = arrivals[arrivals < 30], arrivals[arrivals >= 30] - 30
    rows = {p: run_policy(p, model, planning, serving, seed=0) for p in ("peak", "inferline")}
    peak, tuned = rows["peak"], rows["inferline"]
    assert isinstance(peak, InferenceRun)
    assert isinstance(tuned, InferenceRun)
    assert peak.scale_events == 0
    assert tuned.scale_events > 0
    assert tuned.slo_miss_pct < 1.0
    assert peak.requests == tuned.requests == len(serving)
    # the tuner follows the step: fewer replicas before it than after
    first_stage = tuned.schedules[0]
    assert first_stage[0][1] < first_stage[-1][1]


def test_the_operator_tuner_reads_rates_that_reach_back_into_the_planning_part() -> None:
    run = _steady_run("chronotope", seed=1)
    # a 5 s rate window one second into serving still sees 5 s of traffic: no drop to act on
    window = TunerSettings().rate_window_s
    assert all(t >= window for sched in run.schedules for t, _ in sched[1:])
    assert run.slo_miss_pct < 1.0


def test_the_inferline_envelope_stops_at_the_planning_trace_s_span() -> None:
    run = _steady_run("inferline", seed=2)
    # a 60 s window holds four planning traces' worth of steady traffic; compared with the
    # 15 s planning trace's total it would read as a fourfold burst and ratchet replicas up
    for sched in run.schedules:
        assert max(k for _, k in sched) <= 2 * sched[0][1]


def _one_stage() -> PipelineModel:
    # one replica serves 10 queries/s (batch 1, 100 ms) and costs 3.6/h: 0.36/h per query/s
    return PipelineModel(
        stages=(StageModel("s", {"T4": ((1, 0.1),)}),), edges=(), slo_s=1.0, prices={"T4": 3.6}
    )


def test_the_deadline_floor_charges_a_burst_where_it_arrives() -> None:
    # 5 queries/s for 100 s (last arrival 99.9 s), and 50 more at once at t = 50 s
    steady = np.arange(0.1, 100.0, 0.2)
    trace = np.sort(np.concatenate([steady, 50.0 + np.arange(50) * 0.001]))
    model = _one_stage()
    # averaged over the trace the work fits the one replica held anyway: the old floor is 3.6
    assert cost_floor(model, trace) == pytest.approx(3.6)
    # slot 50 (1 s, the SLO) holds 55 queries, served in slots 50 and 51 (slot 51's own five
    # wait for slot 52's spare capacity): 55 x 0.36 for those two slots; the other 97 billed
    # slots hold the one replica (slot 99 ends after the last arrival and is free)
    want = (97 * 3.6 + 55 * 0.36) / 99.9
    assert deadline_floor(model, trace, seed=0, served_share=1.0) == pytest.approx(want)
    # 1 % of 550 queries may miss: five fewer to serve in the burst
    want_99 = (97 * 3.6 + 50 * 0.36) / 99.9
    assert deadline_floor(model, trace, seed=0) == pytest.approx(want_99)


def test_no_row_that_meets_the_slo_costs_less_than_either_floor() -> None:
    model = _sample_model()
    rng = np.random.default_rng(3)
    # 100 queries/s with 5 s bursts at 400 every 20 s
    base = np.cumsum(rng.exponential(1 / 100, 12000))
    bursts = [k * 20 + np.sort(rng.uniform(0, 5, 1500)) for k in range(6)]
    arrivals = np.sort(np.concatenate([base[base < 120], *bursts]))
    planning, serving = arrivals[arrivals < 30], arrivals[arrivals >= 30] - 30
    floors = (cost_floor(model, serving), deadline_floor(model, serving, seed=0))
    met = 0
    for policy in ("peak", "hpa", "inferline", "chronotope"):
        run = run_policy(policy, model, planning, serving, seed=0)
        assert isinstance(run, InferenceRun)
        if run.slo_miss_pct <= 1.0:
            met += 1
            assert all(f <= run.cost_per_hour + 1e-9 for f in floors), (policy, run.cost_per_hour)
    assert met >= 2
    # the bursts are charged where they arrive: the deadline floor is the tighter one here
    assert floors[1] > floors[0]
