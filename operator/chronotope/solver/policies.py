"""Online placement policies: pick a node and GPUs for one pod.

The baselines reproduce the score plugins of the ATC'23 FGD paper's simulator
(hkust-adsl/kubernetes-scheduler-simulator, `pkg/simulator/plugin/`), with
their integer scores, because the integer truncation decides ties and ties
are broken uniformly at random, as kube-scheduler's `selectHost` does. GPU
choice inside the node follows the simulator's open-gpu-share reserve step:
the tightest GPU that fits for a share ("best"), uniform among fitting GPUs
for Random, the fragmentation-minimising GPU for FGD, and the first fully
free GPUs by index for whole-GPU pods. Every policy is pure given its
`Context` (state, fragmentation tables, random generator): `choose` reads
them and returns a decision; the caller applies it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from chronotope.solver.frag import FloatArray, FragTracker
from chronotope.solver.model import MILLI
from chronotope.solver.state import ClusterState, IntArray, PodSpec

__all__ = [
    "BASELINES",
    "BestFit",
    "Choice",
    "Context",
    "DotProd",
    "Fgd",
    "GpuClustering",
    "GpuPacking",
    "Policy",
    "RandomPolicy",
    "pick_max",
]

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000
MAX_SCORE = 100

Choice = tuple[int, tuple[int, ...]]
"""(node index, GPU indices) chosen for a pod."""


@dataclass
class Context:
    """What a policy may read: the cluster arrays, fragmentation tables, randomness.

    `rank` orders nodes for tie-breaking: among equal scores the node with the
    lowest rank wins. The reference simulator lists nodes under names prefixed
    with a seeded random permutation and its scheduler keeps the first node of
    highest score, so a seeded random `rank` reproduces it; the extender may
    pass any stable order.
    """

    state: ClusterState
    frag: FragTracker | None
    rng: np.random.Generator
    rank: IntArray | None = None

    def __post_init__(self) -> None:
        """Default `rank` to the node index order."""
        if self.rank is None:
            self.rank = np.arange(self.state.n, dtype=np.int64)


def pick_max(scores: FloatArray | IntArray, ctx: Context, cand: IntArray) -> int:
    """Position in `cand` of the highest score; ties go to the lowest node rank."""
    assert ctx.rank is not None
    best = np.flatnonzero(scores == scores.max())
    if len(best) == 1:
        return int(best[0])
    return int(best[np.argmin(ctx.rank[cand[best]])])


def _best_gpus(state: ClusterState, node: int, pod: PodSpec) -> tuple[int, ...]:
    if pod.milli == 0:
        return ()
    if pod.is_share:
        return (state.tightest_gpu(node, pod.milli),)
    return state.first_free_gpus(node, pod.num_gpus)


class Policy(ABC):
    """Chooses among feasible nodes `cand` (never empty) for one pod."""

    name: str = ""
    needs_frag: bool = False

    @abstractmethod
    def choose(self, ctx: Context, pod: PodSpec, cand: IntArray) -> Choice:
        """The node in `cand` and the GPUs on it for `pod`; the caller applies it."""
        ...


class RandomPolicy(Policy):
    """Uniformly random node; a share takes a random GPU that fits."""

    name = "random"

    def choose(self, ctx: Context, pod: PodSpec, cand: IntArray) -> Choice:
        """A random candidate node; a share goes to a random GPU with room on it."""
        node = int(cand[ctx.rng.integers(len(cand))])
        if pod.is_share:
            fits = np.flatnonzero(ctx.state.gpu_left[node] >= pod.milli)
            return node, (int(fits[ctx.rng.integers(len(fits))]),)
        return node, _best_gpus(ctx.state, node, pod)


class DotProd(Policy):
    """Tetris-style alignment of free and requested (CPU, GPU), lower product wins."""

    name = "dotprod"

    def choose(self, ctx: Context, pod: PodSpec, cand: IntArray) -> Choice:
        """The candidate with the best integer alignment score; ties go to the lowest rank."""
        st = ctx.state
        node_vec0 = st.cpu_left[cand] / MAX_SPEC_CPU
        node_vec1 = st.total_left[cand] / MAX_SPEC_GPU
        pod0 = pod.cpu / MAX_SPEC_CPU
        pod1 = pod.total_milli / MAX_SPEC_GPU
        score = 1 - (node_vec0 * pod0 + node_vec1 * pod1) / 2
        ints = np.floor(MAX_SCORE * score).astype(np.int64)
        node = int(cand[pick_max(ints, ctx, cand)])
        return node, _best_gpus(st, node, pod)


class BestFit(Policy):
    """Least (CPU, GPU) left over after placing, equally weighted."""

    name = "bestfit"

    def choose(self, ctx: Context, pod: PodSpec, cand: IntArray) -> Choice:
        """The candidate with least CPU and GPU left after placing; ties go to the lowest rank."""
        st = ctx.state
        s = (st.cpu_left[cand] - pod.cpu) / MAX_SPEC_CPU * 0.5
        s = s + (st.total_left[cand] - pod.total_milli) / MAX_SPEC_GPU * 0.5
        ints = np.trunc((1.0 - s) * MAX_SCORE).astype(np.int64)
        node = int(cand[pick_max(ints, ctx, cand)])
        return node, _best_gpus(st, node, pod)


class GpuPacking(Policy):
    """Prefer partly used GPUs, then free GPUs on used nodes, then idle nodes."""

    name = "gpupacking"

    def choose(self, ctx: Context, pod: PodSpec, cand: IntArray) -> Choice:
        """Score each candidate by the packing case it falls in; ties go to the lowest rank.

        CPU-only pods take the first node by rank.
        """
        st = ctx.state
        if pod.milli == 0:
            return int(cand[pick_max(np.zeros(len(cand)), ctx, cand)]), ()
        free = st.full_free[cand]
        idle = free == st.gpu_count[cand]
        case3 = np.maximum(MAX_SCORE // 3 - free, free)
        if pod.is_share:
            rows = st.gpu_left[cand]
            tight = np.where(rows >= pod.milli, rows, MILLI + 1).min(axis=1)
            case2 = np.full(len(cand), max(MAX_SCORE // 2 - 1, MAX_SCORE // 3))
            case1 = np.maximum(MAX_SCORE - (tight * 100 // MILLI) // 10, MAX_SCORE // 2)
            used = np.where(tight == MILLI, case2, case1)
        else:
            used = np.full(len(cand), max(MAX_SCORE // 2 - pod.num_gpus, MAX_SCORE // 3))
        ints = np.where(idle, case3, used)
        node = int(cand[pick_max(ints, ctx, cand)])
        return node, _best_gpus(st, node, pod)


class GpuClustering(Policy):
    """Co-locate pods of the same GPU class (share, 1, 2, 4, 8 GPUs)."""

    name = "gpuclustering"

    def choose(self, ctx: Context, pod: PodSpec, cand: IntArray) -> Choice:
        """Score each candidate by how its GPU classes match the pod's; ties go to the lowest rank.

        CPU-only pods take the first node by rank.
        """
        st = ctx.state
        if pod.milli == 0:
            return int(cand[pick_max(np.zeros(len(cand)), ctx, cand)]), ()
        tag = 0 if pod.is_share else pod.num_gpus
        aff = st.affinity[cand]
        kinds = (aff > 0).sum(axis=1)
        base = (MAX_SCORE // 4) * (MAX_SPEC_GPU - st.total_left[cand]) // MAX_SPEC_GPU
        same = aff[:, tag] > 0
        offset = np.where(
            same,
            np.where(kinds == 1, MAX_SCORE * 3 // 4, MAX_SCORE * 2 // 4),
            np.where(kinds == 0, MAX_SCORE // 4, 0),
        )
        node = int(cand[pick_max(base + offset, ctx, cand)])
        return node, _best_gpus(st, node, pod)


def _sigmoid_score(delta: FloatArray) -> IntArray:
    return np.floor(MAX_SCORE / (1.0 + np.exp(-delta / 1000.0))).astype(np.int64)


def frag_after(ctx: Context, pod: PodSpec, cand: IntArray) -> tuple[IntArray, IntArray, FloatArray]:
    """Fragmentation after each candidate placement: (node pos, GPU, frag) per candidate.

    Whole-GPU and CPU-only pods have one candidate per node (which fully free
    GPUs they take does not change the measure); a share has one per distinct
    free share on the node, at the first GPU with that share.
    """
    st = ctx.state
    fr = ctx.frag
    assert fr is not None
    model = fr.model
    m = model.m_vals[None, :]
    if pod.is_share:
        left = st.gpu_left[cand]
        valid = left >= pod.milli
        for g in range(1, left.shape[1]):
            valid[:, g] &= ~(left[:, :g] == left[:, g : g + 1]).any(axis=1)
        k_idx, g_idx = np.nonzero(valid)
        nodes = cand[k_idx]
        v = left[k_idx, g_idx][:, None]
        v2 = v - pod.milli
        cnt_ge = fr.cnt_ge[nodes] - (v >= m) + (v2 >= m)
        sum_lt = fr.sum_lt[nodes] - v * (v < m) + v2 * (v2 < m)
        total = st.total_left[nodes] - pod.milli
    else:
        k_idx = np.arange(len(cand))
        g_idx = np.full(len(cand), -1)
        nodes = cand
        cnt_ge = fr.cnt_ge[nodes] - pod.num_gpus
        sum_lt = fr.sum_lt[nodes]
        total = st.total_left[nodes] - pod.total_milli
        if pod.milli == 0:
            cnt_ge = fr.cnt_ge[nodes]
    after = model.from_stats(
        total,
        cnt_ge,
        sum_lt,
        st.cpu_left[nodes] - pod.cpu,
        st.model_idx[nodes],
        mem_left=st.mem_left[nodes] - pod.mem,
    )
    return k_idx, g_idx, after


class Fgd(Policy):
    """Fragmentation gradient descent: the node and GPU that add least fragmentation."""

    name = "fgd"
    needs_frag = True

    def choose(self, ctx: Context, pod: PodSpec, cand: IntArray) -> Choice:
        """The node whose best placement adds least fragmentation (FGD's sigmoid score).

        Ties go to the lowest rank; a share takes the first GPU of best score there.
        """
        assert ctx.frag is not None
        k_idx, g_idx, after = frag_after(ctx, pod, cand)
        score = _sigmoid_score(ctx.frag.node_frag[cand[k_idx]] - after)
        node_best = np.full(len(cand), -1, dtype=np.int64)
        np.maximum.at(node_best, k_idx, score)
        k = pick_max(node_best, ctx, cand)
        node = int(cand[k])
        if pod.is_share:
            first = np.flatnonzero((k_idx == k) & (score == node_best[k]))[0]
            return node, (int(g_idx[first]),)
        return node, _best_gpus(ctx.state, node, pod)


BASELINES: dict[str, type[Policy]] = {
    p.name: p for p in (RandomPolicy, DotProd, GpuClustering, GpuPacking, BestFit, Fgd)
}
