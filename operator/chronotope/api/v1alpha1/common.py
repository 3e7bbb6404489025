"""Types shared by the three Chronotope kinds: GPU requests and sharing, conditions, names.

The GPU sharing request lives here because it is used by every kind and by
plain pods (through annotations, see `chronotope.api.annotations`): one
model, one set of rules, whatever the route a request arrives by.

Pure: no Kubernetes client imports.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from chronotope.api.v1alpha1._base import ApiModel, Rule

__all__ = [
    "GPU_TYPE_PATTERN",
    "GROUP",
    "QUOTA_DEMAND_DESCRIPTION",
    "VERSION",
    "Condition",
    "ConditionStatus",
    "DnsLabel",
    "GpuRequest",
    "GpuShare",
    "GpuTypeName",
    "ObjectMeta",
    "QuotaDemand",
    "SharePriority",
    "WorkloadProfile",
]

GROUP = "chronotope.dev"
VERSION = "v1alpha1"

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
GPU_TYPE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, min_length=1, max_length=63)]
"""A Kubernetes DNS label: lower-case alphanumerics and '-', at most 63 characters."""

GpuTypeName = Annotated[str, Field(pattern=GPU_TYPE_PATTERN, min_length=1, max_length=63)]
"""A GPU product name as nodes label it (`nvidia.com/gpu.product`), e.g. `A100-SXM4-80GB`."""

MAX_GPU_MEMORY_MIB = 1_048_576  # 1 TiB: far above any GPU today, a sanity bound


class SharePriority(StrEnum):
    """Priority class of a job that shares a GPU (Orion)."""

    HIGH = "High"
    BEST_EFFORT = "BestEffort"


class WorkloadProfile(StrEnum):
    """What bounds a workload's kernels; complementary profiles share a GPU well (Orion)."""

    COMPUTE_BOUND = "ComputeBound"
    MEMORY_BOUND = "MemoryBound"
    UNKNOWN = "Unknown"


class GpuShare(ApiModel):
    """A share of one GPU: memory, compute share, priority class and profile.

    High-priority sharers keep their latency; best-effort sharers fill the
    gaps, bounded by their compute share, and are placed next to work of the
    opposite profile where possible (Orion).
    """

    memory_mib: int = Field(
        ge=1,
        le=MAX_GPU_MEMORY_MIB,
        description="GPU memory this workload may use, in MiB; enforced as a hard limit.",
    )
    compute_percent: int = Field(
        default=100,
        ge=1,
        le=100,
        description="Share of the GPU's streaming multiprocessors, in percent (1-100); "
        "becomes the MPS active-thread percentage.",
    )
    priority: SharePriority = Field(
        default=SharePriority.BEST_EFFORT,
        description="High: latency-critical, keeps its share when others contend. "
        "BestEffort: fills idle capacity and yields to High.",
    )
    profile: WorkloadProfile = Field(
        default=WorkloadProfile.UNKNOWN,
        description="ComputeBound, MemoryBound or Unknown; the scheduler co-locates "
        "complementary profiles.",
    )


class GpuRequest(ApiModel):
    """GPUs for one pod: a number of whole GPUs, or a share of one GPU."""

    rules = (
        Rule(
            cel="has(self.count) != has(self.shared)",
            message="set exactly one of count (whole GPUs) or shared (a share of one GPU)",
            check=lambda r: (r.count is None) != (r.shared is None),
        ),
    )

    count: int | None = Field(
        default=None, ge=1, le=64, description="Whole GPUs per pod. Omit when `shared` is set."
    )
    shared: GpuShare | None = Field(
        default=None, description="A share of one GPU. Omit when `count` is set."
    )


class QuotaDemand(ApiModel):
    """What a serving workload asks of its queue's quota on one GPU type."""

    gpu_type: str = Field(max_length=63, description="GPU type.")
    gpus: int = Field(default=0, ge=0, description="Whole GPUs.")
    share_milli: int = Field(default=0, ge=0, description="GPU-share units.")


QUOTA_DEMAND_DESCRIPTION = (
    "What it asks of its queue's quota per GPU type (its planned Deployments' replicas x "
    "their pods' GPUs), written while quota holds all of it back; the TrainingJob admission "
    "cycle keeps it (all its GPU types at once) for it when it fits, in age order, so a younger "
    "TrainingJob of its queue does not take it (docs/queues.md)."
)


class ConditionStatus(StrEnum):
    """Status of a condition, as in every Kubernetes API."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A standard Kubernetes condition (the shape of metav1.Condition)."""

    type: str = Field(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        max_length=316,
        description="Type of condition in CamelCase, e.g. Ready, Planned, Waiting.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The .metadata.generation the condition was set from.",
    )
    last_transition_time: datetime = Field(
        description="When the condition last changed from one status to another."
    )
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        min_length=1,
        max_length=1024,
        description="Programmatic identifier for the last transition, in CamelCase.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable detail of the transition."
    )


class ObjectMeta(ApiModel):
    """The parts of Kubernetes object metadata the models read; the rest passes through."""

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(default=None, max_length=253, description="Object name.")
    namespace: str | None = Field(default=None, max_length=63, description="Namespace.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    generation: int | None = Field(default=None, description="Set by the API server.")

    def extra_fields(self) -> dict[str, Any]:
        """Server-set metadata (uid, resourceVersion, ...) kept as plain data."""
        return dict(self.__pydantic_extra__ or {})
