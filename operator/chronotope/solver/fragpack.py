"""Chronotope's own online policy: FGD, deviating only where the CPU budget allows.

FGD (ATC'23) scores a node by the change in fragmentation a placement causes,
squashed through a sigmoid and truncated to an integer 0..100; many nodes
tie, and the stable node order breaks the ties. Rules that override that
order for GPU pods lose on some trace (docs/solver.md), so GPU pods get
exactly FGD's choice (node of best score, first in the node order; a share on
the first GPU of best score). One deviation, for CPU-only pods (rule
"budget", the default):

* trigger: FGD's node has *usable* idle GPU share (on GPUs with room for the
  smallest typical share) and the pod would leave it less CPU than that share
  needs (the typical GPU pods' mean CPU per GPU), a shortage FGD's one-pod
  measure cannot see;
* guard: the CPU on nodes with no usable idle share ("dead" CPU, which no GPU
  pod can use) is more than the CPU-only pods of the mix are expected to ask
  before the idle GPU share fills up (idle share / GPU share per arriving pod
  x CPU-only CPU per arriving pod). Without it, moving CPU-only pods onto dead
  CPU only uses it up early and later ones land on GPU nodes anyway (the cost
  on CPU-heavy variants is in docs/solver.md);
* move: among the nodes of best score, to one with no usable idle share (then
  the node order).

Variants kept for measurement (`bench/chrono_variants.py`): `cpu_rule="usable"`
(no guard), `"safe"` (only to nodes with no idle share at all), `"short"` (all
idle share counts), `"zero"` (always prefer a node with no idle GPU),
`"idle"`, `"dead"`, `"fgd"`; `share_gpu="tight"`.

Shares that state a priority and a profile break FGD's ties toward GPUs
holding shares of the complementary profile (compute-bound beside
memory-bound, `solver.colocation.complement_key`), after the score and
before the node order; the interference budget itself is a filter applied
before any policy (`solver.colocation.choose`). The policy is pure given its
`Context`.
"""

from __future__ import annotations

import numpy as np

from chronotope.solver.colocation import complement_key
from chronotope.solver.model import MILLI
from chronotope.solver.policies import Choice, Context, Policy, frag_after
from chronotope.solver.state import IntArray, PodSpec

__all__ = ["CPU_RULES", "SHARE_RULES", "Chronotope"]

CPU_RULES = ("usable", "budget", "safe", "short", "zero", "idle", "dead", "fgd")
SHARE_RULES = ("fgd", "tight")


class Chronotope(Policy):
    """FGD score, then the tie rules of the module docstring."""

    name = "chronotope"
    needs_frag = True

    def __init__(
        self, frag_bin: float = 0.0, cpu_rule: str = "budget", share_gpu: str = "fgd"
    ) -> None:
        """Choose the rules; an unknown `cpu_rule` or `share_gpu` raises `ValueError`."""
        if cpu_rule not in CPU_RULES or share_gpu not in SHARE_RULES:
            raise ValueError(f"unknown rule {cpu_rule!r} / {share_gpu!r}")
        self.frag_bin = frag_bin
        """0: FGD's sigmoid score; > 0: exact change in bins of this many milli-GPU."""
        self.cpu_rule = cpu_rule
        self.share_gpu = share_gpu

    def _growth(self, delta: np.ndarray) -> np.ndarray:
        if self.frag_bin <= 0:
            return -np.floor(100.0 / (1.0 + np.exp(delta / 1000.0)))
        return np.floor(delta / self.frag_bin)

    def _cpu_key(self, ctx: Context, nodes: IntArray) -> np.ndarray | None:
        """Tie key for a CPU-only pod (lower first), None for the plain node order."""
        st = ctx.state
        if self.cpu_rule in ("zero", "short", "safe"):
            return st.total_left[nodes] > 0
        if self.cpu_rule in ("usable", "budget"):
            return self._usable(ctx, nodes) > 0
        if self.cpu_rule == "idle":
            return st.total_left[nodes]
        if self.cpu_rule == "dead":
            assert ctx.frag is not None
            full = st.total_left[nodes] * ctx.frag.model.freq_sum - 1e-6
            return ctx.frag.node_frag[nodes] < full
        return None

    @staticmethod
    def _usable(ctx: Context, nodes: IntArray) -> IntArray:
        """Idle GPU share per node on GPUs with room for the smallest typical share."""
        assert ctx.frag is not None
        smallest = ctx.frag.model.m_vals[0] if len(ctx.frag.model.m_vals) else 1
        left = ctx.state.gpu_left[nodes]
        usable: IntArray = np.where(left >= smallest, left, 0).sum(axis=1)
        return usable

    @staticmethod
    def _spare_dead_cpu(ctx: Context) -> bool:
        """Rule "budget": CPU on nodes without usable idle GPU share outlasts CPU-only demand.

        Until the idle GPU share is used up, about idle / (GPU share per arriving
        pod) more pods arrive, and the mix says how much CPU the CPU-only ones among
        them ask. Moving a CPU-only pod onto CPU that no GPU pod can use only pays
        while that CPU is more than they will need; otherwise they end up on GPU
        nodes anyway, and FGD's choice is kept.
        """
        assert ctx.frag is not None
        st, model = ctx.state, ctx.frag.model
        if model.gpu_milli_per_pod <= 0:
            return False
        usable = Chronotope._usable(ctx, np.arange(st.n, dtype=np.int64))
        arrivals = float(usable.sum()) / model.gpu_milli_per_pod
        demand = arrivals * model.cpu_only_cpu_per_pod
        dead = float(np.maximum(st.cpu_left[usable == 0], 0).sum())
        return dead > demand

    def _cpu_ample(self, ctx: Context, pod: PodSpec, node: int) -> bool:
        """Rules "usable"/"short": whether FGD's node keeps the CPU its idle share needs."""
        if self.cpu_rule not in ("short", "usable", "safe", "budget"):
            return False
        if self.cpu_rule == "budget" and not self._spare_dead_cpu(ctx):
            return True  # CPU no GPU can use is not plentiful: do what FGD does
        st = ctx.state
        idle = int(
            st.total_left[node]
            if self.cpu_rule == "short"
            else self._usable(ctx, np.array([node], dtype=np.int64))[0]
        )
        if idle == 0:
            return True
        assert ctx.frag is not None
        need = idle / MILLI * ctx.frag.model.cpu_per_gpu
        return bool(st.cpu_left[node] - pod.cpu >= need)

    def choose(self, ctx: Context, pod: PodSpec, cand: IntArray) -> Choice:
        """FGD's node and GPU, except where `cpu_rule` moves a CPU-only pod (module docstring).

        Among equal scores the node rank decides; with `share_gpu="tight"` a share
        then takes the GPU with the least room left.
        """
        assert ctx.frag is not None
        assert ctx.rank is not None
        st = ctx.state
        k_idx, g_idx, after = frag_after(ctx, pod, cand)
        nodes = cand[k_idx]
        growth = self._growth(after - ctx.frag.node_frag[nodes])
        rank = ctx.rank[nodes]
        if pod.milli == 0:
            order = np.lexsort((rank, growth))
            key = (
                None
                if self._cpu_ample(ctx, pod, int(nodes[order[0]]))
                else self._cpu_key(ctx, nodes)
            )
            if key is not None:
                order = np.lexsort((rank, key, growth))
        elif pod.is_share:
            tie = st.gpu_left[nodes, g_idx] if self.share_gpu == "tight" else g_idx
            pairs = complement_key(st, pod, nodes, g_idx)
            if pairs is None:
                order = np.lexsort((tie, rank, growth))
            else:  # complementary profiles after the score, before the node order
                order = np.lexsort((tie, rank, pairs[0], growth))
                g_idx = pairs[1]
        else:
            order = np.lexsort((rank, growth))
        best = int(order[0])
        node = int(nodes[best])
        if pod.is_share:
            return node, (int(g_idx[best]),)
        if pod.milli == 0:
            return node, ()
        return node, st.first_free_gpus(node, pod.num_gpus)
