"""The variant-serving simulator (sim.serving) and `chronotope simulate variants`."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from chronotope.cli import main
from chronotope.planners.llmcost import GPUS, CostModel, ModelShape
from chronotope.sim import serving
from chronotope.sim.inference import load_requests
from chronotope.sim.serving import (
    SERVING_POLICIES,
    ServingSetup,
    Workload,
    max_rate_at_slo,
    simulate,
    zipf_variants,
)

TRACE = Path(__file__).parents[2] / "fixtures" / "azure-llm" / "conv_head600.csv"
COST = CostModel(GPUS["A100-SXM4-80GB"], ModelShape.of(13000, 6.7))


def _work(variants: int, n: int = 600) -> Workload:
    trace = load_requests(TRACE)
    return Workload(
        trace.times[:n],
        trace.prompt_tokens[:n],
        trace.output_tokens[:n],
        zipf_variants(n, variants, 1.0, seed=0),
    )


def test_trace_tokens_are_read_from_azure_csv_and_mooncake_jsonl(tmp_path: Path) -> None:
    trace = load_requests(TRACE)
    assert len(trace.times) == 600
    assert trace.times[0] == 0
    assert np.all(np.diff(trace.times) >= 0)
    assert trace.prompt_tokens[0] == 374
    assert trace.output_tokens[0] == 44
    jsonl = tmp_path / "mooncake.jsonl"
    jsonl.write_text(
        '{"timestamp": 1000, "input_length": 10, "output_length": 3}\n'
        '{"timestamp": 0, "input_length": 7, "output_length": 2}\n'
    )
    moon = load_requests(jsonl)
    assert list(moon.times) == [0.0, 1.0]
    assert list(moon.prompt_tokens) == [7, 10]


def test_zipf_popularity_ranks_variant_zero_first() -> None:
    v = zipf_variants(20000, 16, 1.0, seed=1)
    counts = np.bincount(v, minlength=16)
    assert counts[0] > counts[1] > counts[8] > 0
    assert counts[0] / 20000 == pytest.approx(1 / sum(1 / k for k in range(1, 17)), rel=0.05)


def test_at_rate_rescales_the_time_axis_only() -> None:
    work = _work(4)
    fast = work.at_rate(work.qps * 3)
    assert fast.qps == pytest.approx(work.qps * 3)
    assert np.array_equal(fast.prompt, work.prompt)
    assert fast.times[-1] == pytest.approx(work.times[-1] / 3)


@pytest.mark.parametrize("policy", SERVING_POLICIES)
def test_every_policy_serves_every_request_at_a_light_rate(policy: str) -> None:
    work = _work(8).at_rate(1.0)
    run = simulate(policy, ServingSetup(4, COST, 8), work)
    assert run.requests == 600
    assert run.complete
    assert run.p99_latency_ms < float("inf")
    assert 0 <= run.slo_attainment_pct <= 100


def test_deltazip_never_batches_more_distinct_deltas_than_its_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []
    step = serving._Engine.step

    def spy(self: serving._Engine, gpu: serving._Gpu, t: float) -> None:
        step(self, gpu, t)
        seen.append(len(gpu.deltas))

    monkeypatch.setattr(serving._Engine, "step", spy)
    simulate("deltazip", ServingSetup(2, COST, 32, max_deltas=3), _work(32).at_rate(8.0))
    assert seen
    assert max(seen) <= 3
    assert max(seen) == 3  # and the limit is reached under load


def test_resident_plan_needs_no_swaps_when_every_delta_fits() -> None:
    work = _work(8).at_rate(4.0)
    ours = simulate("chronotope", ServingSetup(4, COST, 8), work)
    lru = simulate("deltazip", ServingSetup(4, COST, 8, max_deltas=2), work)
    assert ours.swaps_per_1k == 0
    assert lru.swaps_per_1k > 0


def test_full_models_swap_far_more_slowly_than_deltas() -> None:
    work = _work(16).at_rate(2.0)
    whole = simulate("swap", ServingSetup(2, COST, 16), work)
    deltas = simulate("deltazip", ServingSetup(2, COST, 16), work)
    assert whole.p99_ttft_ms > deltas.p99_ttft_ms


def test_max_rate_brackets_the_slo_boundary() -> None:
    setup = ServingSetup(2, COST, 8)
    work = _work(8)
    best, runs = max_rate_at_slo("deltazip", setup, work, rel_tol=0.1)
    assert best > 0
    passing = [r for r in runs if r.complete and r.slo_attainment_pct >= 99]
    failing = [r for r in runs if not (r.complete and r.slo_attainment_pct >= 99)]
    assert max(r.qps for r in passing) == pytest.approx(best, rel=1e-3)
    assert failing
    assert min(r.qps for r in failing if r.qps > best) <= best * 1.1 + 1e-6
    # the found rate really meets the SLO when run to the end
    assert simulate("deltazip", setup, work.at_rate(best)).slo_attainment_pct >= 99


def test_cli_writes_the_summary_the_curve_and_the_plot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "simulate",
            "variants",
            "--trace",
            str(TRACE),
            "--variants",
            "16",
            "--gpus",
            "2",
            "--policies",
            "deltazip,chronotope",
            "--seed",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["policy"] for r in rows] == ["deltazip", "chronotope"]
    assert list(rows[0]) == [
        "policy",
        "seed",
        "variants",
        "gpus",
        "requests",
        "slo_attainment_pct",
        "p99_ttft_ms",
        "p99_latency_ms",
        "swaps_per_1k",
        "max_qps_at_slo",
    ]
    assert all(float(r["max_qps_at_slo"]) > 0 for r in rows)
    assert rows[0]["seed"] == "3"
    assert rows[0]["requests"] == "600"
    assert (out / "attainment.png").stat().st_size > 0
    assert len(list(csv.DictReader((out / "attainment.csv").open()))) >= 4


def test_a_request_whose_kv_cache_can_never_fit_is_a_miss_not_a_deadlock() -> None:
    work = _work(4, n=50).at_rate(1.0)
    huge = work.prompt.copy()
    huge[0] = 10_000_000  # more tokens than any GPU's KV cache holds
    run = simulate(
        "deltazip", ServingSetup(2, COST, 4), Workload(work.times, huge, work.output, work.variant)
    )
    assert run.requests == 50
    assert run.slo_attainment_pct == pytest.approx(98.0)  # the other 49 are served in time
