"""The kernel replay and the gated co-location decision (planners.kernel_replay).

Streams are small and written inline: the shapes (a long High request of
full-GPU kernels, a best-effort stream of short or long kernels) are what
Orion's profiles show, the numbers come from the model itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from chronotope.planners.interference import DEFAULT, Kernel, KernelKind, KernelTrace
from chronotope.planners.kernel_replay import (
    Estimator,
    OrionThresholds,
    arrivals,
    gated_share,
    gated_slowdown,
    orion_gate,
    replay,
)
from chronotope.sim.colocation import PairSetup, place_cluster, simulate_pair

C, M = KernelKind.COMPUTE, KernelKind.MEMORY
HP = KernelTrace("hp_fwd", (Kernel(C, 80, 20_000),) * 20)
"""A 400 us request of full-GPU compute kernels."""
SHORT = KernelTrace("short_fb1", (Kernel(M, 80, 1_000),) * 50)
"""Best-effort kernels of 1 us: what runs on when a request arrives is a sliver of it."""
LONG = KernelTrace("long_fb1", (Kernel(M, 80, 400_000),) * 5)
"""Best-effort kernels as long as the whole request: a request arriving meets one."""
EST = Estimator(requests=80)


def test_the_gate_is_orions_rule() -> None:
    """scheduler_eval.cpp: idle HP admits anything; in service, other class and <= SM threshold."""
    gate = orion_gate(OrionThresholds())
    assert gate(Kernel(C, 400, 1_000), None, False)  # idle: anything runs
    assert gate(Kernel(M, 80, 1_000), Kernel(C, 80, 1_000), True)  # other class, 80 SMs
    assert not gate(Kernel(M, 120, 1_000), Kernel(C, 10, 1_000), True)  # over the threshold
    assert not gate(Kernel(C, 10, 1_000), Kernel(C, 60, 1_000), True)  # same class
    assert gate(Kernel(KernelKind.UNKNOWN, 10, 1_000), Kernel(C, 60, 1_000), True)
    assert not orion_gate(OrionThresholds(sm_threshold=40))(
        Kernel(M, 60, 1_000), Kernel(C, 10, 1_000), True
    )


def test_a_high_priority_stream_leaves_the_best_effort_what_the_hp_kernel_does_not_use() -> None:
    arr = arrivals(HP, 0.1, 80, seed=3)
    gate = orion_gate(OrionThresholds())
    alone, _ = replay(HP, None, arr, DEFAULT, be_cap=80, gate=None)
    plain, plain_progress = replay(HP, SHORT, arr, DEFAULT, be_cap=80, gate=gate)
    prio, prio_progress = replay(HP, SHORT, arr, DEFAULT, be_cap=80, gate=gate, priority=True)
    p99 = [float(np.percentile(x, 99)) for x in (alone, plain, prio)]
    # the admitted memory-bound kernels share SMs in proportion without priority (about 2x)
    assert p99[1] / p99[0] > 1.5
    # with it the full-GPU HP kernels keep every SM: the BE kernels wait (1 us blocks drain)
    assert p99[2] / p99[0] < 1.01
    assert prio_progress < plain_progress


def test_a_long_resident_best_effort_block_delays_the_hp_kernel_until_it_ends() -> None:
    """Priority decides who gets SMs that free up; it does not preempt blocks already running."""
    arr = arrivals(HP, 0.1, 80, seed=3)
    gate = orion_gate(OrionThresholds())
    alone, _ = replay(HP, None, arr, DEFAULT, be_cap=80, gate=None)
    short, _ = replay(HP, SHORT, arr, DEFAULT, be_cap=80, gate=gate, priority=True)
    long, _ = replay(HP, LONG, arr, DEFAULT, be_cap=80, gate=gate, priority=True)
    ded = float(np.percentile(alone, 99))
    assert float(np.percentile(long, 99)) / ded > float(np.percentile(short, 99)) / ded + 0.2


def test_gating_protects_the_tail_that_packing_hurts() -> None:
    arr = arrivals(HP, 0.1, 80, seed=3)
    alone, _ = replay(HP, None, arr, DEFAULT, be_cap=80, gate=None)
    packed, packed_progress = replay(HP, SHORT, arr, DEFAULT, be_cap=80, gate=None)
    gated, gated_progress = replay(
        HP, SHORT, arr, DEFAULT, be_cap=80, gate=orion_gate(OrionThresholds()), priority=True
    )
    p99 = [float(np.percentile(x, 99)) for x in (alone, packed, gated)]
    assert p99[1] / p99[0] > 1.5  # full-GPU kernels side by side: about 2x
    assert p99[2] / p99[0] < 1.05  # a 1 us residual on a 400 us request
    assert 0.85 < gated_progress < packed_progress < 1.0


def test_short_best_effort_kernels_share_at_full_percent() -> None:
    plan = gated_share(HP, SHORT, 1.10, DEFAULT, est=EST)
    assert plan is not None
    assert plan.percent == 100
    assert plan.slowdown <= 1.10
    assert plan.progress > 0.85
    assert plan.slowdown == gated_slowdown(HP, SHORT, 100, DEFAULT, est=EST)[0]


def test_long_kernels_get_a_gpu_of_their_own_when_a_fitting_cap_starves_them() -> None:
    """A request meets a 400 us kernel: only a cap bounds that, and a low cap starves the BE."""
    full, _ = gated_slowdown(HP, LONG, 100, DEFAULT, est=EST)
    assert full > 1.20
    assert gated_share(HP, LONG, 1.20, DEFAULT, est=EST) is None
    anything = Estimator(requests=80, min_progress=0.0)
    plan = gated_share(HP, LONG, 1.20, DEFAULT, est=anything)
    assert plan is not None
    assert plan.percent < 100
    assert plan.slowdown <= 1.20
    assert plan.progress < EST.min_progress  # what the default refuses
    above = gated_slowdown(HP, LONG, plan.percent + 10, DEFAULT, est=anything)[0]
    assert above > 1.20  # the highest percent that fits


def test_the_simulator_runs_the_decision_on_arrivals_it_did_not_plan_on() -> None:
    setup = PairSetup(requests=80, seed=1)
    assert setup.estimator().seed != setup.seed
    run = simulate_pair("chronotope-gated", HP, SHORT, setup)
    plan = gated_share(HP, SHORT, setup.budget, DEFAULT, est=setup.estimator())
    assert plan is not None
    assert run.mps_percent == plan.percent
    assert run.gpus == 1
    assert run.hp_p99_slowdown < 1.10
    static = simulate_pair("chronotope", HP, SHORT, setup)
    assert static.be_throughput_norm < run.be_throughput_norm  # a static cap starves it


@pytest.mark.parametrize("policy", ["chronotope", "chronotope-gated"])
def test_the_cluster_scenario_pairs_only_what_the_decision_admits(policy: str) -> None:
    setup = PairSetup(requests=60)
    placed = place_cluster(policy, [HP, HP], [SHORT, LONG], setup)
    admitted = {be.name for be in (SHORT, LONG) if simulate_pair(policy, HP, be, setup).gpus == 1}
    assert {be for _, be in placed.pairs} <= admitted
    assert placed.gpus == 4 - len(placed.pairs)


def test_the_prediction_is_the_worst_window_of_requests() -> None:
    est = Estimator(requests=120, window=40)
    got, progress = gated_slowdown(HP, LONG, 100, DEFAULT, est=est)
    arr = arrivals(HP, est.load, est.requests, est.seed)
    alone, _ = replay(HP, None, arr, DEFAULT, be_cap=80, gate=None)
    lat, want_progress = replay(
        HP, LONG, arr, DEFAULT, be_cap=80, gate=orion_gate(OrionThresholds()), priority=True
    )
    ratios = [
        float(np.percentile(lat[i : i + 40], 99) / np.percentile(alone[i : i + 40], 99))
        for i in (0, 40, 80)
    ]
    assert got == pytest.approx(max(ratios))
    assert max(ratios) > min(ratios)  # the windows differ: the worst one decides
    assert progress == want_progress
