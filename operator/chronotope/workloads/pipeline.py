"""InferencePipeline decisions (pure): sample traffic, plan, stage objects, status.

The controller hands in what it read (the pipeline, the GPU types the
cluster has, the trace or live rate, the stages' Deployments) and writes
what comes back. The plan is `planners.inferline.plan_chronotope` restricted
to the GPU types with schedulable nodes; each stage becomes a Deployment and
a Service, its pods placed by the chronotope scheduler on the planned GPU
type (a whole GPU, or a share with its compute and memory annotations).
A stage that names a ModelVariant is served by the variant's serving group
(`workloads.serving_group`): it gets no objects of its own, its upstream
stages call the group's Service, and its status row reports the group's
replicas.

Observed latency (`observe_slo`): the observed P99 query's answer becomes
`observedP99Ms`, a point of the bounded `p99History` and the `SloMet`
condition, with one event when the verdict flips.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np

from chronotope.api.v1alpha1.inferencepipeline import (
    MAX_P99_HISTORY,
    GpuProfile,
    InferencePipelineSpec,
    Stage,
)
from chronotope.planners.inferline import (
    Config,
    Infeasible,
    PlanOutcome,
    model_from_spec,
    plan_chronotope,
    plan_within,
    stage_share,
)
from chronotope.sharing.labels import GPU_PRODUCT_LABEL, QUEUE_LABEL, SCHEDULER_NAME
from chronotope.solver.model import PodRequest, Reason
from chronotope.workloads.capacity import FreeGpus
from chronotope.workloads.podreq import gpu_resources, pod_request, replica_pod
from chronotope.workloads.queue_room import QueueRoom
from chronotope.workloads.replan import parse_time
from chronotope.workloads.serving_group import object_name
from chronotope.workloads.training_status import capped_why, condition

__all__ = [
    "DEFAULT_RATE_WINDOW_S",
    "PIPELINE_LABEL",
    "QUOTA_WAIT",
    "STAGE_LABEL",
    "WITHIN_FREE",
    "WITHIN_QUOTA",
    "WITHIN_QUOTA_AND_FREE",
    "PipelinePlan",
    "SloObservation",
    "append_history",
    "failed_status",
    "fits_free",
    "grow_within",
    "observe_slo",
    "observed_ms",
    "parse_trace",
    "pipeline_status",
    "plan_from_status",
    "plan_pipeline",
    "rate_window_s",
    "sample_arrivals",
    "stage_deployment_name",
    "stage_objects",
    "with_rate_window",
    "with_replicas",
]

PIPELINE_LABEL = "chronotope.dev/pipeline"
STAGE_LABEL = "chronotope.dev/stage"
SAMPLE_SECONDS = 60.0
"""Length of the sample trace drawn for a fixed or live rate (seconds)."""
SERVER_PORT = 8080
HISTORY_STEP_S = 30.0
"""Fewest seconds between two `p99History` points (the history lives in etcd)."""
SLO_CONDITION = "SloMet"


@dataclass(frozen=True)
class PipelinePlan:
    """The planner's outcome for one pipeline, with the stage specs it was made for."""

    outcome: PlanOutcome
    stages: tuple[Stage, ...]
    cut: bool = False
    """Cut to fit the GPUs its queue's quota admits now (`plan_within`), not the plan
    the planner makes without that limit."""
    fitted: bool = False
    """Moved to fit the GPUs free in the cluster now (`plan_within`): the planner's
    choice (within its queue's quota, if cut) had too few free GPUs of its types."""

    @property
    def note(self) -> str:
        """What the plan was cut to, in words ('' for the planner's own plan)."""
        if self.cut and self.fitted:
            return (
                "; cut to fit what its queue's quota admits now, and moved to the GPUs free "
                "now (the cheapest plan within it had too few free)"
            )
        if self.cut:
            return "; cut to fit what its queue's quota admits now"
        if self.fitted:
            return "; moved to the GPUs free now (the cheapest plan's types had too few free)"
        return ""

    @property
    def reason(self) -> str:
        """The `Planned` condition's reason (`Planned` for the planner's own plan)."""
        if self.cut:
            return WITHIN_QUOTA_AND_FREE if self.fitted else WITHIN_QUOTA
        return WITHIN_FREE if self.fitted else "Planned"


def parse_trace(text: str) -> list[float] | Reason:
    """Arrival times (seconds, sorted) from one-per-line text, or why it is unusable."""
    try:
        times = sorted(float(x) for x in text.split())
    except ValueError as exc:
        return Reason(code="TraceUnparsable", message=f"trace is not one number per line: {exc}")
    if len(times) < 2 or times[-1] <= times[0]:  # noqa: PLR2004 (a rate needs two points)
        return Reason(code="TraceEmpty", message="trace has fewer than two distinct arrivals")
    return [t - times[0] for t in times]


_RANGE = re.compile(r"\[\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*\]")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DEFAULT_RATE_WINDOW_S = 60.0
"""The window assumed for a traffic query with no range selector (a recording rule, say).

Long on purpose: keyed on a long window the scaling table errs towards more replicas."""


def rate_window_s(query: str) -> float:
    """The window a traffic query's rate spans: its first range selector, like `[5s]`."""
    found = _RANGE.search(query)
    if found is None:
        return DEFAULT_RATE_WINDOW_S
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def with_rate_window(query: str, window_s: float) -> str:
    """The traffic query over `window_s` instead of its own window.

    Every range selector as long as its first one is replaced; a query with
    none stays as it is.
    """
    found = _RANGE.search(query)
    if found is None:
        return query
    first = float(found.group(1)) * _UNIT_S[found.group(2)]

    def swap(m: re.Match[str]) -> str:
        same = float(m.group(1)) * _UNIT_S[m.group(2)] == first
        return f"[{window_s:g}s]" if same else m.group(0)

    return _RANGE.sub(swap, query)


def sample_arrivals(rate_qps: float, seed: int = 0) -> list[float]:
    """A Poisson sample of `SAMPLE_SECONDS` at `rate_qps` (the planner's trace for a rate)."""
    rng = np.random.default_rng(seed)
    n = max(2, int(rate_qps * SAMPLE_SECONDS))
    gaps = np.cumsum(rng.exponential(1 / rate_qps, n))
    # stretched so the sample's mean rate is exactly the rate asked for
    return [float(x) for x in (gaps - gaps[0]) * ((n - 1) / rate_qps) / (gaps[-1] - gaps[0])]


QUOTA_WAIT = "waiting for quota: "
"""How `whyWaiting` starts for a pipeline its queue's quota holds back."""


WITHIN_QUOTA = "WithinQueueQuota"
"""The `Planned` condition's reason for a plan cut to fit its queue's quota now."""
WITHIN_FREE = "WithinFreeGpus"
"""The `Planned` condition's reason for a plan moved to the GPUs free now."""
WITHIN_QUOTA_AND_FREE = "WithinQueueQuotaAndFreeGpus"
"""The `Planned` condition's reason for a plan cut to its queue's quota and moved to the
GPUs free now."""


def _replica_resources(stage: Stage) -> tuple[dict[str, str], dict[str, str]]:
    """One replica's GPU limits and share annotations, as its Deployment asks."""
    gpu = stage.gpu
    return gpu_resources(gpu.shared if gpu is not None else None, (gpu.count if gpu else None) or 1)


def _usable(stage: Stage, gpu_types: set[str] | None, room: QueueRoom | None) -> list[GpuProfile]:
    """The stage's profiles on `gpu_types` (all if None) where its queue could hold a replica.

    A stage that a ModelVariant serving group serves is planned on any type: the
    group's pods are not the pipeline's.
    """
    usable = [p for p in stage.profiles if gpu_types is None or p.gpu_type in gpu_types]
    if room is None or stage.model.variant:
        return usable
    limits, annotations = _replica_resources(stage)
    return [p for p in usable if room.holds(p.gpu_type, limits, annotations)]


def _over(stages: Sequence[Stage], room: QueueRoom) -> Callable[[Config], float]:
    """How far a configuration of `stages` exceeds what `room` admits now (0: it fits).

    A stage a ModelVariant serving group serves takes nothing of the pipeline's quota.
    """
    demand: list[dict[str, tuple[Any, int] | None]] = []
    for stage in stages:
        if stage.model.variant:
            demand.append({})
            continue
        limits, annotations = _replica_resources(stage)
        demand.append(
            {p.gpu_type: room.pod_quota(p.gpu_type, limits, annotations) for p in stage.profiles}
        )

    def over(config: Config) -> float:
        usage: Counter[Any] = Counter()
        for per_type, c in zip(demand, config, strict=True):
            held = per_type.get(c.gpu_type)
            if held is not None:
                usage[held[0]] += c.replicas * held[1]
        return room.excess(usage)

    return over


def _over_free(stages: Sequence[Stage], free: Mapping[str, FreeGpus]) -> Callable[[Config], float]:
    """How many replicas' GPUs a configuration of `stages` asks beyond those free now (0: fits).

    `free`: per GPU type, what serving pods may take (`variants.free_serving_gpus`).
    Counted for the replicas of the stages it deploys itself. A whole-GPU replica of
    k GPUs needs them on one node, so a node's room on a type is its free GPUs less
    the remainder by the largest k asked there. GPU-share replicas are placed first,
    as the extender places them (`FreeGpus.after_shares`: its policy, under its
    co-location rules); the untouched GPUs they take are no longer there for whole
    replicas. A type's shortfall counts only up to what stages with another profiled
    type ask there: a stage profiled on one type has nowhere else to go (it takes its
    room, and its pods wait for the rest).
    """
    asks: list[int | PodRequest] = []  # per stage: k whole GPUs, or one share replica; 0 none
    for stage in stages:
        gpu = stage.gpu
        if stage.model.variant:
            asks.append(0)
        elif gpu is not None and gpu.shared is not None:
            limits, annotations = _replica_resources(stage)
            asks.append(pod_request(replica_pod(limits, annotations, name=stage.name)))
        else:
            asks.append((gpu.count if gpu is not None else None) or 1)
    movable = [len({p.gpu_type for p in stage.profiles}) > 1 for stage in stages]

    def over(config: Config) -> float:
        # per type: whole GPUs asked, of them by movable stages, the largest k; share asks
        whole: dict[str, list[int]] = {}
        shares: dict[str, list[PodRequest]] = {}
        moving: dict[str, int] = {}  # share replicas of movable stages
        for ask, moves, c in zip(asks, movable, config, strict=True):
            if not ask or not c.replicas:
                continue
            if isinstance(ask, PodRequest):
                shares.setdefault(c.gpu_type, []).extend([ask] * c.replicas)
                moving[c.gpu_type] = moving.get(c.gpu_type, 0) + c.replicas * moves
            else:
                row = whole.setdefault(c.gpu_type, [0, 0, 1])
                row[0] += c.replicas * ask
                row[1] += c.replicas * ask * moves
                row[2] = max(row[2], ask)
        out = 0.0
        for t in whole.keys() | shares.keys():
            unplaced, left = free.get(t, FreeGpus(())).after_shares(shares.get(t, ()))
            gpus, gpus_moving, k = whole.get(t, (0, 0, 1))
            short = max(0, gpus - sum(f - f % k for f in left))
            out += min(short, gpus_moving) + min(unplaced, moving.get(t, 0))
        return out

    return over


def fits_free(plan: PipelinePlan, free: Mapping[str, FreeGpus]) -> bool:
    """Whether `plan`'s replicas fit the GPUs `free` (per type) now."""
    return _over_free(plan.stages, free)(plan.outcome.config) <= 0


def plan_pipeline(
    spec: InferencePipelineSpec,
    arrivals: Sequence[float],
    gpu_types: set[str],
    room: QueueRoom | None = None,
    free: Mapping[str, FreeGpus] | None = None,
) -> PipelinePlan | Reason:
    """Plan on the GPU types the cluster has, or say why the pipeline cannot be planned.

    `room`: what the pipeline's queue could ever hold (`training_quota.serving_room`);
    the stages it deploys itself go only on types where a replica could be admitted
    (a stage a ModelVariant serving group serves is that group's). Where `room` also
    knows what the queue admits now and the plan takes more, the plan is cut to fit
    it (`plan_within`: other GPU types, batches and replica counts that still meet
    the SLO; `cut`); if no such plan exists, the plan is the uncut one and admission
    holds it back as before.

    `free` (`variants.free_serving_gpus`): the free GPUs of each type. A
    plan that asks more than that is moved, the same way, to a plan that fits them
    (`fitted`), so its pods do not wait for GPUs other work holds while others idle.
    With `room` too, the plan must fit both (as Kueue's default flavour fungibility
    tries the next flavour before preempting); if none meets the SLO, the plan is
    the one within `room` alone (its queue may reclaim lent GPUs for it), else the
    planner's own, and its pods wait for its GPUs to free up.
    """
    stages = []
    for stage in spec.stages:
        offered = ", ".join(p.gpu_type for p in stage.profiles)
        if not [p for p in stage.profiles if p.gpu_type in gpu_types]:
            known = ", ".join(sorted(gpu_types)) or "none"
            return Reason(
                code="NoProfiledGpuType",
                message=f"stage {stage.name} has profiles for {offered}, but the cluster's "
                f"schedulable GPU types are {known}",
                unresolvable=True,
            )
        usable = _usable(stage, gpu_types, room)
        if not usable:
            assert room is not None
            return Reason(
                code="QuotaExceeded",
                message=f"{QUOTA_WAIT}queue {room.queue}: stage {stage.name} has "
                f"profiles for {offered}, and the queue's quota (nominal, and what it may "
                "borrow in its cohort) holds no replica of it on any of them",
            )
        stages.append(stage.model_copy(update={"profiles": usable}))
    spec = spec.model_copy(update={"stages": stages})
    model = model_from_spec(spec, {})
    out = plan_chronotope(model, arrivals)
    if isinstance(out, Infeasible):
        return Reason(code="SLOInfeasible", message=out.reason, unresolvable=True)
    over_quota = _over(stages, room) if room is not None else None
    over_free = _over_free(stages, free) if free is not None else None
    plan = PipelinePlan(out, tuple(stages))
    exceeds = over_quota is not None and over_quota(out.config) > 0
    if exceeds:
        assert over_quota is not None
        cut = plan_within(model, arrivals, over_quota, first=out)
        if isinstance(cut, PlanOutcome):
            plan = PipelinePlan(cut, tuple(stages), cut=True)
    if over_free is None or over_free(plan.outcome.config) <= 0:
        return plan
    limits = [f for f in (over_quota, over_free) if f is not None]
    both = plan_within(model, arrivals, lambda c: sum(f(c) for f in limits), first=out)
    if isinstance(both, PlanOutcome):
        return PipelinePlan(both, tuple(stages), cut=exceeds, fitted=True)
    return plan


def _owner(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": "chronotope.dev/v1alpha1",
        "kind": "InferencePipeline",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def stage_deployment_name(pipeline: str, stage: str, groups: Mapping[str, str]) -> str:
    """The Deployment (and Service) that serves a stage: its own, or its serving group's."""
    group = groups.get(stage)
    return object_name(group) if group else f"{pipeline}-{stage}"


def stage_objects(
    pipeline: Mapping[str, Any],
    spec: InferencePipelineSpec,
    plan: PipelinePlan,
    groups: Mapping[str, str] | None = None,
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(Deployment, Service) per stage, as planned; none for stages in `groups`.

    `groups` maps a stage that names a ModelVariant to the variant's serving group.
    """
    groups = groups or {}
    name = pipeline["metadata"]["name"]
    namespace = pipeline["metadata"]["namespace"]
    children: dict[str, list[str]] = {s.name: [] for s in spec.stages}
    for e in spec.edges:
        host = stage_deployment_name(name, e.to, groups)
        children[e.from_].append(f"http://{host}.{namespace}.svc:{SERVER_PORT}")
    out = []
    for stage, c in zip(plan.stages, plan.outcome.config, strict=True):
        if stage.model.variant:  # served by its variant's serving group
            continue
        labels = {PIPELINE_LABEL: name, STAGE_LABEL: stage.name}
        limits, annotations = _replica_resources(stage)
        image = str(stage.model.image)
        env = [
            {"name": "CHRONOTOPE_STAGE", "value": stage.name},
            {"name": "CHRONOTOPE_MAX_BATCH", "value": str(c.batch)},
            {"name": "CHRONOTOPE_GPU_TYPE", "value": c.gpu_type},
            {"name": "CHRONOTOPE_DOWNSTREAM", "value": ",".join(children[stage.name])},
        ]
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": f"{name}-{stage.name}",
                "namespace": namespace,
                "labels": labels,
                "ownerReferences": [_owner(pipeline)],
            },
            "spec": {
                "replicas": c.replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {
                        "labels": {**labels, QUEUE_LABEL: spec.queue},
                        "annotations": annotations,
                    },
                    "spec": {
                        "schedulerName": SCHEDULER_NAME,
                        "nodeSelector": {GPU_PRODUCT_LABEL: c.gpu_type},
                        "containers": [
                            {
                                "name": "server",
                                "image": image,
                                "env": env,
                                "ports": [{"containerPort": SERVER_PORT}],
                                "resources": {"limits": limits},
                            }
                        ],
                    },
                },
            },
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": f"{name}-{stage.name}",
                "namespace": namespace,
                "labels": labels,
                "ownerReferences": [_owner(pipeline)],
            },
            "spec": {"selector": labels, "ports": [{"port": SERVER_PORT}]},
        }
        out.append((deployment, service))
    return out


def _ready(deployments: Mapping[str, Mapping[str, Any]], name: str) -> int:
    d = deployments.get(name) or {}
    return int((d.get("status") or {}).get("readyReplicas") or 0)


def pipeline_status(
    pipeline: Mapping[str, Any],
    plan: PipelinePlan,
    deployments: Mapping[str, Mapping[str, Any]],
    now: datetime,
    planned: Sequence[int] | None = None,
    *,
    groups: Mapping[str, str] | None = None,
    unplaced: str | None = None,
) -> dict[str, Any]:
    """Status of a planned pipeline: plan per stage, readiness, predicted P99 and cost.

    A stage in `groups` reports its serving group's Deployment (in
    `deployments` by its name): the group's replicas, its GPUs not counted
    as the pipeline's. `unplaced`: kube-scheduler's reason for a pod of the
    pipeline it has not placed, added to why replicas are short.
    """
    groups = groups or {}
    meta = pipeline["metadata"]
    generation = meta.get("generation")
    stages = []
    total = 0.0
    by_type: dict[str, float] = {}
    short = []
    base = list(planned) if planned is not None else [c.replicas for c in plan.outcome.config]
    for stage, c, k_plan in zip(plan.stages, plan.outcome.config, base, strict=True):
        served_by = groups.get(stage.name)
        name = stage_deployment_name(meta["name"], stage.name, groups)
        ready = _ready(deployments, name)
        row = {
            "name": stage.name,
            "gpuType": c.gpu_type,
            "batchSize": c.batch,
            "replicas": c.replicas,
            "plannedReplicas": k_plan,
            "readyReplicas": ready,
        }
        if served_by:
            group_spec = (deployments.get(name) or {}).get("spec") or {}
            row |= {"servedBy": served_by, "replicas": int(group_spec.get("replicas") or 0)}
            if ready < 1:
                short.append(f"{stage.name}: serving group {served_by} has no ready replica")
            stages.append(row)
            continue
        stages.append(row)
        share = stage_share(stage)
        total += c.replicas * share
        by_type[c.gpu_type] = by_type.get(c.gpu_type, 0.0) + c.replicas * share
        if ready < c.replicas:
            short.append(f"{stage.name} {ready}/{c.replicas} on {c.gpu_type}")
    serving = not short
    why = None if serving else "waiting for replicas: " + "; ".join(short)
    if why is not None and unplaced:
        why = capped_why(f"{why} (kube-scheduler: {unplaced})")
    return {
        "phase": "Serving" if serving else "Planning",
        "observedGeneration": generation,
        "stages": stages,
        "totalGpus": round(total, 3),
        "gpuTypes": ",".join(f"{t}x{g:g}" for t, g in sorted(by_type.items())),
        "predictedP99Ms": round(plan.outcome.p99_s * 1000, 1),
        "costPerHour": round(plan.outcome.cost_per_hour, 3),
        "whyWaiting": why,
        "conditions": [
            condition(
                "Planned",
                True,
                plan.reason,
                f"{len(stages)} stage(s), predicted P99 {plan.outcome.p99_s * 1000:.0f} ms, "
                f"{plan.outcome.cost_per_hour:.2f}/h{plan.note}",
                now=now,
                generation=generation,
            ),
            condition(
                "Ready",
                serving,
                "AllStagesReady" if serving else "StagesStarting",
                why or "every stage has its planned replicas ready",
                now=now,
                generation=generation,
            ),
        ],
    }


def failed_status(pipeline: Mapping[str, Any], why: Reason, now: datetime) -> dict[str, Any]:
    """Status of a pipeline that cannot be planned (nothing is created for it)."""
    generation = pipeline["metadata"].get("generation")
    quota = why.message.removeprefix(QUOTA_WAIT) if why.code == "QuotaExceeded" else None
    return {
        "phase": "Failed" if why.unresolvable else "Pending",
        "observedGeneration": generation,
        "whyWaiting": why.message,
        "quotaHeld": quota,
        "quotaDemand": None,  # not planned: it asks nothing it could be admitted on
        "conditions": [
            condition("Planned", False, why.code, why.message, now=now, generation=generation),
        ],
    }


def grow_within(
    have: Sequence[int], want: Sequence[int], fits: Callable[[Sequence[int]], bool]
) -> list[int] | None:
    """Replicas per stage between what runs (`have`) and the target (`want`) that `fits` admits.

    A quota that does not admit the whole target may still admit part of the
    growth: stages that shrink shrink at once, then one replica at a time goes to
    the growing stage furthest below its target (smallest have / want first), as
    long as `fits` (the queue's admission) says yes; a stage whose next replica does
    not fit grows no further. None: not even the shrunk stages fit (what runs
    stays as it is).
    """
    now = [min(h, w) for h, w in zip(have, want, strict=True)]
    if not fits(now):
        return None
    open_ = {i for i, (k, w) in enumerate(zip(now, want, strict=True)) if k < w}
    while open_:
        i = min(open_, key=lambda j: (now[j] / want[j], j))
        trial = [*now[:i], now[i] + 1, *now[i + 1 :]]
        if fits(trial):
            now = trial
            if now[i] >= want[i]:
                open_.discard(i)
        else:
            open_.discard(i)
    return now


def with_replicas(plan: PipelinePlan, replicas: Sequence[int]) -> PipelinePlan:
    """The plan with stage replica counts replaced (the tuner's change)."""
    config = tuple(
        replace(c, replicas=k) for c, k in zip(plan.outcome.config, replicas, strict=True)
    )
    return replace(plan, outcome=replace(plan.outcome, config=config))


def plan_from_status(
    spec: InferencePipelineSpec,
    status: Mapping[str, Any],
    gpu_types: set[str] | None,
    room: QueueRoom | None = None,
) -> PipelinePlan | None:
    """The plan recorded in `status`, if it still fits the spec, the cluster and the quota.

    With `gpu_types` None the recorded plan is returned whatever is schedulable now
    (and whatever `room`, the queue's, could hold).
    """
    from chronotope.planners.inferline import StageConfig

    rows = {s.get("name"): s for s in status.get("stages") or []}
    configs, stages = [], []
    for stage in spec.stages:
        row = rows.get(stage.name)
        if row is None:
            return None
        usable = _usable(stage, gpu_types, room if gpu_types is not None else None)
        if gpu_types is not None and row.get("gpuType") not in {p.gpu_type for p in usable}:
            return None
        stages.append(stage.model_copy(update={"profiles": usable}))
        planned = row.get("plannedReplicas")
        replicas = int(planned) if planned is not None else int(row["replicas"])
        configs.append(StageConfig(str(row["gpuType"]), int(row["batchSize"]), replicas))
    outcome = PlanOutcome(
        tuple(configs),
        float(status.get("predictedP99Ms") or 0.0) / 1000,
        float(status.get("costPerHour") or 0.0),
        0,
    )
    reasons = {
        c.get("reason") for c in status.get("conditions") or [] if c.get("type") == "Planned"
    }
    both = WITHIN_QUOTA_AND_FREE in reasons
    return PipelinePlan(
        outcome,
        tuple(stages),
        cut=both or WITHIN_QUOTA in reasons,
        fitted=both or WITHIN_FREE in reasons,
    )


@dataclass(frozen=True)
class SloObservation:
    """What one pass learned about observed latency.

    `fields` are the status fields (`observedP99Ms`, `p99History`; None
    removes one), `condition` is `SloMet`, `events` the (type, reason,
    message) to post: one only when the verdict flips.
    """

    fields: dict[str, Any]
    condition: dict[str, Any]
    events: list[tuple[str, str, str]] = field(default_factory=list)


def observed_ms(answer: float | str) -> float | str:
    """The observed P99 in ms from a query's answer in seconds, or why it is no latency."""
    if isinstance(answer, str):
        return answer
    if not math.isfinite(answer) or answer < 0:
        # histogram_quantile gives NaN when the window saw no requests
        return f"the observed P99 query returned {answer:g}, not a latency (no requests?)"
    return round(answer * 1000, 1)


def append_history(
    history: Sequence[Mapping[str, Any]],
    now: datetime,
    predicted_ms: float | None,
    observed: float | None,
) -> list[dict[str, Any]]:
    """`history` with this pass's reading: a new point at most once per `HISTORY_STEP_S`.

    A point has `time` (RFC 3339, when its slot began), `predictedMs` and,
    once read, `observedMs`. While the newest point is younger than the step
    (or in the future), the reading updates it in place, so it always holds
    the latest reading (a failed read keeps the slot's last good one);
    otherwise a point is appended and the oldest beyond `MAX_P99_HISTORY`
    are dropped.
    """
    out = [dict(p) for p in history]
    if out:
        try:
            last = parse_time(out[-1].get("time"))
        except ValueError:  # a hand-edited point: start a fresh slot now
            last = None
        if last is not None and (now - last).total_seconds() < HISTORY_STEP_S:
            if predicted_ms is not None:
                out[-1]["predictedMs"] = predicted_ms
            if observed is not None:
                out[-1]["observedMs"] = observed
            return out[-MAX_P99_HISTORY:]
    point: dict[str, Any] = {"time": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if predicted_ms is not None:
        point["predictedMs"] = predicted_ms
    if observed is not None:
        point["observedMs"] = observed
    out.append(point)
    return out[-MAX_P99_HISTORY:]


def _last_verdict(old: Mapping[str, Any], slo_ms: float) -> bool | None:
    """Whether the last known observation met the SLO; None if there was none.

    The `SloMet` condition says it while it is True or False; while it is
    Unknown (a failed query) the newest history point with an observation
    does (it holds the last good reading), so a query that fails for a while
    does not repeat the event.
    """
    for c in old.get("conditions") or []:
        if c.get("type") == SLO_CONDITION and c.get("status") in ("True", "False"):
            return bool(c["status"] == "True")
    for point in reversed(old.get("p99History") or []):
        if point.get("observedMs") is not None:
            return float(point["observedMs"]) <= slo_ms
    return None


def observe_slo(
    old: Mapping[str, Any],
    slo_ms: float,
    answer: float | str | None,
    *,
    predicted_ms: float | None,
    now: datetime,
    generation: int | None,
) -> SloObservation:
    """Observed P99 against the SLO (pure): status fields, `SloMet` and the events to post.

    `old` is the status before this pass; `answer` the observed P99 query's
    value in seconds, why it could not be read, or None when the spec has no
    query (then the history and the observed value are removed).
    """
    if answer is None:
        return SloObservation(
            {"observedP99Ms": None, "p99History": None},
            condition(
                SLO_CONDITION,
                False,
                "NoObservation",
                "spec.slo.observedP99Query is not set: observed latency is not measured",
                now=now,
                generation=generation,
            )
            | {"status": "Unknown"},
        )
    value = observed_ms(answer)
    got = value if isinstance(value, float) else None
    history = append_history(old.get("p99History") or [], now, predicted_ms, got)
    fields: dict[str, Any] = {"observedP99Ms": got, "p99History": history}
    if isinstance(value, str):
        why = f"observed P99 unknown: {value}"
        unknown = condition(
            SLO_CONDITION, False, "NoObservation", why, now=now, generation=generation
        )
        return SloObservation(fields, unknown | {"status": "Unknown"})
    met = value <= slo_ms
    predicted = f" (predicted {predicted_ms:g} ms)" if predicted_ms is not None else ""
    words = "within" if met else "over"
    message = f"observed P99 {value:g} ms is {words} the SLO of {slo_ms:g} ms{predicted}"
    reason = "ObservedWithinSlo" if met else "ObservedOverSlo"
    cond = condition(SLO_CONDITION, met, reason, message, now=now, generation=generation)
    before = _last_verdict(old, slo_ms)
    events: list[tuple[str, str, str]] = []
    if not met and before is not False:
        events.append(("Warning", "SloViolated", message))
    elif met and before is False:
        events.append(("Normal", "SloRecovered", message))
    return SloObservation(fields, cond, events)
