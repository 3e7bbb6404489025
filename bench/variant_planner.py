#!/usr/bin/env python3
"""ModelVariant planner speed and the simulator goal's ratios, in one run.

1. Planning time of `planners.variants.plan_group` for 256 variants (Zipf 1.0
   traffic) across 32 replicas, with and without the previous plan (a
   re-plan), and for 1,024 variants on 64 replicas. The goal is < 2 s.
2. `max_qps_at_slo` of deltazip, chronotope (and dedicated) on the Azure LLM
   conversation trace for 16, 64 and 256 variants on 8 A100s, and the ratios
   the ModelVariant issue asks for (chronotope >= 1.3x deltazip, >= 3x
   dedicated), plus swaps per 1,000 requests at deltazip's best rate.
Usage:
    .venv/bin/python bench/variant_planner.py [--trace ../shared/data/azure-llm/...]
        [--variants 16,64,256] [--seeds 0] [--no-sim]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from chronotope.planners.llmcost import GPUS, CostModel, ModelShape
from chronotope.planners.variants import GroupInput, GroupPlan, VariantDemand, plan_group
from chronotope.sim.inference import load_requests
from chronotope.sim.serving import ServingSetup, Workload, max_rate_at_slo, simulate, zipf_variants

A100 = GPUS["A100-SXM4-80GB"]
SHAPE = ModelShape.of(13000, 6.7)
TRACE = Path(__file__).parents[1] / ".." / "shared" / "data" / "azure-llm"


def _variants(n: int, qps: float) -> tuple[VariantDemand, ...]:
    norm = sum(1 / (i + 1) for i in range(n))
    return tuple(VariantDemand(f"v{i}", 1300, qps / (i + 1) / norm, 2000) for i in range(n))


def planning(n: int, replicas: int) -> None:
    inp = GroupInput("g", SHAPE, _variants(n, 6.0 * replicas), {A100.name: (A100, replicas)})
    started = time.perf_counter()
    plan = plan_group(inp)
    first = time.perf_counter() - started
    assert isinstance(plan, GroupPlan)
    again = GroupInput(
        **{**inp.__dict__, "previous": plan, "variants": _variants(n, 5.0 * replicas)}
    )
    started = time.perf_counter()
    replanned = plan_group(again)
    second = time.perf_counter() - started
    assert isinstance(replanned, GroupPlan)
    moved = sum(
        1
        for v, p in replanned.placements.items()
        if set(p.replicas) != set(plan.placements[v].replicas)
    )
    print(
        f"plan {n} variants on {len(plan.replicas)} replicas: {first * 1000:.1f} ms; "
        f"re-plan at -17% traffic: {second * 1000:.1f} ms, {moved} variants' routes changed"
    )


def goal(trace: Path, variants: int, seed: int, policies: tuple[str, ...]) -> None:
    t = load_requests(trace)
    work = Workload(
        t.times, t.prompt_tokens, t.output_tokens, zipf_variants(len(t.times), variants, 1.0, seed)
    )
    setup = ServingSetup(8, CostModel(A100, SHAPE), variants)
    best = {}
    for policy in policies:
        started = time.perf_counter()
        best[policy], _ = max_rate_at_slo(policy, setup, work)
        print(
            f"  {variants:4d} variants seed {seed} {policy:10s} max_qps_at_slo={best[policy]:7.3f}"
            f" ({time.perf_counter() - started:.0f} s)"
        )
    at = work.at_rate(best["deltazip"])
    dz, ours = simulate("deltazip", setup, at), simulate("chronotope", setup, at)
    dedicated = best.get("dedicated", 0.0)
    print(
        f"  -> chronotope/deltazip {best['chronotope'] / best['deltazip']:.2f}x, "
        + (f"chronotope/dedicated {best['chronotope'] / dedicated:.1f}x, " if dedicated else "")
        + f"swaps/1k at {best['deltazip']:.2f} QPS: deltazip {dz.swaps_per_1k}, chronotope "
        f"{ours.swaps_per_1k} ({1 - ours.swaps_per_1k / max(dz.swaps_per_1k, 1e-9):.0%} fewer); "
        f"P99 TTFT {dz.p99_ttft_ms:.0f} vs {ours.p99_ttft_ms:.0f} ms"
    )


def main() -> None:
    """Print planning times, then the simulator goal for each variant count and seed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", type=Path, default=TRACE / "AzureLLMInferenceTrace_conv.csv")
    parser.add_argument("--variants", default="16,64,256")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--no-sim", action="store_true")
    args = parser.parse_args()
    planning(256, 32)
    planning(1024, 64)
    if args.no_sim:
        return
    for variants in (int(v) for v in args.variants.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            goal(args.trace, variants, seed, ("dedicated", "deltazip", "chronotope"))


if __name__ == "__main__":
    main()
