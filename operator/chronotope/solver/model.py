"""The placement domain: what the solver sees and what it answers.

Every scheduling cycle, online or batch, works on one immutable
`ClusterSnapshot` and returns plain values: a `Placement` or an `Unplaced`
with reasons for one pod, a `Plan` for a batch. Nothing here talks to the API
server; the same models feed the trace simulator, the scheduler extender and
the controllers. GPU shares are in milli-GPU (1000 = one whole GPU), CPU in
milli-cores and memory in MiB, as in Kubernetes requests and the openb trace.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chronotope.api.v1alpha1.common import SharePriority, WorkloadProfile
from chronotope.api.v1alpha1.trainingjob import PlacementStrategy

__all__ = [
    "MILLI",
    "UNBOUNDED",
    "Alternative",
    "ClusterSnapshot",
    "Gpu",
    "Node",
    "Placement",
    "PlacementStrategy",
    "PodRequest",
    "Reason",
    "Unplaced",
    "Workload",
    "is_share",
    "percent_milli",
]

MILLI = 1000
"""Milli-GPU in one whole GPU."""


def percent_milli(percent: int) -> int:
    """A GPU share's compute percentage in milli-GPU."""
    return percent * MILLI // 100


UNBOUNDED = 1 << 40
"""CPU (milli) or memory (MiB) of a node that does not state it: no constraint."""


def is_share(num_gpus: int, gpu_milli: int) -> bool:
    """A request for part of one GPU (the one definition every layer uses)."""
    return num_gpus == 1 and 0 < gpu_milli < MILLI


NonNeg = Annotated[int, Field(ge=0)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Gpu(_Frozen):
    """One GPU device on a node, with what is still free on it."""

    index: NonNeg
    model: str
    memory_mib: NonNeg = 0
    free_milli: Annotated[int, Field(ge=0, le=MILLI)] = MILLI
    free_memory_mib: NonNeg | None = None
    """Free device memory; None means the whole device memory is free."""

    @property
    def free_mem(self) -> int:
        """Free device memory in MiB: `free_memory_mib`, or all of `memory_mib` when unset."""
        return self.memory_mib if self.free_memory_mib is None else self.free_memory_mib


class Node(_Frozen):
    """A schedulable node: capacity and what is left, GPUs, topology labels."""

    name: str
    cpu_milli: NonNeg
    memory_mib: NonNeg
    cpu_free: NonNeg | None = None
    memory_free: NonNeg | None = None
    gpus: tuple[Gpu, ...] = ()
    zone: str = ""
    rack: str = ""
    nvlink_domain: str = ""
    labels: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def with_gpus(
        cls,
        name: str,
        model: str,
        count: int,
        *,
        gpu_memory_mib: int = 0,
        free: int | None = None,
        zone: str = "",
    ) -> Node:
        """A node of `count` GPUs of one model, with CPU and memory unconstrained.

        The first `free` GPUs (default all) are untouched, the rest fully taken.
        """
        free = count if free is None else free
        gpus = tuple(
            Gpu(
                index=i, model=model, memory_mib=gpu_memory_mib, free_milli=MILLI if i < free else 0
            )
            for i in range(count)
        )
        return cls(name=name, cpu_milli=UNBOUNDED, memory_mib=UNBOUNDED, gpus=gpus, zone=zone)

    @property
    def free_whole_gpus(self) -> int:
        """GPUs nobody holds any share of."""
        return sum(1 for g in self.gpus if g.free_milli == MILLI)

    @property
    def free_cpu(self) -> int:
        """Free CPU in milli-cores: `cpu_free`, or all of `cpu_milli` when unset."""
        return self.cpu_milli if self.cpu_free is None else self.cpu_free

    @property
    def free_memory(self) -> int:
        """Free memory in MiB: `memory_free`, or all of `memory_mib` when unset."""
        return self.memory_mib if self.memory_free is None else self.memory_free

    @property
    def gpu_model(self) -> str:
        """The node's GPU model ('' for a CPU-only node); nodes carry one model."""
        return self.gpus[0].model if self.gpus else ""


class ClusterSnapshot(_Frozen):
    """A frozen view of the cluster that one scheduling cycle works on."""

    nodes: tuple[Node, ...]
    time_s: float = 0.0

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterSnapshot:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        return self

    @cached_property
    def by_name(self) -> dict[str, Node]:
        """The nodes by name, built on first use."""
        return {n.name: n for n in self.nodes}

    @property
    def total_gpus(self) -> int:
        """How many GPUs the cluster has, free or not."""
        return sum(len(n.gpus) for n in self.nodes)


class PodRequest(_Frozen):
    """What one pod asks for. `gpu_milli` < 1000 with `num_gpus` == 1 is a GPU share."""

    name: str
    cpu_milli: NonNeg = 0
    memory_mib: NonNeg = 0
    num_gpus: NonNeg = 0
    gpu_milli: Annotated[int, Field(ge=0, le=MILLI)] = 0
    gpu_memory_mib: NonNeg = 0
    """Device memory needed on each GPU it uses (0: not constrained)."""
    gpu_models: tuple[str, ...] = ()
    """Allowed GPU models; empty means any."""
    gpu_priority: SharePriority | None = None
    """A share's priority class (co-location rules); None: states none (trace replays)."""
    gpu_profile: WorkloadProfile = WorkloadProfile.UNKNOWN
    """A share's declared profile: compute-bound, memory-bound or unknown."""
    nodes: frozenset[str] | None = None
    """The nodes the pod may run on (its node rules: `workloads.node_fit`); None: any."""

    @model_validator(mode="after")
    def _consistent(self) -> PodRequest:
        if (self.num_gpus == 0) != (self.gpu_milli == 0):
            raise ValueError("num_gpus and gpu_milli must be both zero or both positive")
        if self.num_gpus > 1 and self.gpu_milli != MILLI:
            raise ValueError("a multi-GPU pod must ask for whole GPUs")
        return self

    @property
    def total_gpu_milli(self) -> int:
        """All the GPU the pod asks for, in milli-GPU (`num_gpus` × `gpu_milli`)."""
        return self.num_gpus * self.gpu_milli

    @property
    def is_share(self) -> bool:
        """Whether the pod asks for part of one GPU (see the module's `is_share`)."""
        return is_share(self.num_gpus, self.gpu_milli)

    def allows(self, model: str) -> bool:
        """Whether the pod may use GPUs of `model` (any model when `gpu_models` is empty)."""
        return not self.gpu_models or model in self.gpu_models

    def may_use(self, node: str) -> bool:
        """Whether the pod may run on the node called `node` (any node when `nodes` is None)."""
        return self.nodes is None or node in self.nodes

    def describe_gpus(self) -> str:
        """The GPU part of the request in words ("2 whole GPUs", "30 percent of one GPU")."""
        if self.is_share:
            mem = f", {self.gpu_memory_mib} MiB" if self.gpu_memory_mib else ""
            # no "%": kube-scheduler passes extender reasons through Go fmt
            return f"{self.gpu_milli / 10:g} percent of one GPU{mem}"
        return f"{self.num_gpus} whole GPU{'s' if self.num_gpus != 1 else ''}"


class Alternative(_Frozen):
    """One way to run a workload: a GPU model and how long it takes there."""

    gpu_model: str
    duration_s: Annotated[float, Field(gt=0)]
    utility: float = 1.0


class Workload(_Frozen):
    """A gang of identical pods that starts all together or not at all."""

    name: str
    pod: PodRequest
    replicas: Annotated[int, Field(ge=1)] = 1
    alternatives: tuple[Alternative, ...] = ()
    """Empty: any model the pod allows, utility 1, duration `default_duration_s`."""
    default_duration_s: Annotated[float, Field(gt=0)] = 3600.0
    deadline_s: float | None = None
    """Absolute time by which the workload must finish to earn utility."""
    strategy: PlacementStrategy = PlacementStrategy.PACK
    same_topology: str = ""
    """'' or a topology key ('zone', 'rack', 'nvlink_domain') all members must share."""
    priority: int = 0
    preemptible: bool = False
    running_on: tuple[str, ...] = ()
    """Nodes the gang runs on now (a preemption candidate when non-empty)."""

    def member_names(self) -> list[str]:
        """The members' pod names: the workload's name with -0, -1, ... up to `replicas` - 1."""
        return [f"{self.name}-{i}" for i in range(self.replicas)]


class Placement(_Frozen):
    """Where one pod goes: node, GPU indices and the share taken on each."""

    pod: str
    node: str
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: NonNeg = 0
    start_s: float = 0.0
    score: float = 0.0


class Reason(_Frozen):
    """Why something cannot be placed: the one "why not" of every layer.

    A stable CamelCase `code` (a condition or event reason), the words users
    see, and kube-scheduler's distinction: `unresolvable` when no amount of
    waiting helps (wrong GPU model, too few GPUs in total), else the obstacle
    may clear (GPUs busy now).
    """

    code: str
    message: str
    nodes: NonNeg = 0
    """How many nodes this reason ruled out (0 when it is not per node)."""
    unresolvable: bool = False


class Unplaced(_Frozen):
    """'Cannot place' as a value: the pod or workload and why."""

    name: str
    reasons: tuple[Reason, ...]

    def summary(self) -> str:
        """The reasons' messages on one line, joined by '; '."""
        return "; ".join(r.message for r in self.reasons)
