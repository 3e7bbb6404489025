"""Split a layer sequence into contiguous pipeline stages with balanced compute.

Binary search on the bottleneck stage time with a greedy feasibility check:
O(L log(1/eps)) per call, exact enough for planning, and cheap enough to call
for every (GPU type, microbatch, TP, PP) candidate. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["partition_layers"]


def _greedy(costs: Sequence[float], cap: float, stages: int) -> list[int] | None:
    bounds: list[int] = []
    acc = 0.0
    for i, c in enumerate(costs):
        if c > cap:
            return None
        if acc + c > cap:
            bounds.append(i)
            acc = 0.0
        acc += c
    bounds.append(len(costs))
    return bounds if len(bounds) <= stages else None


def partition_layers(costs: Sequence[float], stages: int) -> list[int]:
    """End index (exclusive) of each of exactly `stages` non-empty contiguous stages."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} layers into {stages} stages")
    lo, hi = max(costs), sum(costs)
    best = _greedy(costs, hi, stages) or [n]
    for _ in range(40):
        mid = (lo + hi) / 2
        got = _greedy(costs, mid, stages)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    # the greedy may use fewer stages; split the largest stages until there are `stages`
    bounds = list(best)
    while len(bounds) < stages:
        starts = [0, *bounds[:-1]]
        widest = max(
            (k for k in range(len(bounds)) if bounds[k] - starts[k] > 1),
            key=lambda k: bounds[k] - starts[k],
        )
        bounds.insert(widest, starts[widest] + (bounds[widest] - starts[widest]) // 2)
    return bounds
