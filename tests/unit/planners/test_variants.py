"""The variant planner (planners.variants) and its cost model (planners.llmcost)."""

from __future__ import annotations

import time

import pytest

from chronotope.planners.llmcost import GPUS, CostModel, ModelShape, Tier, Tiers
from chronotope.planners.variants import (
    GroupInput,
    GroupPlan,
    PlanSettings,
    RequestShape,
    VariantDemand,
    capacity_qps,
    plan_group,
)
from chronotope.solver.model import Reason

LLAMA_7B = ModelShape.of(13000, 6.7)
A100 = GPUS["A100-SXM4-80GB"]


def _zipf(n: int, total_qps: float, slo_ms: float = 2000) -> tuple[VariantDemand, ...]:
    weights = [1 / (i + 1) for i in range(n)]
    norm = sum(weights)
    return tuple(
        VariantDemand(f"v{i}", 1300, total_qps * w / norm, slo_ms) for i, w in enumerate(weights)
    )


def _plan(inp: GroupInput) -> GroupPlan:
    plan = plan_group(inp)
    assert isinstance(plan, GroupPlan), plan
    return plan


def test_llama_7b_shape_has_512_kib_of_kv_per_token() -> None:
    assert LLAMA_7B.kv_bytes_per_token == pytest.approx(512 * 1024, rel=0.05)


def test_iteration_cost_grows_with_deltas_and_kv() -> None:
    cost = CostModel(A100, LLAMA_7B)
    base = cost.iteration_s(0, 32, 32 * 1200, 0, 0)
    assert (
        cost.iteration_s(0, 32, 32 * 1200, 8 * 1300, 8)
        > cost.iteration_s(0, 32, 32 * 1200, 1300, 1)
        > base
    )
    assert cost.iteration_s(0, 32, 64 * 1200, 0, 0) > base
    # decode of 7B on an A100 is memory-bound: 13 GB at ~1.4 TB/s is about 10 ms
    assert 0.005 < cost.iteration_s(0, 1, 1000, 0, 0) < 0.02


def test_loading_from_disk_costs_more_than_from_host_and_nothing_when_resident() -> None:
    cost = CostModel(A100, LLAMA_7B, Tiers(disk_gbps=2.0))
    assert cost.load_s(1300, Tier.GPU) == 0
    assert 0 < cost.load_s(1300, Tier.HOST) < cost.load_s(1300, Tier.DISK)
    assert cost.kv_tokens(8 * 1300) < cost.kv_tokens(0)


def test_more_distinct_deltas_per_batch_lower_capacity() -> None:
    cost = CostModel(A100, LLAMA_7B)
    one = capacity_qps(cost, RequestShape(), delta_mib=1300, distinct=1, slots_mib=8 * 1300)
    eight = capacity_qps(cost, RequestShape(), delta_mib=1300, distinct=8, slots_mib=8 * 1300)
    assert one > eight > 0


def test_hot_variants_are_replicated_and_every_variant_routed() -> None:
    plan = _plan(GroupInput("g", LLAMA_7B, _zipf(64, 20.0), {A100.name: (A100, 16)}))
    hot = plan.placements["v0"]
    assert len(hot.replicas) >= 2
    assert hot.residency is Tier.GPU
    assert sum(hot.weights) == pytest.approx(1.0, abs=1e-3)
    assert set(plan.placements) == {f"v{i}" for i in range(64)}
    for replica in plan.replicas:
        assert len(replica.resident) <= plan.slots
    assert "resident on replicas" in hot.why
    assert "swap from host would cost" in hot.why


def test_fewest_gpus_for_the_traffic_and_more_traffic_more_replicas() -> None:
    gpus = {g: (GPUS[g], 16) for g in ("A100-SXM4-80GB", "H100-SXM5-80GB", "T4")}
    low = _plan(GroupInput("g", LLAMA_7B, _zipf(8, 2.0), gpus))
    high = _plan(GroupInput("g", LLAMA_7B, _zipf(8, 40.0), gpus))
    assert low.gpu_type == "H100-SXM5-80GB"  # fastest per GPU: fewest replicas
    assert len(high.replicas) > len(low.replicas)
    # 13 GB of weights plus KV do not fit a 15 GB T4: never chosen
    t4 = plan_group(GroupInput("g", LLAMA_7B, _zipf(8, 2.0), {"T4": (GPUS["T4"], 16)}))
    assert isinstance(t4, Reason)
    assert t4.code == "NoGpuFits"
    assert "T4" in t4.message


def test_min_replicas_is_honoured() -> None:
    variants = (*_zipf(4, 1.0)[:3], VariantDemand("pinned", 1300, 0.01, 2000, min_replicas=3))
    plan = _plan(GroupInput("g", LLAMA_7B, variants, {A100.name: (A100, 8)}))
    assert len(plan.placements["pinned"].replicas) == 3
    assert len(plan.replicas) >= 3


def test_tail_beyond_the_slots_stays_in_host_memory_or_on_disk() -> None:
    tiers = Tiers(host_mib=20 * 1300)
    plan = _plan(
        GroupInput(
            "g",
            LLAMA_7B,
            _zipf(100, 4.0),
            {A100.name: (A100, 2)},
            tiers=tiers,
            settings=PlanSettings(max_slots=8),
            replicas=2,
        )
    )
    tiers_seen = [p.residency for p in plan.placements.values()]
    assert tiers_seen.count(Tier.GPU) <= 2 * 8
    assert tiers_seen.count(Tier.HOST) == 20
    assert tiers_seen.count(Tier.DISK) == 100 - 20 - tiers_seen.count(Tier.GPU)
    cold = plan.placements["v99"]
    assert cold.residency is Tier.DISK
    assert cold.swap_ms > plan.placements["v25"].swap_ms > 0
    assert plan.placements["v25"].residency is Tier.HOST
    assert cold.replicas == (0, 1)  # loaded on demand wherever there is room


def test_replanning_the_same_traffic_moves_nothing() -> None:
    inp = GroupInput("g", LLAMA_7B, _zipf(40, 12.0), {A100.name: (A100, 8)}, replicas=4)
    first = _plan(inp)
    again = _plan(GroupInput(**{**inp.__dict__, "previous": first}))
    assert {v: p.replicas for v, p in again.placements.items()} == {
        v: p.replicas for v, p in first.placements.items()
    }


def test_a_slo_below_the_prefill_time_is_rejected_with_the_numbers() -> None:
    variants = (VariantDemand("fast", 1300, 1.0, 5.0), VariantDemand("ok", 1300, 1.0, 2000))
    plan = _plan(GroupInput("g", LLAMA_7B, variants, {A100.name: (A100, 2)}))
    assert "fast" in plan.rejected
    assert plan.rejected["fast"].code == "SloUnmeetable"
    assert "prefill" in plan.rejected["fast"].message
    assert "ok" in plan.placements


def test_planning_256_variants_on_32_replicas_is_quick() -> None:
    started = time.perf_counter()
    plan = _plan(GroupInput("g", LLAMA_7B, _zipf(256, 200.0), {A100.name: (A100, 32)}, replicas=32))
    assert len(plan.replicas) == 32
    # not a wall-time gate (bench/variant_planner.py measures it): a loose sanity bound
    assert time.perf_counter() - started < 30


def test_a_hot_variant_gets_a_second_replica_even_when_one_would_do() -> None:
    variants = (VariantDemand("hot", 1300, 1.5, 2000), VariantDemand("cold", 1300, 0.01, 2000))
    plan = _plan(GroupInput("g", LLAMA_7B, variants, {A100.name: (A100, 4)}))
    assert len(plan.replicas) == 2
    assert plan.placements["hot"].replicas == (0, 1)


def test_previous_holders_are_kept_only_within_capacity() -> None:
    gpus = {A100.name: (A100, 4)}
    quiet = _plan(GroupInput("g", LLAMA_7B, _zipf(8, 0.5), gpus, replicas=4))
    # traffic moves: the variants that shared replica 1 all become busy
    together = set(max(quiet.replicas, key=lambda r: len(r.resident)).resident)
    busy = tuple(
        VariantDemand(v.name, 1300, 2.0 if v.name in together else 0.01, 2000)
        for v in _zipf(8, 0.5)
    )
    plan = _plan(GroupInput("g", LLAMA_7B, busy, gpus, replicas=4, previous=quiet))
    assert len(together) >= 2
    holders = {i for v in together for i in plan.placements[v].replicas}
    assert len(holders) > 1  # spread out, not all left on their old replica


def test_a_gpu_type_with_no_gpus_is_not_planned_on() -> None:
    gpus = {A100.name: (A100, 0)}
    why = plan_group(GroupInput("g", LLAMA_7B, _zipf(4, 1.0), gpus))
    assert isinstance(why, Reason)
    assert "no GPUs of this type" in why.message


def test_the_type_whose_free_gpus_hold_the_plan_is_taken_first() -> None:
    gpus = {g: (GPUS[g], 16) for g in ("A100-SXM4-80GB", "H100-SXM5-80GB")}
    variants = _zipf(8, 2.0)
    best = _plan(GroupInput("g", LLAMA_7B, variants, gpus))
    assert best.gpu_type == "H100-SXM5-80GB"
    n = len(best.replicas)

    def plan(free: dict[str, int], admitted: dict[str, int] | None = None) -> GroupPlan:
        def stands(t: str, k: int) -> tuple[int, str]:
            if admitted is not None and admitted.get(t, 0) < k:
                return 2, "its queue does not admit them now"
            return (0, "") if free.get(t, 0) >= k else (1, "other work holds them")

        return _plan(GroupInput("g", LLAMA_7B, variants, gpus, fits_now=stands))

    # every H100 held by other work: the A100s free now serve it, and it says why
    moved = plan({"A100-SXM4-80GB": 16})
    assert moved.gpu_type == "A100-SXM4-80GB"
    assert moved.on_free == (
        f"on the GPUs free now ({n} x H100-SXM5-80GB would serve it, but other work holds them)"
    )
    assert moved.on_free in moved.why
    # the H100s free now hold it: the fewest GPUs, as before
    assert plan({"H100-SXM5-80GB": n, "A100-SXM4-80GB": 16}) == best
    # one H100 short of the plan does not hold it
    assert plan({"H100-SXM5-80GB": n - 1, "A100-SXM4-80GB": 16}).gpu_type == "A100-SXM4-80GB"
    # no type's free GPUs hold it: the planner's own type, and its pods wait
    waits = plan({})
    assert waits.gpu_type == "H100-SXM5-80GB"
    assert (
        waits.on_free
        == "nothing holds it now (H100-SXM5-80GB: other work holds them): its pods wait"
    )
    # the queue admits none on the H100s now: the A100s it admits, free or not, come first
    quota = plan({"H100-SXM5-80GB": 16}, {"A100-SXM4-80GB": 16})
    assert quota.gpu_type == "A100-SXM4-80GB"
    assert "nothing holds it now (A100-SXM4-80GB: other work holds them)" in quota.why
    assert plan({"H100-SXM5-80GB": 16, "A100-SXM4-80GB": 16}, {"A100-SXM4-80GB": 16}).on_free == (
        f"on the GPUs free now ({n} x H100-SXM5-80GB would serve it, "
        "but its queue does not admit them now)"
    )
    # a fixed fleet (the simulator's) is not moved
    fixed = GroupInput("g", LLAMA_7B, variants, gpus, replicas=2, fits_now=lambda t, k: (1, "held"))
    assert _plan(fixed).on_free == ""
