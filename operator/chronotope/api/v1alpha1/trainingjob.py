"""TrainingJob: a gang of training workers that the scheduler places in space and time.

It carries the ideas of TetriSched (alternative GPU types with relative
speed, a deadline and a utility function, so the planner may wait for better
GPUs), Ray (per-job placement strategy for the gang), SAILOR (an elastic
worker range and parallelisation hints, restarts from checkpoints) and Orion
(sharing a GPU). `kubectl scale trainingjob/x --replicas=N` resizes it within
its elastic range.

Pure: no Kubernetes client imports.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator

from chronotope.api.schema import kubernetes_type
from chronotope.api.v1alpha1._base import (
    ApiModel,
    KindInfo,
    PrinterColumn,
    Rule,
    ScaleSubresource,
)
from chronotope.api.v1alpha1.common import (
    Condition,
    DnsLabel,
    GpuRequest,
    GpuTypeName,
    ObjectMeta,
)

__all__ = [
    "AVOID_MAX",
    "KIND",
    "WHY_WAITING_MAX",
    "Checkpoint",
    "DurationEstimate",
    "GpuTypeOption",
    "ParallelismHints",
    "Placement",
    "PlacementStrategy",
    "PlanObjective",
    "PlannedParallelism",
    "Restart",
    "RestartPolicy",
    "TopologyLevel",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "TrainingPhase",
    "TrainingPlan",
    "Utility",
    "UtilityFunction",
    "WorkerPlacement",
]

MAX_WORKERS = 4096
POD_TEMPLATE_SPEC = "io.k8s.api.core.v1.PodTemplateSpec"
"""The Kubernetes type of `spec.template`; the CRD embeds its schema (`api.k8s`)."""


class GpuTypeOption(ApiModel):
    """A GPU type the job can run on, with its speed relative to the reference type."""

    name: GpuTypeName = Field(
        description="GPU product name as nodes label it, e.g. A100-SXM4-80GB."
    )
    relative_speed: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="Throughput on this type relative to estimate.referenceGpuType (which is 1.0). "
        "Omit only when parallelism.modelProfile gives per-type speed.",
    )
    memory_mib: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Memory of one GPU of this type, in MiB; when set, a shared request "
        "must fit in it.",
    )
    price_per_gpu_hour: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="Cost of one GPU of this type per hour (any currency, used consistently); "
        "needed by parallelism.objective ThroughputPerDollar.",
    )


class DurationEstimate(ApiModel):
    """How long the job runs on the reference GPU type at spec.replicas workers."""

    reference_gpu_type: GpuTypeName = Field(
        description="The GPU type the estimate was measured on; must be listed in gpuTypes."
    )
    duration_seconds: int = Field(
        ge=1, le=31_536_000, description="Estimated wall-clock run time, in seconds."
    )


class UtilityFunction(StrEnum):
    """How the value of finishing changes with the completion time (TetriSched)."""

    CONSTANT = "Constant"
    LINEAR_DECAY = "LinearDecay"
    STEP = "Step"


class Utility(ApiModel):
    """The value of finishing the job, as a function of when it finishes."""

    rules = (
        Rule(
            cel="self.function != 'LinearDecay' || (has(self.softDeadline) && has(self.deadline))",
            message="LinearDecay needs both softDeadline and deadline",
            check=lambda u: (
                u.function != UtilityFunction.LINEAR_DECAY
                or (u.soft_deadline is not None and u.deadline is not None)
            ),
            field=".softDeadline",
            reason="FieldValueRequired",
        ),
        Rule(
            cel="self.function != 'Step' || has(self.deadline)",
            message="Step needs a deadline",
            check=lambda u: u.function != UtilityFunction.STEP or u.deadline is not None,
            field=".deadline",
            reason="FieldValueRequired",
        ),
        Rule(
            cel="!has(self.softDeadline) || !has(self.deadline) "
            "|| self.deadline > self.softDeadline",
            message="deadline must be after softDeadline",
            check=lambda u: (
                u.soft_deadline is None or u.deadline is None or u.deadline > u.soft_deadline
            ),
            field=".deadline",
        ),
    )

    function: UtilityFunction = Field(
        default=UtilityFunction.CONSTANT,
        description="Constant: the same value whenever it finishes. LinearDecay: full value "
        "until softDeadline, falling linearly to zero at deadline. Step: full value until "
        "deadline, zero after.",
    )
    value: float = Field(default=1.0, ge=0, le=1_000_000, description="Value of finishing on time.")
    soft_deadline: datetime | None = Field(
        default=None, description="RFC 3339 time after which the value starts to decay."
    )
    deadline: datetime | None = Field(
        default=None, description="RFC 3339 time after which finishing is worth nothing."
    )


class PlacementStrategy(StrEnum):
    """How the gang's workers are spread over nodes (Ray placement groups)."""

    PACK = "Pack"
    SPREAD = "Spread"
    STRICT_PACK = "StrictPack"
    STRICT_SPREAD = "StrictSpread"


class TopologyLevel(StrEnum):
    """The topology domain the workers should share."""

    ANY = "Any"
    NODE = "Node"
    NVLINK_DOMAIN = "NVLinkDomain"
    RACK = "Rack"
    ZONE = "Zone"


class Placement(ApiModel):
    """Where the workers go relative to each other."""

    strategy: PlacementStrategy = Field(
        default=PlacementStrategy.PACK,
        description="Pack: as few nodes as possible (best effort). Spread: as evenly over "
        "nodes as possible, each worker where the fewest are (best effort). StrictPack: all "
        "workers on one node. StrictSpread: every worker on a different node. Ray's PACK, "
        "SPREAD, STRICT_PACK, STRICT_SPREAD. Workers that cannot share a node (they ask host "
        "ports, or a required pod anti-affinity on kubernetes.io/hostname matches their own "
        "labels) are placed StrictSpread under Pack or Spread; workers a topology spread "
        "constraint of maxSkew 1 on kubernetes.io/hostname selects are placed Spread under "
        "Pack (a node takes a second once every node it counts runs one).",
    )
    topology: TopologyLevel = Field(
        default=TopologyLevel.ANY,
        description="Keep all workers within one Node, NVLinkDomain (node label "
        "chronotope.dev/nvlink-domain), Rack (chronotope.dev/rack) or Zone "
        "(topology.kubernetes.io/zone); a node without the label is a domain of its own. "
        "Any: no wish.",
    )
    required: bool = Field(
        default=False,
        description="True: the topology wish is a hard constraint (wait rather than break it). "
        "False: a preference (kept when one domain holds the gang now).",
    )


class Checkpoint(ApiModel):
    """Where and how often the job checkpoints; restarts and resizes resume from here."""

    path: str = Field(
        pattern=r"^(/|[a-z][a-z0-9+.-]*://).+",
        max_length=1024,
        description="Absolute path on a shared volume, or a URI such as s3://bucket/run-42/.",
    )
    interval_seconds: int = Field(
        default=1800, ge=60, le=86_400, description="Seconds between checkpoints."
    )


class RestartPolicy(StrEnum):
    """What happens when a worker fails."""

    NEVER = "Never"
    ON_FAILURE = "OnFailure"


class Restart(ApiModel):
    """Failure handling for the gang (the whole gang restarts together)."""

    policy: RestartPolicy = Field(
        default=RestartPolicy.ON_FAILURE,
        description="OnFailure: restart the gang from the last checkpoint. Never: fail the job.",
    )
    max_restarts: int = Field(
        default=3, ge=0, le=100, description="Restarts allowed before the job is marked Failed."
    )


class PlanObjective(StrEnum):
    """What the profile-driven planner maximises (SAILOR)."""

    THROUGHPUT = "Throughput"
    THROUGHPUT_PER_DOLLAR = "ThroughputPerDollar"


class ParallelismHints(ApiModel):
    """Inputs for choosing the parallelisation plan when the GPU set changes (SAILOR)."""

    model_profile: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=253,
        description="Name of a model profile (per-layer times and memory per GPU type) that "
        "gives per-GPU-type speed and memory; replaces gpuTypes[].relativeSpeed.",
    )
    data_degrees: list[int] = Field(
        default_factory=list,
        max_length=16,
        description="Allowed data-parallel degrees; empty: any.",
    )
    tensor_degrees: list[int] = Field(
        default_factory=list,
        max_length=16,
        description="Allowed tensor-parallel degrees; empty: any.",
    )
    pipeline_degrees: list[int] = Field(
        default_factory=list,
        max_length=16,
        description="Allowed pipeline-parallel degrees; empty: any.",
    )
    global_batch_size: int | None = Field(
        default=None, ge=1, le=1_048_576, description="Global batch size in samples, kept fixed."
    )
    objective: PlanObjective = Field(
        default=PlanObjective.THROUGHPUT,
        description="With modelProfile: maximise samples per second, or samples per unit of "
        "cost (gpuTypes[].pricePerGpuHour).",
    )


def _elastic(spec: TrainingJobSpec) -> bool:
    low = spec.min_replicas if spec.min_replicas is not None else spec.replicas
    high = spec.max_replicas if spec.max_replicas is not None else spec.replicas
    return low < spec.replicas or high > spec.replicas


def _names_unique(items: list[Any]) -> bool:
    names = [item.name for item in items]
    return len(names) == len(set(names))


def _expect(value: Any, kind: type, what: str) -> str:
    name = "an object" if kind is dict else "a list"
    return "" if isinstance(value, kind) else f"{what} must be {name}"


def _container_problem(i: int, c: Any) -> str:
    if not isinstance(c, dict):
        return f"spec.containers[{i}] must be an object"
    if not isinstance(c.get("name"), str) or not isinstance(c.get("image"), str):
        return f"spec.containers[{i}] needs a string name and image"
    for key, kind in (("env", list), ("ports", list), ("resources", dict)):
        problem = _expect(c.get(key, kind()), kind, f"spec.containers[{i}].{key}")
        if problem:
            return problem
    return ""


def _template_problem(template: dict[str, Any]) -> str:
    """What is wrong with a worker pod template's shape ('' when nothing is)."""
    meta = template.get("metadata", {})
    problem = _expect(meta, dict, "metadata")
    for key in ("labels", "annotations"):
        problem = problem or _expect(
            meta.get(key, {}) if isinstance(meta, dict) else {}, dict, f"metadata.{key}"
        )
    spec = template.get("spec")
    if problem or spec is None:
        return problem
    if not isinstance(spec, dict):
        return "spec must be an object"
    for key in ("containers", "initContainers"):
        problem = problem or _expect(spec.get(key, []), list, f"spec.{key}")
    problem = problem or _expect(spec.get("nodeSelector", {}), dict, "spec.nodeSelector")
    if problem:
        return problem
    if not spec.get("containers"):
        return "spec.containers must list at least one container"
    for i, c in enumerate(spec["containers"]):
        problem = problem or _container_problem(i, c)
    return problem


class TrainingJobSpec(ApiModel):
    """What to train, on which GPUs, by when, and how the gang is placed."""

    rules = (
        Rule(
            cel="!has(self.minReplicas) || !has(self.maxReplicas) "
            "|| self.minReplicas <= self.maxReplicas",
            message="minReplicas must not exceed maxReplicas",
            check=lambda s: (
                s.min_replicas is None or s.max_replicas is None or s.min_replicas <= s.max_replicas
            ),
            field=".minReplicas",
        ),
        Rule(
            cel="!has(self.minReplicas) || self.replicas >= self.minReplicas",
            message="replicas must be at least minReplicas",
            check=lambda s: s.min_replicas is None or s.replicas >= s.min_replicas,
            field=".replicas",
        ),
        Rule(
            cel="!has(self.maxReplicas) || self.replicas <= self.maxReplicas",
            message="replicas must be at most maxReplicas",
            check=lambda s: s.max_replicas is None or s.replicas <= s.max_replicas,
            field=".replicas",
        ),
        Rule(
            cel="self.gpuTypes.all(a, self.gpuTypes.exists_one(b, b.name == a.name))",
            message="gpuTypes names must be unique",
            check=lambda s: _names_unique(s.gpu_types),
            field=".gpuTypes",
        ),
        Rule(
            cel="self.gpuTypes.exists(t, t.name == self.estimate.referenceGpuType)",
            message="estimate.referenceGpuType must be one of gpuTypes",
            check=lambda s: any(t.name == s.estimate.reference_gpu_type for t in s.gpu_types),
            field=".estimate.referenceGpuType",
        ),
        Rule(
            cel="self.gpuTypes.all(t, has(t.relativeSpeed)) "
            "|| (has(self.parallelism) && has(self.parallelism.modelProfile))",
            message="every gpuTypes entry needs relativeSpeed "
            "unless parallelism.modelProfile is set",
            check=lambda s: (
                all(t.relative_speed is not None for t in s.gpu_types)
                or (s.parallelism is not None and s.parallelism.model_profile is not None)
            ),
            field=".gpuTypes",
            reason="FieldValueRequired",
        ),
        Rule(
            cel="!has(self.parallelism) || !has(self.parallelism.objective) "
            "|| self.parallelism.objective != 'ThroughputPerDollar' "
            "|| self.gpuTypes.all(t, has(t.pricePerGpuHour))",
            message="parallelism.objective ThroughputPerDollar needs pricePerGpuHour "
            "on every gpuTypes entry",
            check=lambda s: (
                s.parallelism is None
                or s.parallelism.objective is not PlanObjective.THROUGHPUT_PER_DOLLAR
                or all(t.price_per_gpu_hour is not None for t in s.gpu_types)
            ),
            field=".gpuTypes",
            reason="FieldValueRequired",
        ),
        Rule(
            cel="!has(self.gpu.shared) "
            "|| self.gpuTypes.all(t, !has(t.memoryMiB) "
            "|| self.gpu.shared.memoryMiB <= t.memoryMiB)",
            message="gpu.shared.memoryMiB exceeds the memory of a GPU type in gpuTypes",
            check=lambda s: (
                s.gpu.shared is None
                or all(
                    t.memory_mib is None or s.gpu.shared.memory_mib <= t.memory_mib
                    for t in s.gpu_types
                )
            ),
            field=".gpu.shared.memoryMiB",
        ),
        Rule(
            cel="has(self.checkpoint) "
            "|| ((!has(self.minReplicas) || self.minReplicas == self.replicas) "
            "&& (!has(self.maxReplicas) || self.maxReplicas == self.replicas))",
            message="an elastic job (minReplicas or maxReplicas differ from replicas) needs "
            "checkpoint, since resizing restarts workers from the last checkpoint",
            check=lambda s: s.checkpoint is not None or not _elastic(s),
            field=".checkpoint",
            reason="FieldValueRequired",
        ),
    )

    replicas: int = Field(
        ge=1,
        le=MAX_WORKERS,
        description="Number of workers wanted; `kubectl scale` sets it. Must lie within "
        "[minReplicas, maxReplicas].",
    )
    min_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WORKERS,
        description="Fewest workers the job can run with; omit for a fixed-size job.",
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WORKERS,
        description="Most workers the job can use; omit for a fixed-size job.",
    )
    template: dict[str, Any] = Field(
        description="Pod template for every worker (a core/v1 PodTemplateSpec: metadata and "
        "spec). GPUs are requested through spec.gpu, not in the container resources.",
        json_schema_extra=kubernetes_type(POD_TEMPLATE_SPEC),
    )

    @field_validator("template")
    @classmethod
    def _template_shape(cls, template: dict[str, Any]) -> dict[str, Any]:
        """The parts of the template the operator builds workers from must have their types."""
        problem = _template_problem(template)
        if problem:
            raise ValueError(f"template.{problem}")
        return template

    gpu: GpuRequest = Field(description="GPUs per worker: whole GPUs (count) or a share (shared).")
    gpu_types: list[GpuTypeOption] = Field(
        min_length=1,
        max_length=16,
        description="GPU types the job can use, each with its relative speed; the planner "
        "picks one type for the whole gang and may wait for a faster one.",
    )
    estimate: DurationEstimate = Field(description="Run-time estimate on a reference GPU type.")
    utility: Utility | None = Field(
        default=None,
        description="Value of finishing as a function of completion time; omit for a constant "
        "value and no deadline.",
    )
    placement: Placement = Field(
        default_factory=Placement, description="Placement strategy and topology wish for the gang."
    )
    priority: int = Field(
        default=0, ge=0, le=1000, description="Higher runs first and may preempt lower."
    )
    queue: DnsLabel = Field(default="default", description="Queue this job is admitted through.")
    preemptible: bool = Field(
        default=True,
        description=(
            "Whether higher-priority work, or the cluster policy's lease (a job with a "
            "checkpoint and a fixed size yields to much shorter work, or moves to a faster "
            "GPU type), may stop this job; it resumes from its checkpoint."
        ),
    )
    checkpoint: Checkpoint | None = Field(
        default=None, description="Checkpoint location and interval; required for elastic jobs."
    )
    restart: Restart = Field(default_factory=Restart, description="Failure handling for the gang.")
    parallelism: ParallelismHints | None = Field(
        default=None, description="Hints for choosing data/tensor/pipeline parallel degrees."
    )


WHY_WAITING_MAX = 4096
"""`status.whyWaiting`'s maxLength (the controller cuts a longer reason to it)."""
AVOID_MAX = 32
"""`status.avoidNodes`' maxItems: the most nodes a job avoids at once (the oldest go first)."""


class TrainingPhase(StrEnum):
    """Where a TrainingJob is in its life."""

    PENDING = "Pending"
    WAITING = "Waiting"
    STARTING = "Starting"
    RUNNING = "Running"
    RESIZING = "Resizing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class PlannedParallelism(ApiModel):
    """The parallelisation the job runs with."""

    data: int = Field(ge=1, description="Data-parallel degree.")
    tensor: int = Field(default=1, ge=1, description="Tensor-parallel degree.")
    pipeline: int = Field(default=1, ge=1, description="Pipeline-parallel degree.")
    micro_batch_size: int | None = Field(default=None, ge=1, description="Micro-batch size.")


class TrainingPlan(ApiModel):
    """The alternative the planner chose: GPU type, size, parallelism and timing."""

    gpu_type: str = Field(max_length=63, description="Chosen GPU type.")
    workers: int = Field(ge=0, description="Chosen number of workers.")
    planned_for_replicas: int | None = Field(
        default=None,
        ge=0,
        description="spec.replicas when the plan was made; a different spec.replicas "
        "(kubectl scale) is a resize.",
    )
    total_gpus: float = Field(
        ge=0, description="GPUs held by the whole gang (shares count as fractions)."
    )
    parallelism: PlannedParallelism | None = Field(default=None, description="Chosen parallelism.")
    start_time: datetime | None = Field(default=None, description="Planned or actual start.")
    predicted_completion_time: datetime | None = Field(
        default=None, description="Predicted completion time under this plan."
    )
    expected_utility: float | None = Field(
        default=None, description="Utility the plan expects to earn."
    )
    predicted_samples_per_second: float | None = Field(
        default=None,
        ge=0,
        description="Training throughput the model profile predicts for this plan.",
    )
    planner: str | None = Field(
        default=None,
        max_length=1024,
        description="How the plan was made: the model profile and what it predicted, or "
        "the parallelism hints.",
    )


class WorkerPlacement(ApiModel):
    """Where one worker runs."""

    pod: str = Field(max_length=253, description="Worker pod name.")
    node: str = Field(max_length=253, description="Node the pod is bound to.")
    gpus: list[str] = Field(default_factory=list, description="GPU indices or UUIDs on the node.")


class TrainingJobStatus(ApiModel):
    """What the operator and scheduler decided, and what is happening."""

    phase: TrainingPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation this status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Standard conditions: Schedulable (can it be placed, and why not), Running, and "
            "QuotaReserved (does its queue's quota admit it; Kueue's name)."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int = Field(
        default=0, ge=0, description="Workers running now (read by `kubectl scale`)."
    )
    selector: str | None = Field(
        default=None, description="Label selector of the worker pods (for the scale subresource)."
    )
    plan: TrainingPlan | None = Field(default=None, description="The chosen plan.")
    placement: list[WorkerPlacement] = Field(
        default_factory=list, description="Where each worker runs."
    )
    predicted_start_time: datetime | None = Field(
        default=None,
        description=(
            "A waiting job: when the plan-ahead expects it to start (the GPUs it waits for, "
            "or its queue's quota, free up at the running jobs' predicted ends)."
        ),
    )
    why_waiting: str | None = Field(
        default=None,
        max_length=WHY_WAITING_MAX,
        description="Plain-language reason the job is not running.",
    )
    avoid_nodes: list[str] | None = Field(
        default=None,
        max_length=AVOID_MAX,
        description="Nodes the job's next plans leave out: its gang waited on them and "
        "kube-scheduler did not bind its workers there (a filter the plan does not model, "
        "such as an in-tree disk another pod there mounts). Its workers get a node affinity "
        "excluding them by name. Cleared once a gang is placed; never every node the job may use.",
    )
    restarts: int = Field(default=0, ge=0, description="Gang restarts so far.")
    completed_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Share of the work done before the last restart, estimated from the time "
        "run under each earlier plan; later plans only predict the rest.",
    )
    last_checkpoint_time: datetime | None = Field(default=None, description="Last checkpoint.")
    estimate_ratio: float | None = Field(
        default=None,
        ge=0,
        description="A finished job: the work it took over its estimate (its run time over "
        "each plan's predicted time; 2 means it took twice `spec.estimate`). The cluster "
        "policy learns how wrong estimates are from these.",
    )


class TrainingJob(ApiModel):
    """A gang of training workers, scheduled in space and time across GPU types."""

    api_version: Literal["chronotope.dev/v1alpha1"] = Field(
        default="chronotope.dev/v1alpha1", description="API version."
    )
    kind: Literal["TrainingJob"] = Field(default="TrainingJob", description="Kind.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Object metadata.")
    spec: TrainingJobSpec = Field(description="Desired state.")
    status: TrainingJobStatus | None = Field(default=None, description="Observed state.")


KIND = KindInfo(
    kind="TrainingJob",
    plural="trainingjobs",
    short_names=("tj", "tjob"),
    spec_model=TrainingJobSpec,
    status_model=TrainingJobStatus,
    columns=(
        PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
        PrinterColumn("Workers", ".status.replicas", "integer", "Workers running"),
        PrinterColumn("Want", ".spec.replicas", "integer", "Workers wanted"),
        PrinterColumn("GPUs", ".status.plan.totalGpus", "number", "GPUs held by the gang"),
        PrinterColumn("GPU-Type", ".status.plan.gpuType", description="Chosen GPU type"),
        PrinterColumn(
            "Finish", ".status.plan.predictedCompletionTime", description="Predicted completion"
        ),
        PrinterColumn(
            "Deadline", ".spec.utility.deadline", description="Hard deadline", priority=1
        ),
        PrinterColumn("Queue", ".spec.queue", description="Queue", priority=1),
        PrinterColumn("Why", ".status.whyWaiting", description="Why it waits", priority=1),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
    ),
    scale=ScaleSubresource(".spec.replicas", ".status.replicas", ".status.selector"),
)
