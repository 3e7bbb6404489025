"""Candidate nodes and a greedy warm start for the CP-SAT batch planner.

Building the CP-SAT model over every node for every pending pod is what made
planning slow (plain-Python `_fits` over 1,213 nodes x 6 models x 200 pods,
then a model the solver could not even make feasible within its limit,
because every pod was offered the same few tightest nodes). Here the nodes
are turned into arrays once, a greedy pass places the workloads one by one
on a residual copy (best fit: the node with the least free GPU share, then
the least free CPU), and each workload's candidate nodes are the best-fit
nodes *at the moment the greedy pass reaches it*, plus the node the pass
chose. Candidates therefore differ from workload to workload, the greedy
placement is a complete feasible solution to hint to CP-SAT, and the solver
only has to improve on it (stopping at a small relative gap). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from chronotope.solver.model import MILLI, ClusterSnapshot, PlacementStrategy, PodRequest, Workload

__all__ = ["GreedyPick", "NodeTable", "greedy_candidates"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass
class NodeTable:
    """Free resources of a snapshot's nodes as arrays (GPU columns padded with -1)."""

    models: list[str]
    cpu: IntArray
    mem: IntArray
    gpu_free: IntArray
    gpu_mem: IntArray
    """Free device memory per GPU; -1 where the device memory is unknown (0 on the model)."""

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot) -> NodeTable:
        n = len(snapshot.nodes)
        width = max((len(x.gpus) for x in snapshot.nodes), default=0) or 1
        gpu_free = np.full((n, width), -1, dtype=np.int64)
        gpu_mem = np.full((n, width), -1, dtype=np.int64)
        for i, node in enumerate(snapshot.nodes):
            for j, g in enumerate(node.gpus):
                gpu_free[i, j] = g.free_milli
                gpu_mem[i, j] = g.free_mem if g.memory_mib else -1
        return cls(
            models=[x.gpu_model for x in snapshot.nodes],
            cpu=np.array([x.free_cpu for x in snapshot.nodes], dtype=np.int64),
            mem=np.array([x.free_memory for x in snapshot.nodes], dtype=np.int64),
            gpu_free=gpu_free,
            gpu_mem=gpu_mem,
        )

    def copy(self) -> NodeTable:
        return NodeTable(
            self.models, self.cpu.copy(), self.mem.copy(), self.gpu_free.copy(), self.gpu_mem.copy()
        )

    def gpu_ok(self, pod: PodRequest) -> BoolArray:
        """[N, G]: GPUs with room for one member of `pod`."""
        ok = self.gpu_free >= pod.gpu_milli
        if pod.gpu_memory_mib:
            ok &= self.gpu_mem >= pod.gpu_memory_mib
        return ok

    def fits(self, pod: PodRequest, model_mask: BoolArray) -> BoolArray:
        """Nodes (of the allowed models) where one member of `pod` fits now."""
        ok = (self.cpu >= pod.cpu_milli) & (self.mem >= pod.memory_mib)
        if pod.num_gpus:
            ok &= model_mask
            ok &= self.gpu_ok(pod).sum(axis=1) >= pod.num_gpus
        return ok

    def tightness(self) -> tuple[IntArray, IntArray]:
        """Sort keys for best fit: free GPU share, then free CPU."""
        return np.maximum(self.gpu_free, 0).sum(axis=1), self.cpu

    def take(self, node: int, pod: PodRequest) -> tuple[int, ...]:
        """Place one member on `node`: the tightest GPUs that fit (open-gpu-share 'best')."""
        self.cpu[node] -= pod.cpu_milli
        self.mem[node] -= pod.memory_mib
        if not pod.num_gpus:
            return ()
        row = self.gpu_free[node]
        ok = self.gpu_ok(pod)[node]
        order = np.lexsort((np.arange(len(row)), np.where(ok, row, MILLI + 1)))
        gpus = tuple(int(g) for g in order[: pod.num_gpus])
        for g in gpus:
            self.gpu_free[node, g] -= pod.gpu_milli
            if self.gpu_mem[node, g] >= 0:
                self.gpu_mem[node, g] -= pod.gpu_memory_mib
        return gpus

    def give_back(self, node: int, pod: PodRequest, gpus: tuple[int, ...]) -> None:
        self.cpu[node] += pod.cpu_milli
        self.mem[node] += pod.memory_mib
        for g in gpus:
            self.gpu_free[node, g] += pod.gpu_milli
            if self.gpu_mem[node, g] >= 0:
                self.gpu_mem[node, g] += pod.gpu_memory_mib


@dataclass
class GreedyPick:
    """The greedy pass's choice for one workload: a GPU model and member -> (node, GPUs)."""

    gpu_model: str
    members: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)


def _best(mask: BoolArray, keys: tuple[IntArray, IntArray], count: int) -> list[int]:
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return []
    order = np.lexsort((idx, keys[1][idx], keys[0][idx]))
    return [int(i) for i in idx[order[:count]]]


def _place_gang(
    table: NodeTable, snapshot: ClusterSnapshot, w: Workload, fit: BoolArray
) -> dict[str, tuple[int, tuple[int, ...]]] | None:
    """All members of `w` on `table` (mutated), or None with `table` restored."""
    done: dict[str, tuple[int, tuple[int, ...]]] = {}
    allowed = fit.copy()
    for member in w.member_names():
        mask = table.fits(w.pod, allowed)
        if not w.pod.num_gpus:
            mask &= allowed
        pick = _best(mask, table.tightness(), 1)
        if not pick:
            for node, gpus in done.values():
                table.give_back(node, w.pod, gpus)
            return None
        node = pick[0]
        done[member] = (node, table.take(node, w.pod))
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
    each tries its alternatives by decreasing value.
    """
    base = NodeTable.from_snapshot(snapshot)
    base_keys = base.tightness()
    table = base.copy()
    model_arr = np.array(base.models, dtype=object)
    by_w: dict[str, list[tuple[Workload, str, int]]] = {}
    for opt in options:
        by_w.setdefault(opt[0].name, []).append(opt)

    def density(name: str) -> tuple[float, str]:
        w, _, value = max(by_w[name], key=lambda o: o[2])
        ask = max(w.pod.total_gpu_milli * w.replicas, 1)
        return (-value / ask, name)

    by_model: dict[str, BoolArray] = {}
    anywhere = np.ones(len(model_arr), dtype=np.bool_)

    def model_mask(model: str, w: Workload) -> BoolArray:
        if not w.pod.num_gpus:
            return anywhere
        if model not in by_model:
            by_model[model] = model_arr == model
        return by_model[model]

    cands: dict[tuple[str, str], list[int]] = {}
    picks: dict[str, GreedyPick] = {}
    keys = table.tightness()
    for name in sorted(by_w, key=density):
        opts = sorted(by_w[name], key=lambda o: -o[2])
        masks = {model: model_mask(model, w) for w, model, _ in opts}
        now: dict[str, list[int]] = {}
        for w, model, _ in opts:
            limit = max(per_alt, 2 * w.replicas)
            now[model] = _best(table.fits(w.pod, masks[model]), keys, limit)
            if name in picks or not now[model]:
                continue
            done = _place_gang(table, snapshot, w, base.fits(w.pod, masks[model]))
            if done is not None:
                picks[name] = GreedyPick(model, done)
                keys = table.tightness()
        for w, model, _ in opts:
            pick = picks.get(name)
            if pick is not None and pick.gpu_model != model:
                # Another GPU model won on the greedy pass: offer fewer nodes of this one.
                cand = now[model][: max(2, per_alt // 3, 2 * w.replicas)]
            else:
                limit = max(2, per_alt // 3, 2 * w.replicas)
                orig = _best(base.fits(w.pod, masks[model]), base_keys, limit)
                cand = now[model] + orig
                if pick is not None:
                    cand += [n for n, _ in pick.members.values()]
            cands[name, model] = list(dict.fromkeys(cand))
    return cands, picks
