#!/usr/bin/env python3
"""Planner speed: 8 stages x 4 GPU types x 8 batch sizes, InferLine's planner and ours.

A synthetic chain-with-branches pipeline (seeded): each stage's batch latency
grows sub-linearly with the batch on four GPU types of different speed and
price; the sample trace is 60 s of Poisson arrivals. Prints wall time, search
evaluations and the plans' cost, and how long the tuner's scaling table for our
plan takes. The goal is < 10 s per plan. Usage:
    .venv/bin/python bench/inferline_planner.py [--qps 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from chronotope.planners.inferline import (
    PipelineModel,
    PlanOutcome,
    StageModel,
    plan_chronotope,
    plan_inferline,
    scaling_table,
)

TYPES = {"T4": (1.0, 0.35), "L4": (1.6, 0.8), "A10G": (2.0, 1.0), "A100": (4.0, 2.9)}
BATCHES = (1, 2, 4, 8, 16, 32, 48, 64)


def pipeline(seed: int) -> PipelineModel:
    rng = np.random.default_rng(seed)
    stages = []
    for i in range(8):
        base = float(rng.uniform(0.004, 0.02))
        profiles = {
            g: tuple((b, base / speed * (1 + 0.35 * (b - 1) ** 0.8)) for b in BATCHES)
            for g, (speed, _) in TYPES.items()
        }
        stages.append(
            StageModel(f"s{i}", profiles, max_replicas=64, share=0.5 if i % 3 == 2 else 1.0)
        )
    edges = [(i, i + 1, 1.0) for i in range(3)] + [
        (3, 4, 0.5),
        (3, 5, 0.7),
        (4, 6, 1.0),
        (5, 7, 0.4),
    ]
    return PipelineModel(tuple(stages), tuple(edges), 0.4, {g: p for g, (_, p) in TYPES.items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qps", type=float, default=200.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = pipeline(args.seed)
    rng = np.random.default_rng(args.seed)
    trace = np.cumsum(rng.exponential(1 / args.qps, int(60 * args.qps)))
    print(f"8 stages x {len(TYPES)} GPU types x {len(BATCHES)} batch sizes, {len(trace)} queries")
    print(f"{'planner':<12}{'seconds':>9}{'evaluations':>13}{'cost/h':>9}{'p99 ms':>8}")
    plans: dict[str, PlanOutcome] = {}
    for name, planner in (("inferline", plan_inferline), ("chronotope", plan_chronotope)):
        start = time.perf_counter()
        out = planner(model, trace, seed=args.seed)
        took = time.perf_counter() - start
        assert isinstance(out, PlanOutcome), out
        plans[name] = out
        p99_ms = out.p99_s * 1000
        print(f"{name:<12}{took:>9.2f}{out.evaluations:>13}{out.cost_per_hour:>9.2f}{p99_ms:>8.1f}")
    # the operator makes the tuner's scaling table with every plan (ours): time it too
    start = time.perf_counter()
    table = scaling_table(model, plans["chronotope"].config, trace, seed=args.seed)
    took = time.perf_counter() - start
    print(f"scaling table: {len(table)} rates in {took:.2f} s (the operator adds it to each plan)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
