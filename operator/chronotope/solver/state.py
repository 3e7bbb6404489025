"""Array form of a cluster, for policies that score every node per pod.

The online policies score all 1,213 openb nodes for every pod; doing that on
pydantic objects would cost milliseconds. `ClusterState` holds the same facts
as a `ClusterSnapshot` in numpy arrays (one row per node, GPUs padded to the
widest node with zero free share) plus per-node aggregates that policies read
often (total free share, fully free GPUs, the largest free share). It is
mutable on purpose: the simulator and the batch planner's greedy pass apply one placement at a
time with `assign`, and the cluster cache (`solver.cache`) applies what pods
hold with `take`; both keep the aggregates in step. Build one from a
snapshot with `ClusterState.from_snapshot`; the snapshot itself never changes.

GPU shares that state a priority (pods asking through the share annotations)
are also kept per GPU as `ShareTag`s (`shares`), which the co-location rules
(`solver.colocation`) read: who holds a share of the GPU, with which priority,
profile and compute percent. Shares without a priority (trace replays) are not
tagged, so nothing reads or changes for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from chronotope.api.v1alpha1.common import SharePriority, WorkloadProfile
from chronotope.solver.model import MILLI, ClusterSnapshot, PodRequest, is_share

__all__ = ["ClusterState", "PodSpec", "ShareTag", "affinity_tag"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def affinity_tag(num_gpus: int, gpu_milli: int) -> int:
    """GpuClustering's pod class: -1 no GPU, 0 a share, n for n whole GPUs."""
    if num_gpus == 0:
        return -1
    if is_share(num_gpus, gpu_milli):
        return 0
    return num_gpus


@dataclass(frozen=True, slots=True)
class ShareTag:
    """One GPU share as the co-location rules see it: whose, priority, profile, compute."""

    pod: str
    priority: SharePriority
    profile: WorkloadProfile
    percent: int
    """Compute percent it holds (the MPS active thread percentage it was given)."""

    def describe(self) -> str:
        """The share in words for reasons: "High share ns/pod"."""
        return f"{self.priority.value} share {self.pod}"


@dataclass(frozen=True, slots=True)
class PodSpec:
    """A pod request resolved against one cluster's GPU-model vocabulary."""

    name: str
    cpu: int
    mem: int
    num_gpus: int
    milli: int
    allowed: BoolArray
    """allowed[m] for each model index m, plus a last entry for CPU-only nodes."""
    gpu_models: str = ""
    """The raw '|'-joined allowed models ('' = any), as the fragmentation model keys it."""
    gpu_mem: int = 0
    """Device memory the pod needs on each GPU it uses, MiB (0: not constrained)."""
    priority: SharePriority | None = None
    """A share's priority class; None for requests that state none (trace replays)."""
    profile: WorkloadProfile = WorkloadProfile.UNKNOWN
    """A share's declared profile (what bounds its kernels)."""
    nodes: BoolArray | None = None
    """nodes[i]: the pod may run on node i (its node rules); None: on any node."""

    @property
    def total_milli(self) -> int:
        """All the GPU the pod asks for, in milli-GPU (`num_gpus` × `milli`)."""
        return self.num_gpus * self.milli

    @property
    def is_share(self) -> bool:
        """Whether the pod asks for part of one GPU."""
        return is_share(self.num_gpus, self.milli)

    @property
    def percent(self) -> int:
        """The compute percent of one GPU the pod asks for (a share's MPS percentage)."""
        return self.milli * 100 // MILLI

    def tag(self) -> ShareTag | None:
        """The pod's `ShareTag` as a share that states a priority, else None."""
        if self.priority is None or not self.is_share:
            return None
        return ShareTag(self.name, self.priority, self.profile, self.percent)


@dataclass
class ClusterState:
    """Mutable per-node arrays; see the module docstring."""

    names: list[str]
    models: list[str]
    model_idx: IntArray
    gpu_count: IntArray
    cpu_cap: IntArray
    mem_cap: IntArray
    cpu_left: IntArray
    mem_left: IntArray
    gpu_left: IntArray
    gpu_mem_left: IntArray
    """Free device memory per GPU, MiB (0 where unknown or padded)."""
    total_left: IntArray = field(init=False)
    max_left: IntArray = field(init=False)
    full_free: IntArray = field(init=False)
    affinity: IntArray = field(init=False)
    """affinity[n, tag] counts placed GPU pods by `affinity_tag` (tags 0..8)."""
    shares: dict[tuple[int, int], tuple[ShareTag, ...]] = field(init=False)
    """(node, GPU) -> the tagged shares it holds; GPUs without any are absent."""
    high: set[tuple[int, int]] = field(init=False)
    """The (node, GPU) pairs among `shares` that hold a High share."""

    def __post_init__(self) -> None:
        """Derive the per-node aggregates from `gpu_left`; `affinity` starts with no pods."""
        self.total_left = self.gpu_left.sum(axis=1)
        self.max_left = self.gpu_left.max(axis=1, initial=0)
        self.full_free = (self.gpu_left == MILLI).sum(axis=1)
        self.affinity = np.zeros((len(self.names), 9), dtype=np.int64)
        self.shares = {}
        self.high = set()

    @property
    def n(self) -> int:
        """The number of nodes (rows)."""
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        """The cluster's whole GPU capacity in milli-GPU, free or not."""
        return int(self.gpu_count.sum()) * MILLI

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot) -> ClusterState:
        """The arrays of a snapshot: rows in snapshot order, GPUs by device index.

        Model indices follow the sorted model names. `affinity` starts at zero: a
        snapshot says what is free, not which pods hold the rest.
        """
        models = sorted({n.gpu_model for n in snapshot.nodes if n.gpus})
        index = {m: i for i, m in enumerate(models)}
        width = max((len(n.gpus) for n in snapshot.nodes), default=0)
        n = len(snapshot.nodes)
        gpu_left = np.zeros((n, max(width, 1)), dtype=np.int64)
        gpu_mem_left = np.zeros_like(gpu_left)
        for i, node in enumerate(snapshot.nodes):
            for j, gpu in enumerate(sorted(node.gpus, key=lambda g: g.index)):
                gpu_left[i, j] = gpu.free_milli
                gpu_mem_left[i, j] = gpu.free_mem
        return cls(
            names=[x.name for x in snapshot.nodes],
            models=models,
            model_idx=np.array(
                [index[x.gpu_model] if x.gpus else -1 for x in snapshot.nodes], dtype=np.int64
            ),
            gpu_count=np.array([len(x.gpus) for x in snapshot.nodes], dtype=np.int64),
            cpu_cap=np.array([x.cpu_milli for x in snapshot.nodes], dtype=np.int64),
            mem_cap=np.array([x.memory_mib for x in snapshot.nodes], dtype=np.int64),
            cpu_left=np.array([x.free_cpu for x in snapshot.nodes], dtype=np.int64),
            mem_left=np.array([x.free_memory for x in snapshot.nodes], dtype=np.int64),
            gpu_left=gpu_left,
            gpu_mem_left=gpu_mem_left,
        )

    def copy(self) -> ClusterState:
        """A copy that changes independently of this one.

        What `take` changes (free resources, aggregates, affinity) is copied; names,
        models and capacities are shared, since nothing changes them.
        """
        out = ClusterState(
            names=self.names,
            models=self.models,
            model_idx=self.model_idx,
            gpu_count=self.gpu_count,
            cpu_cap=self.cpu_cap,
            mem_cap=self.mem_cap,
            cpu_left=self.cpu_left.copy(),
            mem_left=self.mem_left.copy(),
            gpu_left=self.gpu_left.copy(),
            gpu_mem_left=self.gpu_mem_left.copy(),
        )
        out.affinity = self.affinity.copy()
        out.shares = dict(self.shares)  # the values are tuples: never changed in place
        out.high = set(self.high)
        return out

    def masked(self, usable: BoolArray) -> ClusterState:
        """A view in which GPUs outside `usable` [nodes, GPUs] have no free share.

        What a policy reads to choose among the GPUs a pod may take: the per-node
        aggregates (total free share, fully free GPUs) and every other array stay
        the real ones, so node scores still measure the real fragmentation; only
        the per-GPU free share hides the GPUs the pod may not use. Never apply a
        placement to a view: apply it to the state it came from.
        """
        out = ClusterState.__new__(ClusterState)
        for name in self.__dataclass_fields__:
            setattr(out, name, getattr(self, name))
        out.gpu_left = np.where(usable, self.gpu_left, 0)
        return out

    def spec(self, pod: PodRequest) -> PodSpec:
        """The pod request resolved against this cluster's GPU models (see `PodSpec`)."""
        allowed = np.zeros(len(self.models) + 1, dtype=np.bool_)
        for i, m in enumerate(self.models):
            allowed[i] = pod.allows(m)
        return PodSpec(
            name=pod.name,
            cpu=pod.cpu_milli,
            mem=pod.memory_mib,
            num_gpus=pod.num_gpus,
            milli=pod.gpu_milli,
            allowed=allowed,
            gpu_models="|".join(pod.gpu_models),
            gpu_mem=pod.gpu_memory_mib,
            priority=pod.gpu_priority,
            profile=pod.gpu_profile,
            nodes=None
            if pod.nodes is None
            else np.array([n in pod.nodes for n in self.names], dtype=np.bool_),
        )

    def feasible(self, pod: PodSpec) -> IntArray:
        """Indices of nodes where the pod fits now (CPU, memory, model, GPU share)."""
        return np.flatnonzero(self.feasible_mask(pod))

    def feasible_mask(self, pod: PodSpec) -> BoolArray:
        """Per node: does the pod fit now (see `feasible`)."""
        ok = (self.cpu_left >= pod.cpu) & (self.mem_left >= pod.mem)
        if pod.nodes is not None:
            ok &= pod.nodes
        if pod.milli > 0:
            ok &= pod.allowed[self.model_idx]
            if pod.num_gpus == 1:
                ok &= self.max_left >= pod.milli
            else:
                ok &= self.full_free >= pod.num_gpus
            if pod.gpu_mem > 0:
                room = (self.gpu_left >= pod.milli) & (self.gpu_mem_left >= pod.gpu_mem)
                ok &= room.sum(axis=1) >= pod.num_gpus
        return ok

    def first_free_gpus(self, node: int, count: int) -> tuple[int, ...]:
        """The first `count` fully free GPUs of a node, by index (the open-gpu-share rule)."""
        return tuple(int(g) for g in np.flatnonzero(self.gpu_left[node] == MILLI)[:count])

    def tightest_gpu(self, node: int, milli: int, gpu_mem: int = 0) -> int:
        """The GPU with the least free share that still fits `milli` (first on ties)."""
        row = self.gpu_left[node, : self.gpu_count[node]]
        fits = row >= milli
        if gpu_mem > 0:
            fits &= self.gpu_mem_left[node, : self.gpu_count[node]] >= gpu_mem
        masked = np.where(fits, row, MILLI + 1)
        return int(np.argmin(masked))

    def gpu_fits(self, node: int, gpu: int, pod: PodSpec) -> bool:
        """Whether one GPU of `node` has the share and device memory `pod` needs."""
        return bool(
            self.gpu_left[node, gpu] >= pod.milli and self.gpu_mem_left[node, gpu] >= pod.gpu_mem
        )

    def assign(self, node: int, pod: PodSpec, gpus: tuple[int, ...]) -> None:
        """Take the pod's resources on `node` (GPU indices from the policy)."""
        if pod.milli > 0:
            if len(gpus) != pod.num_gpus:
                raise ValueError(f"pod {pod.name} needs {pod.num_gpus} GPUs, got {gpus}")
            for g in gpus:
                if self.gpu_left[node, g] < pod.milli:
                    raise ValueError(f"GPU {g} on {self.names[node]} cannot take {pod.milli}m")
        self.take(node, pod.cpu, pod.mem, gpus, milli=pod.milli, gpu_mem=pod.gpu_mem, tag=pod.tag())

    def release(self, node: int, pod: PodSpec, gpus: tuple[int, ...]) -> None:
        """Give back what `assign` took (used by look-ahead and rollback)."""
        self.take(
            node,
            pod.cpu,
            pod.mem,
            gpus,
            milli=pod.milli,
            gpu_mem=pod.gpu_mem,
            sign=-1,
            tag=pod.tag(),
        )

    def take(
        self,
        node: int,
        cpu: int,
        mem: int,
        gpus: tuple[int, ...],
        *,
        milli: int,
        gpu_mem: int = 0,
        sign: int = 1,
        tag: ShareTag | None = None,
    ) -> None:
        """Take (sign 1) or give back (sign -1) resources on a node, unchecked.

        `assign` checks a policy's choice first; a watch-fed cache records what
        the cluster says is bound, which is the truth even when it over-commits.
        A share's `tag` is added to (or removed from) each of its GPUs' `shares`.
        """
        self.cpu_left[node] -= sign * cpu
        self.mem_left[node] -= sign * mem
        if gpus and milli > 0:
            for g in gpus:
                self.gpu_left[node, g] -= sign * milli
                self.gpu_mem_left[node, g] -= sign * gpu_mem
            self.affinity[node, affinity_tag(len(gpus), milli)] += sign
            if tag is not None:
                for g in gpus:
                    self._tag(node, g, tag, sign)
        self._refresh(node)

    def _tag(self, node: int, gpu: int, tag: ShareTag, sign: int) -> None:
        held = self.shares.get((node, gpu), ())
        if sign > 0:
            held = (*held, tag)
        elif tag in held:
            i = held.index(tag)
            held = held[:i] + held[i + 1 :]
        if held:
            self.shares[(node, gpu)] = held
        else:
            self.shares.pop((node, gpu), None)
        if any(t.priority is SharePriority.HIGH for t in held):
            self.high.add((node, gpu))
        else:
            self.high.discard((node, gpu))

    def _refresh(self, node: int) -> None:
        row = self.gpu_left[node]
        self.total_left[node] = row.sum()
        self.max_left[node] = row.max(initial=0)
        self.full_free[node] = int((row == MILLI).sum())
