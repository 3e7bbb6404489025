"""InferLine-style planner: estimator, Algorithm 1 and 2, and our wider search."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec
from chronotope.planners.inferline import (
    Infeasible,
    PipelineModel,
    PlanOutcome,
    ScalingStep,
    StageConfig,
    StageModel,
    TunerInput,
    busiest_count,
    cost_per_hour,
    envelope,
    envelope_windows,
    minimum_service_time,
    model_from_spec,
    plan_chronotope,
    plan_inferline,
    plan_within,
    scaling_table,
    serve,
    simulate_pipeline,
    table_need,
    tune,
    whole_gpus,
)

SAMPLE = Path(__file__).resolve().parents[3] / "manifests/samples/inferencepipeline-video.yaml"


def _sample() -> PipelineModel:
    doc = yaml.safe_load(SAMPLE.read_text())
    return model_from_spec(InferencePipelineSpec.model_validate(doc["spec"]), {})


def _poisson(rate: float, n: int, seed: int = 0) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))


ONE = PipelineModel(
    stages=(StageModel("m", {"T4": ((1, 0.010), (4, 0.020))}),),
    edges=(),
    slo_s=0.1,
    prices={"T4": 1.0},
)


def test_an_idle_stage_serves_each_query_in_its_batch_1_latency() -> None:
    lat = simulate_pipeline(ONE, (StageConfig("T4", 4, 1),), [0.0, 1.0, 2.0])
    assert lat == pytest.approx([0.010, 0.010, 0.010])


@pytest.mark.parametrize("seed", range(6))
def test_a_fixed_replica_count_serves_as_the_general_queue_does(seed: int) -> None:
    """The estimator's fast path (one schedule entry) against the schedule-following queue."""
    rng = np.random.default_rng(seed)
    arrive = np.sort(rng.exponential(0.01, 300).cumsum())
    if seed % 2:
        arrive = np.round(arrive, 2)  # ties: equal arrivals join one batch
    batch, replicas = int(rng.integers(1, 9)), int(rng.integers(1, 4))
    latency = [0.0, *sorted(float(x) for x in rng.uniform(0.001, 0.05, batch))]
    fixed = serve(arrive, [(0.0, replicas)], batch, latency)
    general = serve(arrive, [(0.0, replicas), (1e18, replicas)], batch, latency)
    assert np.array_equal(fixed, general)


def test_a_burst_is_batched_and_queued() -> None:
    # four at once: one batch of 4 (20 ms); a fifth waits for the replica
    lat = simulate_pipeline(ONE, (StageConfig("T4", 4, 1),), [0.0, 0.0, 0.0, 0.0, 0.0])
    assert sorted(lat) == pytest.approx([0.020] * 4 + [0.030])


def test_branches_visit_their_fraction_and_the_query_waits_for_all() -> None:
    model = _sample()
    assert model.scale_factors() == pytest.approx([1.0, 0.3, 0.6])
    config = (
        StageConfig("T4", 1, 50),
        StageConfig("T4", 1, 50),
        StageConfig("A100-SXM4-80GB", 1, 50),
    )
    lat = simulate_pipeline(model, config, [10.0 * i for i in range(2000)])
    # unloaded: detect alone 12 ms, with pose 32 ms, with OCR 37 ms
    assert set(np.round(lat * 1000).astype(int)) == {12, 32, 37}
    share_ocr = float(np.mean(np.round(lat * 1000) == 37))
    assert share_ocr == pytest.approx(0.6, abs=0.04)


def test_an_slo_below_the_minimum_service_time_says_so() -> None:
    model = _sample()
    assert minimum_service_time(model) == pytest.approx(0.030)  # 5 ms detect + 25 ms OCR
    tight = PipelineModel(model.stages, model.edges, 0.020, model.prices)
    out = plan_inferline(tight, _poisson(100, 1000))
    assert isinstance(out, Infeasible)
    assert "20 ms" in out.reason
    assert "30 ms" in out.reason


def test_inferline_meets_the_slo_on_its_trace_and_cuts_cost() -> None:
    model = _sample()
    trace = _poisson(400, 8000)
    out = plan_inferline(model, trace)
    assert isinstance(out, PlanOutcome)
    lat = simulate_pipeline(whole_gpus(model), out.config, trace)
    assert float(np.percentile(lat, 99)) <= model.slo_s
    assert out.p99_s <= model.slo_s
    first = out.steps.index(next(s for s in out.steps if not s.startswith("add a replica")))
    assert first > 0  # Algorithm 1 added replicas before Algorithm 2 cut cost
    assert out.cost_per_hour == pytest.approx(cost_per_hour(whole_gpus(model), out.config))


def test_chronotope_is_never_dearer_and_uses_the_share() -> None:
    model = _sample()
    trace = _poisson(400, 8000)
    ours, theirs = plan_chronotope(model, trace), plan_inferline(model, trace)
    assert isinstance(ours, PlanOutcome)
    assert isinstance(theirs, PlanOutcome)
    assert ours.p99_s <= model.slo_s
    # the pose stage runs on half a T4: the same plan costs less with shares
    assert ours.cost_per_hour < theirs.cost_per_hour


def test_envelope_counts_the_busiest_window_of_each_length() -> None:
    env = envelope([0.0, 0.1, 0.2, 5.0, 5.05], 0.25, 2.0)
    assert [w for w, _ in env] == [0.25, 0.5, 1.0, 2.0]
    assert [q for _, q in env] == [3, 3, 3, 3]
    assert envelope([0.0, 0.1, 0.2, 0.3, 5.0], 1.0, 8.0)[-1] == (8.0, 5)


def test_the_scaling_table_meets_the_slo_at_each_rate_and_never_shrinks() -> None:
    model = _sample()
    trace = _poisson(300, 6000)
    plan = plan_chronotope(model, trace)
    assert isinstance(plan, PlanOutcome)
    table = scaling_table(model, plan.config, trace, factors=(0.5, 1.0, 2.0))
    mean = (len(trace) - 1) / (trace[-1] - trace[0])
    # a row's rate is its squeezed sample's busiest 5 s (the window the tuner reads)
    for row, f in zip(table, (0.5, 1.0, 2.0), strict=True):
        assert f * mean <= row.rate_qps <= 1.5 * f * mean
    for row, f in zip(table, (0.5, 1.0, 2.0), strict=True):
        sized = tuple(
            StageConfig(c.gpu_type, c.batch, k)
            for c, k in zip(plan.config, row.replicas, strict=True)
        )
        squeezed = (trace - trace[0]) / f
        assert float(np.percentile(simulate_pipeline(model, sized, squeezed), 99)) <= model.slo_s
        # and every stage keeps up with its share of the mean rate
        for st, c, k, visit in zip(
            model.stages, plan.config, row.replicas, model.scale_factors(), strict=True
        ):
            assert k * st.throughput(c.gpu_type, c.batch) >= f * mean * visit
    for lo, hi in pairwise(table):
        assert all(a <= b for a, b in zip(lo.replicas, hi.replicas, strict=True))
    assert sum(table[-1].replicas) > sum(table[0].replicas)


def test_the_scaling_table_ends_where_max_replicas_cannot_keep_up() -> None:
    model = _sample()
    capped = PipelineModel(
        tuple(s.__class__(s.name, s.profiles, 1, 3, s.share) for s in model.stages),
        model.edges,
        model.slo_s,
        model.prices,
    )
    trace = _poisson(100, 3000)
    plan = plan_chronotope(capped, trace)
    assert isinstance(plan, PlanOutcome)
    table = scaling_table(capped, plan.config, trace, factors=(1.0, 2.0, 50.0))
    assert len(table) == 2  # fifty times the rate needs more than three replicas a stage
    assert all(k <= 3 for row in table for k in row.replicas)


def test_table_need_takes_the_first_row_that_covers_the_rate_and_scales_past_the_end() -> None:
    table = (ScalingStep(100.0, (1, 1)), ScalingStep(200.0, (2, 1)), ScalingStep(400.0, (3, 2)))
    assert table_need(table, 50.0) == (1, 1)
    assert table_need(table, 100.0) == (1, 1)
    assert table_need(table, 150.0) == (2, 1)
    assert table_need(table, 400.0) == (3, 2)
    assert table_need(table, 800.0) == (6, 4)


def test_the_tuner_sizes_stages_from_the_table_when_it_has_one() -> None:
    stages = (
        StageModel("a", {"T4": ((1, 0.01),)}, 1, 10),
        StageModel("b", {"T4": ((1, 0.01),)}, 1, 10),
    )
    table = (ScalingStep(100.0, (2, 1)), ScalingStep(200.0, (3, 2)), ScalingStep(400.0, (5, 9)))

    def run(rate: float, recent: float, current: tuple[int, int], last: float | None) -> Any:
        return tune(
            stages,
            [2, 1],
            current,
            TunerInput(rate_qps=rate, recent_max_qps=recent, now_s=100.0),
            anchor_qps=100.0,
            last_scale_s=last,
            down_delay_s=30.0,
            table=table,
        )

    up = run(150.0, 150.0, (2, 1), None)
    assert (up.mode, up.replicas) == ("ScalingUp", (3, 2))
    # proportional scaling would have asked for ceil(2 * 1.5 - 0.25) = 3 and ceil(1.5 - 0.25) = 2;
    # at 350 queries/s the table asks for 5 and 9, not 7 and 4
    assert run(350.0, 350.0, (3, 2), None).replicas == (5, 9)
    assert run(90.0, 150.0, (3, 2), 90.0).mode == "Steady"  # within the delay: hold
    down = run(90.0, 90.0, (3, 2), 50.0)
    assert (down.mode, down.replicas) == ("ScalingDown", (2, 1))
    capped = run(5000.0, 5000.0, (5, 9), None)
    assert capped.replicas == (10, 10)  # past the table, within maxReplicas


def test_a_row_covers_live_traffic_only_if_no_window_of_its_envelope_is_exceeded() -> None:
    # rows sized on bursty samples: busiest 5 s well above the busiest 20 s
    table = (
        ScalingStep(100.0, (1, 1), ((5.0, 100.0), (10.0, 70.0), (20.0, 50.0))),
        ScalingStep(200.0, (2, 1), ((5.0, 200.0), (10.0, 140.0), (20.0, 100.0))),
        ScalingStep(400.0, (3, 2), ((5.0, 400.0), (10.0, 280.0))),
    )
    assert table_need(table, 90.0, ((10.0, 70.0), (20.0, 50.0))) == (1, 1)
    # the same 5 s rate, sustained: 90 queries/s over 20 s was never in the first sample
    assert table_need(table, 90.0, ((10.0, 90.0), (20.0, 90.0))) == (2, 1)
    # a window the row was not sized on is not compared (the third row has no 20 s)
    assert table_need(table, 300.0, ((10.0, 250.0), (20.0, 250.0))) == (3, 2)
    # past the end: the last row, scaled by the window that goes furthest past it
    assert table_need(table, 400.0, ((10.0, 560.0),)) == (6, 4)
    # a row from before envelopes compares the rate alone
    assert table_need((ScalingStep(100.0, (1,)),), 90.0, ((20.0, 500.0),)) == (1,)


def test_scaling_table_rows_carry_their_sample_s_envelope_up_to_half_its_span() -> None:
    model = _sample()
    trace = _poisson(300, 6300)  # 21 s at 300 queries/s
    plan = plan_chronotope(model, trace)
    assert isinstance(plan, PlanOutcome)
    table = scaling_table(model, plan.config, trace, factors=(0.25, 1.0, 2.0))
    squeezed = {0.25: trace / 0.25, 1.0: trace, 2.0: trace / 2.0}
    for row, f in zip(table, (0.25, 1.0, 2.0), strict=True):
        windows = [w for w, _ in row.envelope]
        assert windows[0] == 5.0
        assert row.rate_qps == row.envelope[0][1]
        span = float(squeezed[f][-1] - squeezed[f][0])
        assert all(w <= span / 2 for w in windows[1:])
        for w, r in row.envelope:
            assert r == pytest.approx(
                busiest_count(squeezed[f] - squeezed[f][0], w) / w
                if span > w
                else len(trace) / span
            )
    # 84 s at a quarter of the rate: 5, 10, 20 and 40 s; 21 s: 5 and 10 s; 10.5 s: 5 s
    assert [[w for w, _ in row.envelope] for row in table] == [
        [5.0, 10.0, 20.0, 40.0],
        [5.0, 10.0],
        [5.0],
    ]
    assert envelope_windows(5.0, 60.0) == [5.0, 10.0, 20.0, 40.0, 60.0]


def _gpus_by_type(model: PipelineModel, config: tuple[StageConfig, ...]) -> dict[str, float]:
    use: dict[str, float] = {}
    for stage, c in zip(model.stages, config, strict=True):
        use[c.gpu_type] = use.get(c.gpu_type, 0.0) + c.replicas * stage.share
    return use


def _over(model: PipelineModel, caps: dict[str, float]) -> Any:
    def over(config: tuple[StageConfig, ...]) -> float:
        use = _gpus_by_type(model, config)
        return sum(max(0.0, n - caps.get(g, 0.0)) for g, n in use.items())

    return over


def test_a_plan_that_fits_is_not_cut() -> None:
    model, trace = _sample(), _poisson(400, 8000)
    free = plan_chronotope(model, trace)
    assert isinstance(free, PlanOutcome)
    within = plan_within(model, trace, _over(model, {"T4": 100, "A100-SXM4-80GB": 100}))
    assert isinstance(within, PlanOutcome)
    assert within.config == free.config


def test_a_plan_over_the_gpus_it_may_have_moves_stages_to_types_with_room() -> None:
    """The sample's plan holds 4 T4 GPUs; with 2, detect moves to an A100 and the SLO holds."""
    model, trace = _sample(), _poisson(400, 8000)
    free = plan_chronotope(model, trace)
    assert isinstance(free, PlanOutcome)
    assert _gpus_by_type(model, free.config)["T4"] == 4
    caps = {"T4": 2.0, "A100-SXM4-80GB": 100.0}
    within = plan_within(model, trace, _over(model, caps))
    assert isinstance(within, PlanOutcome)
    use = _gpus_by_type(model, within.config)
    assert use.get("T4", 0) <= 2
    assert within.config[0].gpu_type == "A100-SXM4-80GB"
    assert within.p99_s <= model.slo_s
    assert float(np.percentile(simulate_pipeline(model, within.config, trace), 99)) <= model.slo_s
    assert within.cost_per_hour >= free.cost_per_hour  # the cut plan is never cheaper
    assert any(s.endswith("(to fit the GPUs it may have)") for s in within.steps)


def test_no_plan_within_too_few_gpus_is_infeasible() -> None:
    model, trace = _sample(), _poisson(400, 8000)
    out = plan_within(model, trace, _over(model, {"T4": 0.5, "A100-SXM4-80GB": 1.0}))
    assert isinstance(out, Infeasible)
    assert "GPUs it may have" in out.reason
