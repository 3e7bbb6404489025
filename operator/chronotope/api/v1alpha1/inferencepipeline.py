"""InferencePipeline: a DAG of models served under one end-to-end P99 latency SLO.

It carries InferLine's inputs: per-stage profiles (batch size -> latency,
throughput) for each GPU type, DAG edges with the fraction of queries that
visit the next stage, a traffic source for the planner's arrival trace and
the tuner's live envelope, and a cost table. The planner picks GPU type,
batch size and replicas per stage; the status reports its choice, the
predicted P99 and cost, and the tuner's state.

Stages are listed in topological order (every edge points to a later stage),
which lets the API server reject cycles with a CEL rule.

Pure: no Kubernetes client imports.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field

from chronotope.api.v1alpha1._base import ApiModel, KindInfo, PrinterColumn, Rule
from chronotope.api.v1alpha1.common import (
    QUOTA_DEMAND_DESCRIPTION,
    Condition,
    DnsLabel,
    GpuRequest,
    GpuTypeName,
    ObjectMeta,
    QuotaDemand,
)

__all__ = [
    "KIND",
    "MAX_P99_HISTORY",
    "BatchPoint",
    "CostEntry",
    "Edge",
    "EnvelopePoint",
    "GpuProfile",
    "InferencePipeline",
    "InferencePipelineSpec",
    "InferencePipelineStatus",
    "LatencySlo",
    "ModelRef",
    "P99Point",
    "PipelinePhase",
    "PrometheusSource",
    "QuotaRoom",
    "ScalingRow",
    "Stage",
    "StagePlan",
    "TraceSource",
    "Traffic",
    "TunerMode",
    "TunerState",
    "WindowRate",
]

MAX_STAGES = 16
MAX_EDGES = 64


class ModelRef(ApiModel):
    """What a stage serves: a ModelVariant in the same namespace, or a container image."""

    rules = (
        Rule(
            cel="has(self.variant) != has(self.image)",
            message="set exactly one of variant or image",
            check=lambda m: (m.variant is None) != (m.image is None),
        ),
    )

    variant: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=253,
        description="Name of a ModelVariant in the pipeline's namespace.",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Container image of the model server.",
    )


class BatchPoint(ApiModel):
    """Measured behaviour of one replica at one batch size."""

    batch_size: int = Field(ge=1, le=4096, description="Batch size.")
    latency_ms: float = Field(gt=0, le=600_000, description="Time to process one batch, in ms.")
    throughput_qps: float = Field(
        gt=0, le=10_000_000, description="Queries per second at this batch size."
    )


class GpuProfile(ApiModel):
    """A stage's measured profile on one GPU type."""

    rules = (
        Rule(
            cel="self.batches.all(a, self.batches.exists_one(b, b.batchSize == a.batchSize))",
            message="batch sizes must be unique within a profile",
            check=lambda p: len({b.batch_size for b in p.batches}) == len(p.batches),
            field=".batches",
        ),
    )

    gpu_type: GpuTypeName = Field(description="GPU type the profile was measured on.")
    batches: list[BatchPoint] = Field(
        min_length=1, max_length=32, description="Latency and throughput by batch size."
    )


class Stage(ApiModel):
    """One model in the pipeline."""

    rules = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="minReplicas must not exceed maxReplicas",
            check=lambda s: s.min_replicas <= s.max_replicas,
            field=".minReplicas",
        ),
        Rule(
            cel="self.profiles.all(a, self.profiles.exists_one(b, b.gpuType == a.gpuType))",
            message="profiles must name each GPU type once",
            check=lambda s: len({p.gpu_type for p in s.profiles}) == len(s.profiles),
            field=".profiles",
        ),
    )

    name: DnsLabel = Field(description="Stage name, unique in the pipeline.")
    model: ModelRef = Field(description="The model this stage serves.")
    profiles: list[GpuProfile] = Field(
        min_length=1,
        max_length=8,
        description="Profiles per GPU type; the planner chooses among them.",
    )
    gpu: GpuRequest | None = Field(
        default=None, description="GPUs per replica; omit for one whole GPU."
    )
    min_replicas: int = Field(default=1, ge=0, le=1024, description="Fewest replicas.")
    max_replicas: int = Field(default=16, ge=1, le=1024, description="Most replicas.")


class Edge(ApiModel):
    """A DAG edge: queries leaving `from` continue to `to` with probability `fraction`."""

    from_: DnsLabel = Field(alias="from", description="Upstream stage name.")
    to: DnsLabel = Field(description="Downstream stage name.")
    fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Fraction of upstream queries that visit `to`, in (0, 1].",
    )


class LatencySlo(ApiModel):
    """A latency objective."""

    p99_latency_ms: float = Field(
        gt=0, le=600_000, description="99th-percentile latency bound, in ms."
    )
    observed_p99_query: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="PromQL whose first sample is the observed end-to-end P99 latency in "
        "seconds, e.g. histogram_quantile(0.99, sum(rate(x_seconds_bucket[1m])) by (le)); "
        "asked of traffic.prometheus.address, else the operator's --prometheus.",
    )


class PrometheusSource(ApiModel):
    """Arrival rate from a Prometheus query."""

    query: str = Field(
        min_length=1, max_length=4096, description="PromQL giving queries per second."
    )
    address: str | None = Field(
        default=None,
        pattern=r"^https?://.+",
        max_length=1024,
        description="Prometheus base URL; omit for the operator's default.",
    )


class TraceSource(ApiModel):
    """A sample arrival trace held in a ConfigMap: one arrival time in seconds per line."""

    config_map: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253, description="ConfigMap name."
    )
    key: str = Field(default="arrivals.txt", max_length=253, description="Key in the ConfigMap.")


class Traffic(ApiModel):
    """Where the planner gets its arrival trace and the tuner its live rate: exactly one source."""

    rules = (
        Rule(
            cel="(has(self.fixedQPS) ? 1 : 0) + (has(self.prometheus) ? 1 : 0) "
            "+ (has(self.trace) ? 1 : 0) == 1",
            message="set exactly one of fixedQPS, prometheus or trace",
            check=lambda t: sum(x is not None for x in (t.fixed_qps, t.prometheus, t.trace)) == 1,
        ),
    )

    fixed_qps: float | None = Field(
        default=None, gt=0, le=10_000_000, description="A constant arrival rate."
    )
    prometheus: PrometheusSource | None = Field(default=None, description="A live Prometheus rate.")
    trace: TraceSource | None = Field(default=None, description="A recorded arrival trace.")


class CostEntry(ApiModel):
    """Price of one GPU of a type."""

    gpu_type: GpuTypeName = Field(description="GPU type.")
    per_hour: float = Field(ge=0, le=1_000_000, description="Cost of one GPU for one hour.")


def _stage_index(spec: InferencePipelineSpec) -> dict[str, int]:
    return {stage.name: i for i, stage in enumerate(spec.stages)}


def _topological(spec: InferencePipelineSpec) -> bool:
    index = _stage_index(spec)
    return all(index.get(e.from_, -1) < index.get(e.to, -1) for e in spec.edges)


class InferencePipelineSpec(ApiModel):
    """The pipeline's stages, DAG, SLO, traffic and budget."""

    rules = (
        Rule(
            cel="self.stages.all(a, self.stages.exists_one(b, b.name == a.name))",
            message="stage names must be unique",
            check=lambda s: len(_stage_index(s)) == len(s.stages),
            field=".stages",
        ),
        Rule(
            cel="self.edges.all(e, self.stages.exists(s, s.name == e.from) "
            "&& self.stages.exists(s, s.name == e.to))",
            message="every edge must reference existing stages (from and to)",
            check=lambda s: all(
                e.from_ in _stage_index(s) and e.to in _stage_index(s) for e in s.edges
            ),
            field=".edges",
        ),
        Rule(
            # Two-variable comprehensions (index, value) need Kubernetes 1.33+; `indexOf` on
            # a mapped list would be simpler but exceeds the CEL cost budget.
            cel="self.edges.all(e, self.stages.exists(i, a, a.name == e.from "
            "&& self.stages.exists(j, b, b.name == e.to && i < j)))",
            message="edges must point from an earlier to a later stage: list stages in "
            "topological order (this rules out cycles)",
            check=_topological,
            field=".edges",
        ),
        Rule(
            cel="self.edges.all(a, self.edges.exists_one(b, b.from == a.from && b.to == a.to))",
            message="edges must be unique",
            check=lambda s: len({(e.from_, e.to) for e in s.edges}) == len(s.edges),
            field=".edges",
        ),
        Rule(
            cel="self.stages.all(s, s.name == self.stages[0].name "
            "|| self.edges.exists(e, e.to == s.name))",
            message="every stage but the first (the entry) needs an incoming edge",
            check=lambda s: all(
                i == 0 or any(e.to == st.name for e in s.edges) for i, st in enumerate(s.stages)
            ),
            field=".edges",
            reason="FieldValueRequired",
        ),
        Rule(
            cel="self.costs.size() == 0 || self.stages.all(s, s.profiles.all(p, "
            "self.costs.exists(c, c.gpuType == p.gpuType)))",
            message="costs must price every GPU type used in stage profiles",
            check=lambda s: (
                not s.costs
                or all(
                    any(c.gpu_type == p.gpu_type for c in s.costs)
                    for st in s.stages
                    for p in st.profiles
                )
            ),
            field=".costs",
            reason="FieldValueRequired",
        ),
    )

    stages: list[Stage] = Field(
        min_length=1,
        max_length=MAX_STAGES,
        description="Stages in topological order; the first is the entry that receives queries.",
    )
    # `default=[]` (pydantic copies it per instance) so the schema defaults it too: the CEL
    # rules read these lists, and an absent list is an error in CEL, not an empty one.
    edges: list[Edge] = Field(
        default=[], max_length=MAX_EDGES, description="DAG edges between stages."
    )
    slo: LatencySlo = Field(description="End-to-end latency objective for a query.")
    traffic: Traffic = Field(description="Arrival-rate source.")
    costs: list[CostEntry] = Field(
        default=[],
        max_length=16,
        description="Price per GPU type; omit to use the cluster's default cost table.",
    )
    max_cost_per_hour: float | None = Field(
        default=None, gt=0, le=10_000_000, description="Cost ceiling for the whole pipeline."
    )
    queue: DnsLabel = Field(
        default="default",
        description=(
            "LocalQueue (in this namespace) whose Queue's GPU quota the stages' pods count "
            "against; quotas apply only once a Queue exists."
        ),
    )


class PipelinePhase(StrEnum):
    """Where an InferencePipeline is in its life."""

    PENDING = "Pending"
    PLANNING = "Planning"
    SERVING = "Serving"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class StagePlan(ApiModel):
    """The planner's choice for one stage."""

    name: str = Field(max_length=63, description="Stage name.")
    gpu_type: str = Field(max_length=63, description="Chosen GPU type.")
    batch_size: int = Field(ge=1, description="Chosen maximum batch size.")
    replicas: int = Field(ge=0, description="Replica count now (the tuner's, else the plan's).")
    planned_replicas: int | None = Field(
        default=None, ge=0, description="Replica count the planner chose for the sample trace."
    )
    ready_replicas: int = Field(default=0, ge=0, description="Replicas serving now.")
    served_by: str | None = Field(
        default=None,
        max_length=63,
        description="Serving group whose replicas serve this stage (a stage that names a "
        "ModelVariant); replicas are then the group's.",
    )


class TunerMode(StrEnum):
    """What the high-frequency tuner is doing."""

    STEADY = "Steady"
    SCALING_UP = "ScalingUp"
    SCALING_DOWN = "ScalingDown"


class EnvelopePoint(ApiModel):
    """Most queries seen in any window of this length (an arrival envelope point)."""

    window_seconds: float = Field(gt=0, description="Window length.")
    max_queries: int = Field(ge=0, description="Most queries in any window of that length.")


class WindowRate(ApiModel):
    """The busiest rate over windows of one length."""

    window_seconds: float = Field(gt=0, description="Window length.")
    rate_qps: float = Field(ge=0, description="Queries per second in the busiest such window.")


class ScalingRow(ApiModel):
    """Replicas per stage (in stage order) that meet the SLO up to this rate."""

    rate_qps: float = Field(ge=0, description="Queries per second this row covers.")
    replicas: list[int] = Field(
        max_length=MAX_STAGES, description="Replicas per stage, in the order of spec.stages."
    )
    envelope: list[WindowRate] = Field(
        default_factory=list,
        max_length=16,
        description="The envelope of the sample this row was sized on: the busiest rate over "
        "windows doubling from the traffic query's up to 60 s. The row covers live traffic "
        "whose rate over each of these windows is at most this.",
    )


class TunerState(ApiModel):
    """The tuner's view: planned versus live arrival envelope."""

    mode: TunerMode = Field(
        default=TunerMode.STEADY, description="Steady, ScalingUp or ScalingDown."
    )
    last_scale_time: datetime | None = Field(default=None, description="Last replica change.")
    planned_at: datetime | None = Field(
        default=None,
        description="When the running plan was made or last re-checked; on Prometheus traffic "
        "it is made again on the live rate at a low frequency.",
    )
    planned_envelope: list[EnvelopePoint] = Field(
        default_factory=list, description="Envelope of the planning trace."
    )
    observed_envelope: list[EnvelopePoint] = Field(
        default_factory=list, description="Envelope of live traffic."
    )
    scaling_table: list[ScalingRow] = Field(
        default_factory=list,
        max_length=32,
        description="Replicas the planner found meet the SLO at multiples of the sample's rate "
        "(its GPU types and batch sizes kept); the tuner sizes stages from it.",
    )


MAX_P99_HISTORY = 60


class P99Point(ApiModel):
    """Predicted and observed P99 latency at one time."""

    time: datetime = Field(description="When the point was recorded.")
    predicted_ms: float | None = Field(default=None, ge=0, description="Predicted P99, ms.")
    observed_ms: float | None = Field(
        default=None, ge=0, description="Observed P99, ms; absent when it could not be read."
    )


class QuotaRoom(ApiModel):
    """What the pipeline's queue admitted for it on one GPU type when it was last planned."""

    gpu_type: str = Field(max_length=63, description="GPU type.")
    gpus: int = Field(default=0, ge=0, description="Whole GPUs (its own included).")
    share_milli: int = Field(default=0, ge=0, description="GPU-share units (its own included).")


class InferencePipelineStatus(ApiModel):
    """The planner's configuration, its predictions, and the tuner's state."""

    phase: PipelinePhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = Field(default=None, ge=0, description="Generation observed.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Standard conditions: Planned, Ready, SLOAtRisk, SloMet.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    stages: list[StagePlan] = Field(default_factory=list, description="Choice per stage.")
    total_gpus: float | None = Field(default=None, ge=0, description="GPUs held by all stages.")
    gpu_types: str | None = Field(
        default=None, max_length=1024, description="Summary of GPU types in use, e.g. A100x2,T4x4."
    )
    predicted_p99_ms: float | None = Field(
        default=None, description="Predicted end-to-end P99, ms."
    )
    observed_p99_ms: float | None = Field(
        default=None, description="Observed end-to-end P99 (spec.slo.observedP99Query), ms."
    )
    p99_history: list[P99Point] = Field(
        default_factory=list,
        max_length=MAX_P99_HISTORY,
        description="Predicted and observed P99 over time: a point every 30 s at most, "
        "the newest 60.",
    )
    cost_per_hour: float | None = Field(default=None, description="Predicted cost per hour.")
    tuner: TunerState | None = Field(default=None, description="Tuner state.")
    why_waiting: str | None = Field(
        default=None, max_length=4096, description="Plain-language reason it is not serving."
    )
    quota_held: str | None = Field(
        default=None,
        max_length=4096,
        description=(
            "Why its queue's quota holds back the planned replicas (a serving pipeline keeps "
            "what runs); absent when quota admits them."
        ),
    )
    quota_room: list[QuotaRoom] | None = Field(
        default=None,
        max_length=64,
        description=(
            "What its queue's quota admitted for it per GPU type when it was last planned, "
            "written while its plan is cut to fit that (condition Planned, reason "
            "WithinQueueQuota or WithinQueueQuotaAndFreeGpus) or quota holds back a "
            "pipeline that runs nothing yet. When the queue admits more, it is planned "
            "again: a waiting pipeline takes the new plan, a serving one only the plan "
            "without a cut."
        ),
    )
    quota_demand: list[QuotaDemand] | None = Field(
        default=None, max_length=64, description=QUOTA_DEMAND_DESCRIPTION
    )


class InferencePipeline(ApiModel):
    """A DAG of models served under one end-to-end latency SLO at least cost."""

    api_version: Literal["chronotope.dev/v1alpha1"] = Field(
        default="chronotope.dev/v1alpha1", description="API version."
    )
    kind: Literal["InferencePipeline"] = Field(default="InferencePipeline", description="Kind.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Object metadata.")
    spec: InferencePipelineSpec = Field(description="Desired state.")
    status: InferencePipelineStatus | None = Field(default=None, description="Observed state.")


KIND = KindInfo(
    kind="InferencePipeline",
    plural="inferencepipelines",
    short_names=("ipl", "pipeline"),
    spec_model=InferencePipelineSpec,
    status_model=InferencePipelineStatus,
    columns=(
        PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
        PrinterColumn("GPUs", ".status.totalGpus", "number", "GPUs held by all stages"),
        PrinterColumn("GPU-Types", ".status.gpuTypes", description="GPU types in use"),
        PrinterColumn("P99-ms", ".status.predictedP99Ms", "number", "Predicted P99 latency"),
        PrinterColumn("Observed-ms", ".status.observedP99Ms", "number", "Observed P99 latency"),
        PrinterColumn("SLO-ms", ".spec.slo.p99LatencyMs", "number", "P99 latency objective"),
        PrinterColumn("Cost/h", ".status.costPerHour", "number", "Predicted cost per hour"),
        PrinterColumn("Tuner", ".status.tuner.mode", description="Tuner mode", priority=1),
        PrinterColumn("Why", ".status.whyWaiting", description="Why it is not serving", priority=1),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
    ),
)
