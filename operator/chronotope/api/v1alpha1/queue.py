"""Queue: a team's GPU quota, per GPU type, shared within a cohort (Kueue's ClusterQueue).

A Queue is cluster-scoped: the platform team gives each team one. It holds a
nominal quota per GPU type (whole GPUs, and GPU shares in thousandths of a
GPU), an optional cohort whose members lend each other their unused nominal
quota (up to a per-type borrowing limit), a fair-share weight that orders
borrowers (dominant-resource share divided by weight, lowest first), and a
reclaim policy: whether the queue may preempt borrowed work, after a
checkpoint grace period, when it needs its own quota back, and whether a
workload may preempt its own queue's lower-priority preemptible work when the
queue's quota is full (Kueue's `withinClusterQueue`), and a stop policy that
holds the queue (admits nothing new) or drains it (also checkpoints and stops
what it admitted; Kueue's `stopPolicy`). Namespaces reach a
Queue through a LocalQueue (`localqueue`). The accounting is
`chronotope.workloads.quota`; docs/queues.md describes the rules.

Pure: no Kubernetes client imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field

from chronotope.api.v1alpha1._base import ApiModel, KindInfo, PrinterColumn, Rule
from chronotope.api.v1alpha1.common import Condition, DnsLabel, GpuTypeName, ObjectMeta

__all__ = [
    "DEFAULT_RECLAIM_GRACE_SECONDS",
    "KIND",
    "MILLI_PER_GPU",
    "FairSharePolicy",
    "FlavorFungibility",
    "GpuQuota",
    "GpuTypeUsage",
    "LabelSelector",
    "Queue",
    "QueueReclaim",
    "QueueSpec",
    "QueueStatus",
    "QueuedWorkload",
    "QueueingStrategy",
    "ReclaimPolicy",
    "SelectorOperator",
    "SelectorRequirement",
    "StopPolicy",
    "WhenCanBorrow",
    "WhenCanPreempt",
    "WithinQueuePolicy",
]

MILLI_PER_GPU = 1000
"""GPU-share units per GPU: a share of computePercent P counts 10 x P."""

DEFAULT_RECLAIM_GRACE_SECONDS = 30
"""The SIGTERM grace period the operator gives workers it stops after asking them to
checkpoint (`kube.workloads.delete_pods`); a TrainingJob has no grace field of its own."""

MAX_QUOTA_GPUS = 1_000_000  # a sanity bound far above any cluster


def _types_unique(quotas: list[GpuQuota]) -> bool:
    names = [q.gpu_type for q in quotas]
    return len(names) == len(set(names))


class GpuQuota(ApiModel):
    """The queue's nominal quota of one GPU type, how much more it may borrow, how much it lends."""

    rules = (
        Rule(
            cel="!has(self.lendingLimit) || self.lendingLimit <= self.gpus",
            message="lendingLimit must not exceed gpus (a queue lends only its nominal quota)",
            check=lambda q: q.lending_limit is None or q.lending_limit <= q.gpus,
            field=".lendingLimit",
        ),
    )

    gpu_type: GpuTypeName = Field(
        description="GPU product name as nodes label it (nvidia.com/gpu.product), as in a "
        "TrainingJob's gpuTypes, e.g. A100-SXM4-80GB."
    )
    gpus: int = Field(
        ge=0,
        le=MAX_QUOTA_GPUS,
        description="Nominal quota of whole GPUs of this type; the queue's own, lent to the "
        "cohort while unused.",
    )
    share_milli: int = Field(
        default=0,
        ge=0,
        le=MAX_QUOTA_GPUS * MILLI_PER_GPU,
        description="Nominal quota of GPU shares of this type, in thousandths of a GPU (a share "
        "with computePercent P uses 10 x P); counted apart from whole GPUs.",
    )
    borrowing_limit: int | None = Field(
        default=None,
        ge=0,
        le=MAX_QUOTA_GPUS,
        description="Most whole GPUs of this type the queue may borrow from its cohort above "
        "its nominal quota (and 1000 x this many share units); omit for no limit. Needs a "
        "cohort.",
    )
    lending_limit: int | None = Field(
        default=None,
        ge=0,
        le=MAX_QUOTA_GPUS,
        description="Most whole GPUs of this type's nominal quota the queue lends to its "
        "cohort while it does not use them (and 1000 x this many share units, at most its "
        "shareMilli); the rest of its nominal quota is its own alone, never borrowed, so "
        "never reclaimed. Omit to lend all of it. Needs a cohort (Kueue's lendingLimit).",
    )


class ReclaimPolicy(StrEnum):
    """What the queue does when its nominal quota is lent out and its own work waits."""

    NEVER = "Never"
    PREEMPT_BORROWED = "PreemptBorrowed"


class FairSharePolicy(StrEnum):
    """What a workload does when it would borrow and the cohort lends nothing more."""

    NEVER = "Never"
    PREEMPT = "Preempt"


class WithinQueuePolicy(StrEnum):
    """What a workload does when its own queue's quota is held by its own queue's work."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"


class SelectorOperator(StrEnum):
    """A label selector requirement's operator (Kubernetes' `LabelSelectorRequirement`)."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class SelectorRequirement(ApiModel):
    """One requirement on a label: its key, an operator and, for In and NotIn, values."""

    rules = (
        Rule(
            cel="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
            message="values must be non-empty for In and NotIn, and empty for Exists and "
            "DoesNotExist",
            check=lambda r: (
                (r.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)) == bool(r.values)
            ),
            field=".values",
        ),
    )

    key: str = Field(min_length=1, max_length=317, description="The label key.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] = Field(
        default=[], max_length=64, description="Values for In and NotIn; empty otherwise."
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` meet this requirement."""
        has = self.key in labels
        match self.operator:
            case SelectorOperator.IN:
                return has and labels[self.key] in self.values
            case SelectorOperator.NOT_IN:
                return not has or labels[self.key] not in self.values
            case SelectorOperator.EXISTS:
                return has
            case SelectorOperator.DOES_NOT_EXIST:
                return not has


class LabelSelector(ApiModel):
    """A Kubernetes label selector; an empty one selects everything."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels that must all be present with these values."
    )
    match_expressions: list[SelectorRequirement] = Field(
        default=[], max_length=32, description="Requirements that must all be met."
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` meet every label and every requirement."""
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


class QueueingStrategy(StrEnum):
    """In what order the queue admits its workloads (Kueue's ClusterQueue `queueingStrategy`)."""

    BEST_EFFORT_FIFO = "BestEffortFIFO"
    STRICT_FIFO = "StrictFIFO"


class StopPolicy(StrEnum):
    """Whether the queue admits work (Kueue's ClusterQueue `stopPolicy`)."""

    NONE = "None"
    HOLD = "Hold"
    HOLD_AND_DRAIN = "HoldAndDrain"


class WhenCanBorrow(StrEnum):
    """What a workload does when its first GPU type fits only by borrowing (Kueue's name)."""

    BORROW = "Borrow"
    TRY_NEXT_FLAVOR = "TryNextFlavor"


class WhenCanPreempt(StrEnum):
    """What a workload does when its first GPU type fits only by preempting (Kueue's name)."""

    PREEMPT = "Preempt"
    TRY_NEXT_FLAVOR = "TryNextFlavor"


class FlavorFungibility(ApiModel):
    """How admission picks among a workload's GPU types (Kueue's `flavorFungibility`)."""

    when_can_borrow: WhenCanBorrow = Field(
        default=WhenCanBorrow.BORROW,
        description="Borrow: the first of the workload's GPU types (its decision's, then its "
        "own order) that fits within nominal quota or by borrowing is taken, so a job borrows "
        "idle quota of the type it prefers rather than run on a slower type of its own quota. "
        "TryNextFlavor: a type within nominal quota is taken before any type that needs "
        "borrowing. A type that needs reclaiming is tried last unless whenCanPreempt is "
        "Preempt.",
    )
    when_can_preempt: WhenCanPreempt = Field(
        default=WhenCanPreempt.TRY_NEXT_FLAVOR,
        description="Preempt: a GPU type that fits only by preempting (reclaiming what other "
        "queues of the cohort borrowed under reclaim policy PreemptBorrowed, or stopping the "
        "queue's own lower-priority work under withinQueue LowerPriority) is taken before the "
        "workload's later types, if enough work can be stopped; otherwise the later types are "
        "tried. TryNextFlavor (Kueue's default): it is taken only if no type fits without "
        "preempting.",
    )


class QueueReclaim(ApiModel):
    """How the queue takes back nominal quota that other queues of its cohort borrowed."""

    policy: ReclaimPolicy = Field(
        default=ReclaimPolicy.NEVER,
        description="Never: wait until the borrowers finish. PreemptBorrowed: checkpoint and "
        "stop borrowed work (the queues that borrowed most for their weight first, their "
        "lowest-priority and newest workload first, only as many as needed).",
    )
    grace_period_seconds: int = Field(
        default=DEFAULT_RECLAIM_GRACE_SECONDS,
        ge=0,
        le=86_400,
        description="Seconds a preempted worker gets to checkpoint and exit after SIGTERM; "
        "the same default as any checkpointed stop of a TrainingJob.",
    )
    within_queue: WithinQueuePolicy = Field(
        default=WithinQueuePolicy.NEVER,
        description="Never: a workload waits while its queue's own work holds the quota. "
        "LowerPriority: a workload that neither fits nor may borrow checkpoints and stops "
        "preemptible workloads of the same queue with a lower priority (lowest priority "
        "first, newest first, only as many as needed), with the grace period above.",
    )
    fair_share: FairSharePolicy = Field(
        default=FairSharePolicy.NEVER,
        description="Never: a workload that would borrow waits while other queues of the "
        "cohort hold what it lends. Preempt: it checkpoints and stops borrowed work of queues "
        "above their fair share (Kueue's fair-sharing preemption): a workload of another "
        "queue is stopped only if this queue's weighted dominant borrowed share, with the new "
        "workload, is at most that queue's without the stopped one (or, when that frees too "
        "little, below that queue's before); the highest share first, its lowest-priority "
        "and newest workload first, only as many as needed, with the grace period above.",
    )


class QueueSpec(ApiModel):
    """The queue's GPU quotas, cohort, fair-share weight and reclaim policy."""

    rules = (
        Rule(
            cel="self.quotas.all(a, self.quotas.exists_one(b, b.gpuType == a.gpuType))",
            message="quotas must list each gpuType once",
            check=lambda s: _types_unique(s.quotas),
            field=".quotas",
        ),
        Rule(
            cel="has(self.cohort) || self.quotas.all(q, !has(q.borrowingLimit))",
            message="borrowingLimit needs a cohort to borrow from",
            check=lambda s: (
                s.cohort is not None or all(q.borrowing_limit is None for q in s.quotas)
            ),
            field=".quotas",
            reason="FieldValueForbidden",
        ),
        Rule(
            cel="has(self.cohort) || self.quotas.all(q, !has(q.lendingLimit))",
            message="lendingLimit needs a cohort to lend to",
            check=lambda s: s.cohort is not None or all(q.lending_limit is None for q in s.quotas),
            field=".quotas",
            reason="FieldValueForbidden",
        ),
    )

    quotas: list[GpuQuota] = Field(
        min_length=1,
        max_length=32,
        description="Nominal quota per GPU type. Work may use only the types listed here "
        "(list a type with gpus: 0 to borrow it only).",
    )
    cohort: DnsLabel | None = Field(
        default=None,
        description="Queues with the same cohort lend each other their unused nominal quota; "
        "omit to neither borrow nor lend.",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Fair-share weight: when several queues of a cohort want to borrow, the "
        "one with the lowest dominant borrowed share divided by weight goes first.",
    )
    reclaim: QueueReclaim = Field(
        default_factory=QueueReclaim,
        description="Whether the queue preempts borrowed work to get its quota back, its "
        "own lower-priority work for higher-priority work, and borrowed work above its fair "
        "share to borrow.",
    )
    namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Which namespaces' workloads the queue admits (their LocalQueues may name "
        "it): those whose labels the selector matches; omit to admit every namespace. A "
        "workload of another namespace waits with reason NamespaceNotAllowed (Kueue's "
        "namespaceSelector, except that there an omitted selector admits none).",
    )
    queueing_strategy: QueueingStrategy = Field(
        default=QueueingStrategy.BEST_EFFORT_FIFO,
        description="BestEffortFIFO: workloads are admitted in queue order (priority, "
        "deadline, age), and one that does not fit the quota does not hold back later ones. "
        "StrictFIFO: the first of the queue's waiting workloads that does not fit holds back "
        "every later one of the queue, so a large job is not starved by smaller ones "
        "behind it (quota only: the GPUs themselves are still backfilled).",
    )
    flavor_fungibility: FlavorFungibility = Field(
        default_factory=FlavorFungibility,
        description="Whether a workload borrows its preferred GPU type or takes another type "
        "within nominal quota first.",
    )
    stop_policy: StopPolicy = Field(
        default=StopPolicy.NONE,
        description="None: the queue admits work. Hold: it admits nothing new (its waiting "
        "workloads wait with reason QueueStopped); what it admitted keeps running. "
        "HoldAndDrain: as Hold, and its running TrainingJobs are checkpointed and stopped "
        "(with the reclaim grace period) and wait too; serving workloads keep what runs. "
        "Its unused nominal quota is still lent to the cohort.",
    )


class GpuTypeUsage(ApiModel):
    """What the queue's admitted work holds of one GPU type, and what it borrows and lends."""

    gpu_type: str = Field(max_length=63, description="GPU type.")
    used: int = Field(default=0, ge=0, description="Whole GPUs held by admitted work.")
    borrowed: int = Field(
        default=0, ge=0, description="Whole GPUs used above the nominal quota (from the cohort)."
    )
    lent: int = Field(
        default=0, ge=0, description="Unused nominal whole GPUs that other queues now use."
    )
    used_share_milli: int = Field(default=0, ge=0, description="GPU-share units held.")
    borrowed_share_milli: int = Field(default=0, ge=0, description="GPU-share units borrowed.")
    lent_share_milli: int = Field(default=0, ge=0, description="GPU-share units lent.")


class QuotaRelease(ApiModel):
    """A started workload's predicted end: the quota it gives back to its queue, and when."""

    at: datetime = Field(description="The workload's predicted completion time.")
    workload: str = Field(max_length=317, description="The workload, as namespace/name.")
    gpu_type: str = Field(max_length=63, description="GPU type it holds.")
    gpus: int = Field(default=0, ge=0, description="Whole GPUs it gives back.")
    share_milli: int = Field(default=0, ge=0, description="GPU-share units it gives back.")


class QueuedWorkload(ApiModel):
    """A pending workload's place in its queue (Kueue's pending-workloads visibility)."""

    workload: str = Field(
        max_length=317,
        description=(
            "The workload: a TrainingJob as namespace/name; a serving workload that waits for "
            "quota as namespace/pipeline:NAME or namespace/serving-group:NAME."
        ),
    )
    local_queue: str = Field(max_length=63, description="The LocalQueue it was submitted to.")
    priority: int = Field(default=0, description="Its priority.")
    position: int = Field(
        ge=1,
        description=(
            "1 for the first of the Queue's pending workloads, in admission order (a serving "
            "workload by its age among the TrainingJobs; one whose status does not say what "
            "it asks after them)."
        ),
    )
    local_queue_position: int = Field(
        ge=1, description="Its position among its LocalQueue's pending workloads."
    )
    reason: str | None = Field(
        default=None,
        max_length=128,
        description="Why it waits, as its Schedulable condition's reason (e.g. QuotaExceeded).",
    )
    predicted_start_time: datetime | None = Field(
        default=None,
        description=(
            "When the plan-ahead expects it to start (its predictedStartTime: its turn on the "
            "quota, or the GPUs it waits for); unset when not forecast."
        ),
    )


class QueueStatus(ApiModel):
    """The queue's usage per GPU type and its workloads."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation this status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Standard conditions: Active.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    gpus: list[GpuTypeUsage] = Field(
        default_factory=list,
        max_length=32,
        description="Usage, borrowed and lent GPUs per GPU type.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["gpuType"],
        },
    )
    admitted_workloads: int = Field(default=0, ge=0, description="Workloads admitted now.")
    pending_workloads: int = Field(default=0, ge=0, description="Workloads waiting for quota.")
    forecast: list[QuotaRelease] = Field(
        default_factory=list,
        max_length=10,
        description=(
            "The queue's future usage (plan-ahead): the soonest predicted ends of its started "
            "workloads and the quota each gives back; usage at a time is the current usage "
            "less the releases before it."
        ),
    )
    pending_head: list[QueuedWorkload] = Field(
        default_factory=list,
        max_length=10,
        description=(
            "The first pending workloads in the order each admission cycle considers them "
            "(priority, then deadline, then age); `kubectl chronotope queue NAME` lists all."
        ),
    )


class Queue(ApiModel):
    """A cluster-wide GPU quota per GPU type, lent and borrowed within a cohort."""

    api_version: Literal["chronotope.dev/v1alpha1"] = Field(
        default="chronotope.dev/v1alpha1", description="API version."
    )
    kind: Literal["Queue"] = Field(default="Queue", description="Kind.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Object metadata.")
    spec: QueueSpec = Field(description="Desired state.")
    status: QueueStatus | None = Field(default=None, description="Observed state.")


KIND = KindInfo(
    kind="Queue",
    plural="queues",
    short_names=("q",),
    spec_model=QueueSpec,
    status_model=QueueStatus,
    columns=(
        PrinterColumn("Cohort", ".spec.cohort", description="Cohort it borrows from and lends to"),
        PrinterColumn("Weight", ".spec.weight", "number", "Fair-share weight"),
        PrinterColumn("Admitted", ".status.admittedWorkloads", "integer", "Workloads admitted"),
        PrinterColumn("Pending", ".status.pendingWorkloads", "integer", "Workloads waiting"),
        PrinterColumn("Stop", ".spec.stopPolicy", description="Stop policy (Hold, HoldAndDrain)"),
        PrinterColumn("Reclaim", ".spec.reclaim.policy", description="Reclaim policy", priority=1),
        PrinterColumn(
            "Strategy", ".spec.queueingStrategy", description="Queueing strategy", priority=1
        ),
        PrinterColumn(
            "WithinQueue",
            ".spec.reclaim.withinQueue",
            description="Preemption within the queue",
            priority=1,
        ),
        PrinterColumn(
            "FairShare",
            ".spec.reclaim.fairShare",
            description="Preemption for fair share in the cohort",
            priority=1,
        ),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
    ),
    namespaced=False,
)
