"""ModelVariant: a fine-tuned model served as a compressed delta over a resident base.

It carries DeltaZip's inputs: the base model (shared by every variant of it
and kept resident), the delta (compression bits, sparsity pattern such as
2:4, compressed size, which sets the swap cost), the variant's expected
traffic (or a Prometheus query for its live rate), its time-to-first-token
SLO, and the serving group whose replicas batch requests for different
variants of one base together. The status reports where the delta lives
(GPU, host memory or disk) and the expected swap latency.

Pure: no Kubernetes client imports.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from chronotope.api.v1alpha1._base import ApiModel, KindInfo, PrinterColumn, Rule
from chronotope.api.v1alpha1.common import (
    QUOTA_DEMAND_DESCRIPTION,
    Condition,
    DnsLabel,
    GpuRequest,
    ObjectMeta,
    QuotaDemand,
)
from chronotope.api.v1alpha1.inferencepipeline import PrometheusSource

__all__ = [
    "KIND",
    "BaseModelRef",
    "Delta",
    "ModelVariant",
    "ModelVariantSpec",
    "ModelVariantStatus",
    "Residency",
    "VariantPhase",
    "VariantSlo",
    "VariantTraffic",
]

_SPARSITY_PATTERN = r"^(Dense|[1-9][0-9]?:[1-9][0-9]?)$"


def _n_of_m(sparsity: str) -> bool:
    if sparsity == "Dense":
        return True
    n, m = (int(x) for x in sparsity.split(":"))
    return n < m


class BaseModelRef(ApiModel):
    """The base model the delta applies to; one resident copy serves all its variants."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][-A-Za-z0-9_./]*$",
        max_length=253,
        description="Base model name, e.g. meta-llama/Llama-2-7b-hf.",
    )
    parameters_billions: float | None = Field(
        default=None, gt=0, le=100_000, description="Parameter count, in billions."
    )
    size_mib: int = Field(ge=1, le=16_777_216, description="Size of the base weights, in MiB.")


class Delta(ApiModel):
    """The compressed difference between the variant and its base."""

    rules = (
        Rule(
            cel="self.sparsity == 'Dense' "
            "|| int(self.sparsity.split(':')[0]) < int(self.sparsity.split(':')[1])",
            message="sparsity N:M needs N < M (N of every M weights kept), e.g. 2:4",
            check=lambda d: _n_of_m(d.sparsity),
            field=".sparsity",
        ),
    )

    uri: str = Field(
        pattern=r"^[a-z][a-z0-9+.-]*://.+",
        max_length=2048,
        description="Where the delta artifact lives, e.g. s3://models/llama-7b/chat-v2.delta.",
    )
    bits: Literal[2, 3, 4, 8, 16] = Field(
        default=4, description="Quantisation bits per delta weight: 2, 3, 4, 8 or 16."
    )
    sparsity: str = Field(
        default="Dense",
        pattern=_SPARSITY_PATTERN,
        max_length=5,
        description="Dense, or a structured N:M pattern such as 2:4 (N of every M weights kept).",
    )
    compressed_size_mib: int = Field(
        ge=1, le=16_777_216, description="Size of the compressed delta, in MiB; sets the swap cost."
    )


class VariantTraffic(ApiModel):
    """Traffic the variant is expected to receive, and where to read its live rate."""

    expected_qps: float = Field(ge=0, le=10_000_000, description="Mean queries per second.")
    peak_qps: float | None = Field(default=None, ge=0, le=10_000_000, description="Peak rate.")
    prometheus: PrometheusSource | None = Field(
        default=None,
        description="A live Prometheus rate; when set (and answering) it replaces expectedQPS "
        "for planning.",
    )


class VariantSlo(ApiModel):
    """The variant's latency objective: the P99 time to first token."""

    p99_latency_ms: float = Field(
        gt=0, le=600_000, description="99th-percentile time to first token, in ms."
    )


class ModelVariantSpec(ApiModel):
    """The variant's base, delta, traffic, SLO and serving group."""

    rules = (
        Rule(
            cel="self.delta.compressedSizeMiB < self.base.sizeMiB",
            message="delta.compressedSizeMiB must be smaller than base.sizeMiB",
            check=lambda s: s.delta.compressed_size_mib < s.base.size_mib,
            field=".delta.compressedSizeMiB",
        ),
        Rule(
            cel="!has(self.gpu) || !has(self.gpu.shared) "
            "|| self.gpu.shared.memoryMiB >= self.base.sizeMiB + self.delta.compressedSizeMiB",
            message="gpu.shared.memoryMiB must hold the base and the delta "
            "(base.sizeMiB + delta.compressedSizeMiB)",
            check=lambda s: (
                s.gpu is None
                or s.gpu.shared is None
                or s.gpu.shared.memory_mib >= s.base.size_mib + s.delta.compressed_size_mib
            ),
            field=".gpu.shared.memoryMiB",
        ),
        Rule(
            cel="!has(self.traffic.peakQPS) || self.traffic.peakQPS >= self.traffic.expectedQPS",
            message="traffic.peakQPS must be at least traffic.expectedQPS",
            check=lambda s: (
                s.traffic.peak_qps is None or s.traffic.peak_qps >= s.traffic.expected_qps
            ),
            field=".traffic.peakQPS",
        ),
    )

    base: BaseModelRef = Field(description="The base model.")
    delta: Delta = Field(description="The compressed delta.")
    traffic: VariantTraffic = Field(description="Expected traffic.")
    slo: VariantSlo = Field(description="Latency objective.")
    serving_group: DnsLabel | None = Field(
        default=None,
        description="Variants in one group share base-model replicas and are batched together; "
        "omit for one group per base model.",
    )
    gpu: GpuRequest | None = Field(
        default=None,
        description="GPUs for each replica of the serving group; the group takes the largest "
        "request of its variants (whole GPUs over a share); omit for one whole GPU.",
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Serving replicas that keep this delta resident at least; "
        "hot variants get more.",
    )


class VariantPhase(StrEnum):
    """Where a ModelVariant is in its life."""

    PENDING = "Pending"
    LOADING = "Loading"
    SERVING = "Serving"
    SWAPPED = "Swapped"
    FAILED = "Failed"


class Residency(StrEnum):
    """Where the delta's weights are now; sets how long the next request waits."""

    GPU = "GPU"
    HOST = "Host"
    DISK = "Disk"


class ModelVariantStatus(ApiModel):
    """Where the variant is served and how fast it can answer."""

    phase: VariantPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = Field(default=None, ge=0, description="Generation observed.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Standard conditions: Ready, Resident.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    serving_replica: str | None = Field(
        default=None, max_length=253, description="Pod that serves the variant."
    )
    node: str | None = Field(default=None, max_length=253, description="Node of the serving pod.")
    gpu_type: str | None = Field(default=None, max_length=63, description="GPU type serving it.")
    residency: Residency | None = Field(default=None, description="GPU, Host or Disk.")
    expected_swap_latency_ms: float | None = Field(
        default=None, ge=0, description="Expected time to bring the delta to GPU, in ms."
    )
    why_waiting: str | None = Field(
        default=None, max_length=4096, description="Plain-language reason it is not serving."
    )
    quota_demand: list[QuotaDemand] | None = Field(
        default=None,
        max_length=64,
        description=f"Its serving group's demand. {QUOTA_DEMAND_DESCRIPTION}",
    )


class ModelVariant(ApiModel):
    """A fine-tuned variant served as a compressed delta over a shared base model."""

    api_version: Literal["chronotope.dev/v1alpha1"] = Field(
        default="chronotope.dev/v1alpha1", description="API version."
    )
    kind: Literal["ModelVariant"] = Field(default="ModelVariant", description="Kind.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Object metadata.")
    spec: ModelVariantSpec = Field(description="Desired state.")
    status: ModelVariantStatus | None = Field(default=None, description="Observed state.")


KIND = KindInfo(
    kind="ModelVariant",
    plural="modelvariants",
    short_names=("mv",),
    spec_model=ModelVariantSpec,
    status_model=ModelVariantStatus,
    columns=(
        PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
        PrinterColumn("Base", ".spec.base.name", description="Base model"),
        PrinterColumn("Bits", ".spec.delta.bits", "integer", "Delta quantisation bits"),
        PrinterColumn("Sparsity", ".spec.delta.sparsity", description="Delta sparsity"),
        PrinterColumn("Residency", ".status.residency", description="GPU, Host or Disk"),
        PrinterColumn("GPU-Type", ".status.gpuType", description="GPU type serving it"),
        PrinterColumn("Swap-ms", ".status.expectedSwapLatencyMs", "number", "Expected swap-in"),
        PrinterColumn("Group", ".spec.servingGroup", description="Serving group", priority=1),
        PrinterColumn("Replica", ".status.servingReplica", description="Serving pod", priority=1),
        PrinterColumn("Why", ".status.whyWaiting", description="Why it is not serving", priority=1),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
    ),
)
