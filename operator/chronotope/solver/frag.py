"""GPU fragmentation measured against the expected mix of future pods (FGD, ATC'23).

A node's fragmentation is the idle GPU share that the pods we expect to see
could not use there. The expected mix is the workload's "typical pods": the
most frequent (CPU, GPU share, GPU count, GPU models) request shapes covering
95 % of pods, each with its frequency. For a typical pod that fits the node
(enough CPU, model allowed, enough GPUs with room), only the GPUs too small
for it count as fragment; otherwise all idle share on the node does. This is
the measure of `NodeGpuShareFragAmountScore` in the paper's simulator
(hkust-adsl/kubernetes-scheduler-simulator, `pkg/utils/frag.go`), computed
here for many node states at once from two per-node tables: how many GPUs
have at least m milli free, and how much free share sits on GPUs with less
than m, for each share size m that a typical pod asks for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from chronotope.solver.model import MILLI, PodRequest
from chronotope.solver.state import ClusterState, IntArray

__all__ = [
    "FragModel",
    "FragTracker",
    "Shape",
    "TypicalPod",
    "shape_of",
    "typical_from_counts",
    "typical_pods",
]

FloatArray = npt.NDArray[np.float64]


Shape = tuple[int, int, int, str, int]
"""A request shape: (CPU milli, milli-GPU per GPU, GPU count, '|'-joined models, memory)."""


@dataclass(frozen=True, slots=True, order=True)
class TypicalPod:
    """One request shape of the expected mix and how often it occurs (0..1)."""

    cpu: int
    milli: int
    num_gpus: int
    gpu_models: str
    freq: float = 0.0
    mem: int = 0


def typical_pods(
    pods: Iterable[PodRequest], coverage: float = 0.95, *, with_memory: bool = False
) -> list[TypicalPod]:
    """The most frequent request shapes covering `coverage` of pods, renormalised.

    Ordering follows the reference: decreasing count, ties broken by the larger
    (cpu, milli, num_gpus, models) first; shapes are added one at a time until
    the cumulative count reaches `coverage` of all pods.
    """
    counts: Counter[Shape] = Counter(shape_of(p, with_memory=with_memory) for p in pods)
    return typical_from_counts(counts, coverage)


def shape_of(pod: PodRequest, *, with_memory: bool = False) -> Shape:
    """The pod's request shape: (CPU, GPU share, GPU count, allowed models, memory or 0)."""
    return (
        pod.cpu_milli,
        pod.gpu_milli,
        pod.num_gpus,
        "|".join(pod.gpu_models),
        pod.memory_mib if with_memory else 0,
    )


def typical_from_counts(counts: Counter[Shape], coverage: float = 0.95) -> list[TypicalPod]:
    """`typical_pods` over shapes already counted (a live cache keeps such a counter)."""
    total = sum(counts.values())
    if total == 0:
        return []
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    chosen: list[tuple[Shape, int]] = []
    cum = 0
    for key, cnt in ranked:
        if cum >= coverage * total:
            break
        chosen.append((key, cnt))
        cum += cnt
    return [TypicalPod(k[0], k[1], k[2], k[3], cnt / cum, k[4]) for k, cnt in chosen]


def _accessible(node_model: str, pod_models: str) -> bool:
    wanted = [m for m in pod_models.split("|") if m]
    if not wanted:
        return True
    if not node_model:
        return False
    return node_model in wanted


class FragModel:
    """Vectorised fragmentation of node states against a typical-pod mix."""

    def __init__(self, typical: list[TypicalPod], models: list[str]) -> None:
        """Precompute the mix's arrays; `models` are the cluster's GPU models, by model index."""
        self.typical = typical
        gpu_t = [t for t in typical if t.milli > 0]
        self.freq_sum = float(sum(t.freq for t in typical))
        self.m_vals: IntArray = np.array(sorted({t.milli for t in gpu_t}), dtype=np.int64)
        m_index = {int(m): i for i, m in enumerate(self.m_vals)}
        self.t_m: IntArray = np.array([m_index[t.milli] for t in gpu_t], dtype=np.int64)
        self.t_num: IntArray = np.array([t.num_gpus for t in gpu_t], dtype=np.int64)
        self.t_cpu: IntArray = np.array([t.cpu for t in gpu_t], dtype=np.int64)
        self.t_mem: IntArray = np.array([t.mem for t in gpu_t], dtype=np.int64)
        self.uses_memory = bool(self.t_mem.any())
        self.t_freq: FloatArray = np.array([t.freq for t in gpu_t], dtype=np.float64)
        gpus = float((self.t_freq * self.t_num * self.m_vals[self.t_m]).sum()) / MILLI
        self.cpu_per_gpu = float((self.t_freq * self.t_cpu).sum()) / max(gpus, 1e-9)
        """Mean CPU (milli) the typical GPU pods ask per GPU they take."""
        cpu_t = [t for t in typical if t.milli == 0]
        total_freq = max(self.freq_sum, 1e-9)
        self.gpu_milli_per_pod = float(
            sum(t.freq * t.milli * t.num_gpus for t in gpu_t) / total_freq
        )
        """Mean GPU share (milli) one arriving pod of the mix asks (CPU-only pods count 0)."""
        self.cpu_only_cpu_per_pod = float(sum(t.freq * t.cpu for t in cpu_t) / total_freq)
        """Mean CPU (milli) one arriving pod of the mix asks as a CPU-only pod."""
        # acc[model, t]; the extra last row is CPU-only nodes (model index -1).
        rows = [*models, ""]
        self.acc = np.array(
            [[_accessible(m, t.gpu_models) for t in gpu_t] for m in rows], dtype=np.bool_
        ).reshape(len(rows), len(gpu_t))

    def stats(self, gpu_left: IntArray) -> tuple[IntArray, IntArray]:
        """(cnt_ge, sum_lt) per row of `gpu_left` [K, G] for each share size m."""
        ge = gpu_left[:, :, None] >= self.m_vals[None, None, :]
        cnt_ge = ge.sum(axis=1)
        sum_lt = (gpu_left[:, :, None] * ~ge).sum(axis=1)
        return cnt_ge, sum_lt

    def from_stats(
        self,
        total: IntArray,
        cnt_ge: IntArray,
        sum_lt: IntArray,
        cpu_left: IntArray,
        model_idx: IntArray,
        *,
        mem_left: IntArray | None = None,
    ) -> FloatArray:
        """Fragmentation (milli-GPU) of K node states given their tables."""
        q3 = (
            self.acc[model_idx]
            & (cnt_ge[:, self.t_m] >= self.t_num[None, :])
            & (cpu_left[:, None] >= self.t_cpu[None, :])
        )
        if self.uses_memory and mem_left is not None:
            q3 &= mem_left[:, None] >= self.t_mem[None, :]
        usable = (total[:, None] - sum_lt[:, self.t_m]) * q3
        return total.astype(np.float64) * self.freq_sum - usable @ self.t_freq

    def of_rows(self, gpu_left: IntArray, cpu_left: IntArray, model_idx: IntArray) -> FloatArray:
        """Fragmentation of K node states from free share per GPU, free CPU and model index."""
        cnt_ge, sum_lt = self.stats(gpu_left)
        return self.from_stats(gpu_left.sum(axis=1), cnt_ge, sum_lt, cpu_left, model_idx)

    def of_state(self, state: ClusterState) -> FloatArray:
        """Fragmentation of every node of a cluster state."""
        return self.of_rows(state.gpu_left, state.cpu_left, state.model_idx)


class FragTracker:
    """Per-node fragmentation tables of one `ClusterState`, kept in step by `refresh`."""

    def __init__(self, model: FragModel, state: ClusterState) -> None:
        """Compute the tables of every node of `state` under `model`."""
        self.model = model
        self.state = state
        self.cnt_ge, self.sum_lt = model.stats(state.gpu_left)
        self.node_frag = model.from_stats(
            state.total_left,
            self.cnt_ge,
            self.sum_lt,
            state.cpu_left,
            state.model_idx,
            mem_left=state.mem_left,
        )

    def refresh(self, node: int) -> None:
        """Recompute the tables and fragmentation of `node` after its state changed."""
        st = self.state
        row = st.gpu_left[node : node + 1]
        cnt_ge, sum_lt = self.model.stats(row)
        self.cnt_ge[node] = cnt_ge[0]
        self.sum_lt[node] = sum_lt[0]
        self.node_frag[node] = self.model.from_stats(
            st.total_left[node : node + 1],
            cnt_ge,
            sum_lt,
            st.cpu_left[node : node + 1],
            st.model_idx[node : node + 1],
            mem_left=st.mem_left[node : node + 1],
        )[0]

    @property
    def total(self) -> float:
        """Fragmentation summed over all nodes (milli-GPU)."""
        return float(self.node_frag.sum())
