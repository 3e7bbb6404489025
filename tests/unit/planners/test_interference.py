"""The co-location interference model (planners.interference) and the pair simulator.

Fixtures are two kernels streams cut from Orion's profiles (eth-easl/orion
`benchmarking/model_kernels/`, MIT): written inline so the test needs no data.
"""

from __future__ import annotations

import pytest

from chronotope.planners.interference import (
    Kernel,
    KernelKind,
    KernelTrace,
    best_effort_share,
    class_trace,
    kernel_slowdown,
    parse_kernels,
    predict_slowdown,
)
from chronotope.sim.colocation import PairSetup, simulate_pair
from chronotope.solver.model import Reason

C, M, U = KernelKind.COMPUTE, KernelKind.MEMORY, KernelKind.UNKNOWN
HP = KernelTrace("hp_fwd", (Kernel(C, 98, 100_000), Kernel(M, 64, 40_000)) * 10)
BE = KernelTrace("be_fb1", (Kernel(M, 400, 60_000), Kernel(C, 200, 120_000)) * 20)


def test_two_memory_bound_kernels_hurt_each_other_more_than_complementary_ones() -> None:
    assert kernel_slowdown(M, 20, M, 20) > kernel_slowdown(M, 20, C, 20) >= 1.0
    assert kernel_slowdown(C, 20, C, 20) > kernel_slowdown(C, 20, M, 20)
    # more SMs wanted than the GPU has: shared in proportion
    assert kernel_slowdown(C, 80, C, 80) == pytest.approx(2.0)
    assert kernel_slowdown(U, 10, M, 10) == kernel_slowdown(M, 10, M, 10)


def test_capping_the_best_effort_sms_lowers_the_predicted_slowdown() -> None:
    full = predict_slowdown(HP, BE, 1.0)
    capped = predict_slowdown(HP, BE, 0.2)
    assert full > capped >= 1.0


def test_best_effort_share_fits_the_budget_or_says_why() -> None:
    share = best_effort_share(HP, BE, budget=1.5)
    assert isinstance(share, tuple)
    percent, predicted = share
    assert 0 < percent <= 100
    assert predicted <= 1.5
    tight = best_effort_share(HP, BE, budget=1.01)
    assert isinstance(tight, Reason)
    assert tight.code == "InterferenceOverBudget"
    assert "1.01x budget" in tight.message
    impossible = best_effort_share(HP, BE, budget=0.9)
    assert isinstance(impossible, Reason)
    assert impossible.code == "ImpossibleBudget"


def test_orion_profiles_parse_and_placeholders_are_refused() -> None:
    text = "Name,Profile,Memory_footprint,SM_usage,Duration\nConv,1,0,98,100480\nBN,0,0,64,40480\n"
    trace = parse_kernels("resnet50_4_fwd", text)
    assert isinstance(trace, KernelTrace)
    assert trace.total_ns == 140960
    placeholder = parse_kernels(
        "x_fb0", "Name,Profile,Memory_footprint,SM_usage,Duration\nk,-1,1,1,7\n"
    )
    assert isinstance(placeholder, Reason)
    assert placeholder.code == "ProfileEmpty"
    broken = parse_kernels("y", "Name,Profile\nk,notanumber\n")
    assert isinstance(broken, Reason)


def test_declared_classes_stand_in_for_missing_profiles() -> None:
    compute, memory = class_trace("a", "ComputeBound"), class_trace("b", "MemoryBound")
    # complementary classes are predicted to interfere less than two of a kind
    assert predict_slowdown(compute, memory) < predict_slowdown(
        memory, class_trace("c", "MemoryBound")
    )


@pytest.mark.parametrize(
    "policy", ["exclusive", "packing", "orion", "chronotope", "chronotope-gated"]
)
def test_pair_simulation_reports_slowdown_against_a_dedicated_gpu(policy: str) -> None:
    run = simulate_pair(policy, HP, BE, PairSetup(requests=40, budget=1.5))
    assert run.dedicated_p99_ms > 0
    assert run.hp_p99_slowdown >= 0.999
    if policy == "exclusive":
        assert run.gpus == 2
        assert run.be_throughput_norm == 0.5
    if policy == "packing":
        assert run.hp_p99_slowdown > 1.05  # unmanaged sharing hurts the HP tail
        assert 0 < run.be_progress < 1


def test_orion_gating_protects_the_tail_better_than_packing() -> None:
    setup = PairSetup(requests=60)
    packing = simulate_pair("packing", HP, BE, setup)
    orion = simulate_pair("orion", HP, BE, setup)
    assert orion.hp_p99_slowdown < packing.hp_p99_slowdown
    assert orion.be_progress < packing.be_progress
