"""Chronotope API, version v1alpha1: the workload kinds and the quota kinds.

Workloads: TrainingJob, InferencePipeline, ModelVariant. Quotas: Queue
(cluster-scoped) and LocalQueue (a namespace's name for a Queue). One module
per kind; shared types (GPU requests and sharing, conditions) in `common`.
Every model is pure pydantic and is the single source of the CRDs
(`chronotope gen-crds`) and of `docs/api.md`.
"""

from chronotope.api.v1alpha1 import (
    inferencepipeline,
    localqueue,
    modelvariant,
    queue,
    trainingjob,
)
from chronotope.api.v1alpha1._base import ApiModel, KindInfo, PrinterColumn, Rule
from chronotope.api.v1alpha1.common import (
    GROUP,
    VERSION,
    Condition,
    ConditionStatus,
    GpuRequest,
    GpuShare,
    SharePriority,
    WorkloadProfile,
)
from chronotope.api.v1alpha1.inferencepipeline import InferencePipeline, InferencePipelineSpec
from chronotope.api.v1alpha1.localqueue import LocalQueue, LocalQueueSpec
from chronotope.api.v1alpha1.modelvariant import ModelVariant, ModelVariantSpec
from chronotope.api.v1alpha1.queue import Queue, QueueSpec
from chronotope.api.v1alpha1.trainingjob import TrainingJob, TrainingJobSpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "MODELS",
    "VERSION",
    "ApiModel",
    "Condition",
    "ConditionStatus",
    "GpuRequest",
    "GpuShare",
    "InferencePipeline",
    "InferencePipelineSpec",
    "KindInfo",
    "LocalQueue",
    "LocalQueueSpec",
    "ModelVariant",
    "ModelVariantSpec",
    "PrinterColumn",
    "Queue",
    "QueueSpec",
    "Rule",
    "SharePriority",
    "TrainingJob",
    "TrainingJobSpec",
    "WorkloadProfile",
]

API_VERSION = f"{GROUP}/{VERSION}"

# The kinds, in the order docs and `crds/` list them.
KINDS: tuple[KindInfo, ...] = (
    trainingjob.KIND,
    inferencepipeline.KIND,
    modelvariant.KIND,
    queue.KIND,
    localqueue.KIND,
)

# kind name -> top-level model, for parsing manifests.
MODELS: dict[str, type[ApiModel]] = {
    "TrainingJob": TrainingJob,
    "InferencePipeline": InferencePipeline,
    "ModelVariant": ModelVariant,
    "Queue": Queue,
    "LocalQueue": LocalQueue,
}
