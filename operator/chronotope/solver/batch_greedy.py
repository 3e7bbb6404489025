"""Candidate nodes and a greedy warm start for the CP-SAT batch planner.

A CP-SAT model over every node for every pending pod is slow to build, and
when every pod is offered the same few tightest nodes the solver may not
find a feasible solution within its limit. Here a greedy pass over the
simulator's and the extender's arrays (`ClusterState`) places the workloads
one by one on a residual copy (best fit: the node with the least free GPU
share, then the least free CPU), and each workload's candidate nodes are the
best-fit nodes *at the moment the greedy pass reaches it*, plus the node the
pass chose. Candidates therefore differ from workload to workload, the greedy
placement is a complete feasible solution to hint to CP-SAT, and the solver
only has to improve on it (stopping at a small relative gap). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from chronotope.solver.model import ClusterSnapshot, PlacementStrategy, Workload
from chronotope.solver.state import BoolArray, ClusterState, IntArray, PodSpec

__all__ = ["GreedyPick", "greedy_candidates"]


@dataclass
class GreedyPick:
    """The greedy pass's choice for one workload: a GPU model and member -> (node, GPU indices)."""

    gpu_model: str
    members: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)


def _tightness(st: ClusterState) -> tuple[IntArray, IntArray]:
    """Sort keys for best fit: free GPU share, then free CPU."""
    return st.total_left, st.cpu_left


def _take(st: ClusterState, node: int, spec: PodSpec) -> tuple[int, ...]:
    """Place one member on `node`: the tightest GPUs that fit (open-gpu-share 'best')."""
    if not spec.num_gpus:
        gpus: tuple[int, ...] = ()
    elif spec.is_share:
        gpus = (st.tightest_gpu(node, spec.milli, spec.gpu_mem),)
    else:
        gpus = st.first_free_gpus(node, spec.num_gpus)
    st.assign(node, spec, gpus)
    return gpus


def _best(mask: BoolArray, keys: tuple[IntArray, IntArray], count: int) -> list[int]:
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return []
    order = np.lexsort((idx, keys[1][idx], keys[0][idx]))
    return [int(i) for i in idx[order[:count]]]


def _place_gang(
    st: ClusterState, snapshot: ClusterSnapshot, w: Workload, spec: PodSpec, fit: BoolArray
) -> dict[str, tuple[int, tuple[int, ...]]] | None:
    """All members of `w` on `st` (mutated), or None with `st` restored.

    Returns GPU columns of `st` (the caller maps them to GPU indices).
    """
    done: dict[str, tuple[int, tuple[int, ...]]] = {}
    allowed = fit.copy()
    for member in w.member_names():
        pick = _best(st.feasible_mask(spec) & allowed, _tightness(st), 1)
        if not pick:
            for node, gpus in done.values():
                st.release(node, spec, gpus)
            return None
        node = pick[0]
        done[member] = (node, _take(st, node, spec))
        if w.strategy is PlacementStrategy.STRICT_SPREAD:
            allowed[node] = False
        elif w.strategy is PlacementStrategy.STRICT_PACK:
            allowed &= np.arange(len(allowed)) == node
        if w.same_topology and len(done) == 1:
            dom = getattr(snapshot.nodes[node], w.same_topology)
            same = np.array([getattr(n, w.same_topology) == dom for n in snapshot.nodes])
            allowed &= same
    return done


def greedy_candidates(
    snapshot: ClusterSnapshot,
    options: list[tuple[Workload, str, int]],
    per_alt: int,
) -> tuple[dict[tuple[str, str], list[int]], dict[str, GreedyPick]]:
    """Candidate node indices per (workload, GPU model) and the greedy placement.

    `options` lists each workload's start-now alternatives as (workload, GPU
    model, value); workloads are taken by best value per GPU share asked, and
    each tries its alternatives by decreasing value. The arrays are the
    simulator's and the extender's (`ClusterState`).
    """
    base = ClusterState.from_snapshot(snapshot)
    base_keys = _tightness(base)
    base_keys = (base_keys[0].copy(), base_keys[1].copy())
    st = base.copy()
    # ClusterState's GPU columns are each node's GPUs sorted by index
    gpu_index = [sorted(g.index for g in n.gpus) for n in snapshot.nodes]
    by_w: dict[str, list[tuple[Workload, str, int]]] = {}
    for opt in options:
        by_w.setdefault(opt[0].name, []).append(opt)

    def density(name: str) -> tuple[float, str]:
        w, _, value = max(by_w[name], key=lambda o: o[2])
        ask = max(w.pod.total_gpu_milli * w.replicas, 1)
        return (-value / ask, name)

    def spec_for(w: Workload, model: str) -> PodSpec:
        if not w.pod.num_gpus:
            return base.spec(w.pod)
        return base.spec(w.pod.model_copy(update={"gpu_models": (model,)}))

    cands: dict[tuple[str, str], list[int]] = {}
    picks: dict[str, GreedyPick] = {}
    for name in sorted(by_w, key=density):
        opts = sorted(by_w[name], key=lambda o: -o[2])
        specs = {model: spec_for(w, model) for w, model, _ in opts}
        now: dict[str, list[int]] = {}
        for w, model, _ in opts:
            limit = max(per_alt, 2 * w.replicas)
            now[model] = _best(st.feasible_mask(specs[model]), _tightness(st), limit)
            if name in picks or not now[model]:
                continue
            done = _place_gang(st, snapshot, w, specs[model], base.feasible_mask(specs[model]))
            if done is not None:
                picks[name] = GreedyPick(
                    model,
                    {
                        m: (node, tuple(gpu_index[node][c] for c in cols))
                        for m, (node, cols) in done.items()
                    },
                )
        for w, model, _ in opts:
            pick = picks.get(name)
            if pick is not None and pick.gpu_model != model:
                # Another GPU model won on the greedy pass: offer fewer nodes of this one.
                cand = now[model][: max(2, per_alt // 3, 2 * w.replicas)]
            else:
                limit = max(2, per_alt // 3, 2 * w.replicas)
                orig = _best(base.feasible_mask(specs[model]), base_keys, limit)
                cand = now[model] + orig
                if pick is not None:
                    cand += [n for n, _ in pick.members.values()]
            cands[name, model] = list(dict.fromkeys(cand))
    return cands, picks
