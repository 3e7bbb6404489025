"""LocalQueue: a namespace's door to a Queue (Kueue's LocalQueue).

A TrainingJob names a LocalQueue of its own namespace in `spec.queue`
(default `default`); the LocalQueue names the cluster-scoped Queue whose
quota the job is admitted against. A platform team creates one LocalQueue
per team namespace, so users never see Queue names. A job whose LocalQueue,
or whose LocalQueue's Queue, does not exist waits with a condition that
names the missing object (docs/queues.md).

Pure: no Kubernetes client imports.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from chronotope.api.v1alpha1._base import ApiModel, KindInfo, PrinterColumn
from chronotope.api.v1alpha1.common import Condition, DnsLabel, ObjectMeta

__all__ = ["KIND", "LocalQueue", "LocalQueueSpec", "LocalQueueStatus"]


class LocalQueueSpec(ApiModel):
    """The Queue that this namespace's jobs are admitted against."""

    queue: DnsLabel = Field(description="Name of the cluster-scoped Queue.")


class LocalQueueStatus(ApiModel):
    """How many of the namespace's workloads wait and run through this LocalQueue."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation this status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Standard conditions: Active (False while the Queue is missing).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    admitted_workloads: int = Field(default=0, ge=0, description="Workloads admitted now.")
    pending_workloads: int = Field(default=0, ge=0, description="Workloads waiting for quota.")


class LocalQueue(ApiModel):
    """A namespaced name for a Queue: jobs name it in spec.queue."""

    api_version: Literal["chronotope.dev/v1alpha1"] = Field(
        default="chronotope.dev/v1alpha1", description="API version."
    )
    kind: Literal["LocalQueue"] = Field(default="LocalQueue", description="Kind.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Object metadata.")
    spec: LocalQueueSpec = Field(description="Desired state.")
    status: LocalQueueStatus | None = Field(default=None, description="Observed state.")


KIND = KindInfo(
    kind="LocalQueue",
    plural="localqueues",
    short_names=("lq",),
    spec_model=LocalQueueSpec,
    status_model=LocalQueueStatus,
    columns=(
        PrinterColumn("Queue", ".spec.queue", description="The Queue it admits through"),
        PrinterColumn("Admitted", ".status.admittedWorkloads", "integer", "Workloads admitted"),
        PrinterColumn("Pending", ".status.pendingWorkloads", "integer", "Workloads waiting"),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
    ),
)
