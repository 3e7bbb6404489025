"""TrainingJob reconciliation: decide (pure), then enact (API), then report (status, events).

One function, `reconcile`, is the whole loop for one job, in the KAI-Scheduler
`runOnce` spirit: read the job and the cluster, keep a running gang as it is,
restart it (from its checkpoint) when the user scaled it or it lost workers,
and otherwise enact what the scheduling pass (`workloads.training_pass`: every
waiting job decided at once, in policy order, on a shrinking capacity) says
for it: start its gang, or say why it waits (reclaiming quota, or the
preemption step, first). It returns the status to show and the events to
post; the kopf handler applies them. Because status is recomputed from the
cluster each time, an operator restart mid-resize converges on the same state.

`ClusterOps` is the seam to the API server (`kube.trainingjob_ops` implements
it); everything else here is the order of the steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from chronotope.api.v1alpha1.trainingjob import RestartPolicy, TrainingJobSpec
from chronotope.controllers.reads import QuotaReads, ServingReads
from chronotope.planners.profile import ModelProfile
from chronotope.sharing.labels import (
    GENERATION_ANNOTATION,
    PLANNED_FOR_ANNOTATION,
    PREEMPTED_BY_ANNOTATION,
)
from chronotope.workloads.capacity import ClusterFacts, cluster_capacity
from chronotope.workloads.gang import GENERATION_LABEL, JOB_LABEL, headless_service, worker_pods
from chronotope.workloads.gates import Cycle, Decider, preempt
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import (
    NamespaceLabels,
    RuntimeRule,
    VolumeLimits,
    VolumeRule,
    namespace_labels,
)
from chronotope.workloads.parallelism import choose_degrees
from chronotope.workloads.quota import StopCause, Verdict
from chronotope.workloads.replan import (
    avoid_after_stuck,
    better_plan,
    parse_time,
    progress,
    remaining_work,
)
from chronotope.workloads.training import Action, Decision
from chronotope.workloads.training_pass import JobVerdict, SchedulingPass, schedule
from chronotope.workloads.training_quota import QuotaView, waiting_serving
from chronotope.workloads.training_status import (
    QUOTA_RESERVED,
    condition,
    decided_phase,
    merge_conditions,
    pods_status,
    queued_since,
    resizing_status,
    started_status,
    unplaced_reason,
    waiting_status,
)

__all__ = [
    "DRAINING",
    "RECLAIMING",
    "STOP_WHY",
    "UNWATCHED_CAUSES",
    "ClusterOps",
    "Outcome",
    "PassCache",
    "fresh_pass",
    "merged_status",
    "preemption_cause",
    "reconcile",
]

_DONE = ("Succeeded", "Failed")


@dataclass
class Outcome:
    """What one reconcile answers: the status to write, annotations to set, events to post."""

    status: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(Normal | Warning, reason, message)"""
    deferred: bool = False
    """Nothing was decided: a start waits for the scheduling pass being made (`PassCache`)."""
    preempted: tuple[str, str] | None = None
    """This job was checkpointed and stopped for another: (cause, queue), `preemption_cause`."""
    admitted: tuple[str, float] | None = None
    """This job's gang was created: (its Queue, or "" without queues; seconds it waited)."""


_WITHIN_QUEUE = "higher priority in queue "
_LEASE_IN_QUEUE = "cluster policy's lease in queue "
_FAIR_SHARE = "fair share of queue "
RECLAIMING = "reclaiming quota of queue "
"""The why of a preemption that reclaims lent quota (a TrainingJob's, or `controllers.queues`' for
serving pods)."""
STOP_WHY = {
    StopCause.RECLAIM: RECLAIMING,
    StopCause.FAIR_SHARE: _FAIR_SHARE,
    StopCause.WITHIN_QUEUE: _WITHIN_QUEUE,
    StopCause.LEASE: _LEASE_IN_QUEUE,
}
"""The why a quota verdict's victims are preempted with, by whose work they are (a
TrainingJob's verdict, or `controllers.queues`' for serving pods)."""
_PRIORITY = "higher priority"
DRAINING = "draining queue "
"""The why of a preemption by a queue under `stopPolicy: HoldAndDrain` (`controllers.queues`)."""


def preemption_cause(preempted_by: str) -> tuple[str, str]:
    """(cause, queue) of a preemption from the victim's `preempted-by` annotation.

    The annotation is `NS/JOB (WHY)`, the WHY one of those `_enact` and
    `_try_preempt` write: `WithinQueue` (higher priority in the queue named),
    `Reclaim` (the queue named reclaims its lent quota), `FairShare` (the queue
    named borrows for its fair share), `Lease` (the cluster policy gave its lease
    to work of the queue named), `Drain` (the queue
    named is drained, `controllers.queues`), or `Priority` (priority
    preemption for GPUs, no queue).
    """
    _, _, why = preempted_by.partition(" (")
    why = why.removesuffix(")")
    for prefix, cause in (
        (_WITHIN_QUEUE, StopCause.WITHIN_QUEUE.value),
        (_LEASE_IN_QUEUE, StopCause.LEASE.value),
        (_FAIR_SHARE, StopCause.FAIR_SHARE.value),
        (RECLAIMING, StopCause.RECLAIM.value),
        (DRAINING, "Drain"),
    ):
        if why.startswith(prefix):
            return cause, why.removeprefix(prefix)
    return "Priority", ""


class ClusterOps(QuotaReads, ServingReads, Protocol):
    """What `reconcile` reads from and writes to the cluster."""

    decide_lock: threading.Lock
    """Deciding and starting is one critical section across all jobs: the next
    decision must see the workers the previous one created."""

    def pods(
        self, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The pods in `namespace` (all namespaces if None) matching the label `selector`."""
        ...

    def model_profile(self, namespace: str, name: str) -> ModelProfile | str:
        """The model profile in ConfigMap `namespace/name`, or why it cannot be used."""
        ...

    def volume_rules(self) -> Mapping[str, VolumeRule] | None:
        """Where each PersistentVolumeClaim may be used (`node_fit.volume_rules`; None: unknown)."""
        ...

    def runtime_rules(self) -> Mapping[str, RuntimeRule] | None:
        """What each RuntimeClass adds to its pods (`node_fit.runtime_rules`; None: unknown)."""
        ...

    def volume_limits(self) -> VolumeLimits:
        """How many CSI volumes each node may attach (`node_fit.volume_limits`)."""
        ...

    def start(
        self, namespace: str, service: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> None:
        """Create a gang: its headless `service` (None: a one-worker gang has none) and pods."""
        ...

    def stop(self, namespace: str, names: Sequence[str]) -> None:
        """Stop the named pods, after asking them to checkpoint."""
        ...

    def preempt(self, job_key: str, by: str, why: str, grace_seconds: int) -> None:
        """Mark `job_key` preempted by `by` (because `why`) and stop its workers gracefully."""
        ...


def _decider(ops: ClusterOps) -> Decider:
    return Decider(ops.model_profile, ops.pods)


@dataclass
class _Cycle:
    """One reconcile of one job: what it read, and what it will answer."""

    job: Mapping[str, Any]
    spec: TrainingJobSpec
    ops: ClusterOps
    now: datetime
    gen: int
    out: Outcome

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.job["metadata"]["namespace"])

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def generation(self) -> int | None:
        value = self.job["metadata"].get("generation")
        return int(value) if value is not None else None


def reconcile(
    job: Mapping[str, Any], ops: ClusterOps, now: datetime, passes: PassCache | None = None
) -> Outcome:
    """Reconcile one TrainingJob at `now`: keep, restart, start or hold its gang.

    Stops workers of an older gang generation, then either checks the running
    gang (restart on resize, lost workers or a better plan), restarts a gang that
    vanished, or enacts its verdict in the scheduling pass (`passes`, shared by
    the loop's reconciles; a pass of its own when None): start now or wait.
    Finished jobs get an empty outcome.
    """
    meta = job["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    annotations = meta.get("annotations") or {}
    status = dict(job.get("status") or {})
    if status.get("phase") in _DONE:
        return Outcome()
    spec = job_spec(job)
    gen = int(annotations.get(GENERATION_ANNOTATION, "0"))
    pods = [
        p
        for p in ops.pods(namespace, f"{JOB_LABEL}={name}")
        if not p["metadata"].get("deletionTimestamp")
    ]
    current = [p for p in pods if p["metadata"]["labels"].get(GENERATION_LABEL) == str(gen)]
    stale = [p["metadata"]["name"] for p in pods if p not in current]
    if stale:
        ops.stop(namespace, stale)
    plan = status.get("plan")
    cycle = _Cycle(job, spec, ops, now, gen, Outcome())
    started = bool(plan) and status.get("phase") in ("Starting", "Running")
    preempted_by = annotations.get(PREEMPTED_BY_ANNOTATION)
    if started and preempted_by and len(current) < int((plan or {}).get("workers", 0)):
        # preempted: its whole gang is gone, or part of it while the preemptor stops the
        # rest with its grace period (not workers lost); plan it afresh
        cycle.out.preempted = preemption_cause(preempted_by)
        why = f"preempted by {preempted_by}: checkpointed, stopped, re-queued"
        return _restart(cycle, [], why, "Preempted")
    if current and plan:
        return _running(cycle, current, plan, passes)
    if current:  # its gang exists, but the status write after its start was lost
        why = "its workers exist but its status has no plan (a status write failed); re-planning"
        return _restart(cycle, current, why, "Replanning")
    if started:  # the whole gang is gone: its nodes were deleted; plan it afresh
        why = "all workers are gone (nodes deleted?); re-planning"
        return _restart(cycle, [], why, "GangLost")
    return _start_or_wait(cycle, passes)


def _running(
    c: _Cycle,
    current: list[dict[str, Any]],
    plan: Mapping[str, Any],
    passes: PassCache | None = None,
) -> Outcome:
    meta = c.job["metadata"]
    out = c.out
    planned_for = plan.get("plannedForReplicas")
    if planned_for is None:  # started by an earlier operator: it kept this in an annotation
        planned_for = (meta.get("annotations") or {}).get(PLANNED_FOR_ANNOTATION, c.spec.replicas)
    planned_for = int(planned_for)
    cluster_nodes = c.ops.nodes()
    nodes = {n["metadata"]["name"] for n in cluster_nodes}
    failed = [
        p
        for p in current
        if (p.get("status") or {}).get("phase") == "Failed"
        or ((p.get("spec") or {}).get("nodeName") or "") not in nodes | {""}
    ]  # failed workers, and workers on nodes that are gone
    missing = int(plan.get("workers", 0)) - len(current)
    restart_why = None
    if c.spec.replicas != planned_for:
        restart_why = (
            f"resizing from {plan.get('workers')} to {c.spec.replicas} worker(s): "
            "checkpoint, stop, re-plan"
        )
        out.events.append(("Normal", "Resizing", restart_why))
    elif (gave_up := _give_up(c, current)) is not None:
        c.ops.stop(c.namespace, [p["metadata"]["name"] for p in current])
        ended = _ended(c, "Failed", gave_up)
        out.status = {"phase": "Failed", "whyWaiting": gave_up, "conditions": ended}
        out.events.append(("Warning", "Failed", gave_up))
        return out
    elif failed or missing > 0:
        lost = len(failed) + max(missing, 0)
        restart_why = (
            f"lost {lost} worker(s) (node gone or worker failed); restarting the gang "
            "from its checkpoint with a new plan"
        )
        out.events.append(("Warning", "WorkersLost", restart_why))
    elif (bound := _stuck(current, plan, c.now)) is not None:
        placed = "could not be placed" if bound == 0 else f"was bound {bound} of {len(current)}"
        said = unplaced_reason(current)
        cause = f"kube-scheduler: {said}" if said else "another workload took the GPUs"
        avoid = avoid_after_stuck(
            c.job.get("status") or {},
            current,
            job_spec(c.job, as_written=True),
            cluster_capacity(cluster_nodes, c.ops.pods(), facts=cluster_facts(c.ops)),
        )
        off = f" off node(s) {', '.join(avoid)}" if avoid else ""
        restart_why = f"the gang {placed} within {STUCK_AFTER_S:.0f}s ({cause}); re-planning{off}"
        out.events.append(("Normal", "Replanning", restart_why))
        _restart(c, current, restart_why)
        out.status["avoidNodes"] = avoid or None
        return out
    elif (moved := _availability_replan(c, current, plan, cluster_nodes)) is not None:
        restart_why = moved
        out.events.append(("Normal", "Replanning", restart_why))
    elif passes is not None and (lease := passes.stop_of(c.key, plan)) is not None:
        restart_why = lease
        out.events.append(("Normal", "LeaseGivenUp", restart_why))
        out.preempted = ("Lease", "")
    if restart_why is not None:
        return _restart(c, current, restart_why)
    if all((p.get("status") or {}).get("phase") == "Succeeded" for p in current):
        ended = _ended(c, "Succeeded", "all workers finished")
        out.status = {"phase": "Succeeded", "whyWaiting": None, "conditions": ended}
        took = progress(c.job.get("status") or {}, c.now)
        if took > 0:  # what the policy learns estimate errors from (workloads.fleet)
            out.status["estimateRatio"] = round(took, 4)
        out.events.append(("Normal", "Succeeded", "all workers finished"))
        return out
    out.status = pods_status(current, plan, c.now, c.generation)
    return out


def _ended(c: _Cycle, phase: str, why: str) -> list[dict[str, Any]]:
    """An ended job's conditions: it runs no more, and it no longer holds its queue's quota."""
    released = "the job ended: it holds no quota"
    return [
        condition("Running", False, phase, why, now=c.now, generation=c.generation),
        condition(QUOTA_RESERVED, False, "Finished", released, now=c.now, generation=c.generation),
    ]


def _give_up(c: _Cycle, current: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a gang with a failed worker is not restarted (spec.restart), or None."""
    failed = [p for p in current if (p.get("status") or {}).get("phase") == "Failed"]
    if not failed:
        return None  # lost nodes are the cluster's fault: those gangs are restarted
    names = ", ".join(sorted(p["metadata"]["name"] for p in failed))
    if c.spec.restart.policy is RestartPolicy.NEVER:
        return f"worker(s) {names} failed and spec.restart.policy is Never"
    restarts = int((c.job.get("status") or {}).get("restarts", 0))
    if restarts >= c.spec.restart.max_restarts:
        return (
            f"worker(s) {names} failed after {restarts} restart(s); "
            f"spec.restart.maxRestarts is {c.spec.restart.max_restarts}"
        )
    return None


STUCK_AFTER_S = 45.0
_QUEUED = ("Waiting", "Resizing")


def _availability_replan(
    c: _Cycle,
    current: Sequence[Mapping[str, Any]],
    plan: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
) -> str | None:
    """Why a running, checkpointing gang should restart with a new plan, or None (SAILOR).

    Two triggers: a worker sits on a cordoned node (move off it, if the job can
    start elsewhere now), or the gang runs below its wanted size and GPUs are
    free that no waiting job wants (grow, or re-pick a faster type, when that
    finishes clearly earlier; `workloads.replan`).
    """
    if c.spec.checkpoint is None or not current:
        return None
    if any((p.get("status") or {}).get("phase") != "Running" for p in current):
        return None
    unschedulable = {
        n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")
    }
    on = {str((p.get("spec") or {}).get("nodeName") or "") for p in current}
    cordoned = sorted(on & unschedulable)
    if not cordoned and int(plan.get("workers", 0)) >= c.spec.replicas:
        return None
    with c.ops.decide_lock:
        pods, jobs = c.ops.pods(), c.ops.training_jobs()
        if not cordoned and _others_queued(c, jobs):
            return None
        mine = frozenset(f"{c.namespace}/{p['metadata']['name']}" for p in current)
        capacity = cluster_capacity(nodes, pods, ignore_pods=mine, facts=cluster_facts(c.ops))
        left = remaining_work(c.job.get("status") or {})
        decision = _decider(c.ops).decide(c.namespace, c.spec, capacity, c.now, remaining=left)
    if cordoned:
        if decision.action is not Action.START:
            return None  # nowhere to go now: keep running until the node is drained
        return (
            f"node(s) {', '.join(cordoned)} cordoned: moving the gang off them "
            f"({decision.workers} worker(s) on {decision.gpu_type}, from the checkpoint)"
        )
    return better_plan(plan, decision, c.now)


def _others_queued(c: _Cycle, jobs: Sequence[Mapping[str, Any]]) -> bool:
    """Another job waits for one of this job's GPU types (it gets free GPUs first)."""
    mine = {t.name for t in c.spec.gpu_types}
    for job in jobs:
        meta = job.get("metadata") or {}
        if (meta.get("namespace"), meta.get("name")) == (c.namespace, c.name):
            continue
        if (job.get("status") or {}).get("phase") not in _QUEUED:
            continue
        if mine & {t.get("name") for t in (job.get("spec") or {}).get("gpuTypes") or []}:
            return True
    return False


def _stuck(
    current: Sequence[Mapping[str, Any]], plan: Mapping[str, Any], now: datetime
) -> int | None:
    """How many workers are bound if the gang is not whole long after its start, else None.

    None bound: the plan raced with another placement. Some bound: the extender lost
    the rest's reservation (a restart between two members' binds) and their GPUs
    went to other pods; the bound part holds GPUs for nothing, so it is re-planned too.
    """
    bound = sum(1 for p in current if (p.get("spec") or {}).get("nodeName"))
    if bound == len(current):
        return None
    started = plan.get("startTime")
    if not started:
        return None
    since = parse_time(started)
    assert since is not None
    return bound if (now - since).total_seconds() > STUCK_AFTER_S else None


def _restart(
    c: _Cycle, current: Sequence[Mapping[str, Any]], why: str, reason: str | None = None
) -> Outcome:
    """Checkpoint and stop the gang; the next cycle plans it afresh (new gang generation)."""
    if current:
        c.ops.stop(c.namespace, [p["metadata"]["name"] for p in current])
    if reason is not None:
        c.out.events.append(("Warning", reason, why))
    c.out.annotations[GENERATION_ANNOTATION] = str(c.gen + 1)
    c.out.annotations[PREEMPTED_BY_ANNOTATION] = ""
    c.out.status = resizing_status(c.job.get("status") or {}, why, c.now, c.generation)
    return c.out


def _start_or_wait(c: _Cycle, passes: PassCache | None) -> Outcome:
    if passes is None:  # on its own: a pass of its own, and its start, in one critical section
        with c.ops.decide_lock:
            verdict = fresh_pass(c.ops, c.now, include=(c.key,)).verdicts.get(c.key)
            return c.out if verdict is None else _enact(c, verdict, threading.Lock())
    if passes.needs_pass():
        with c.ops.decide_lock:
            passes.ensure(c.ops, c.now)
    verdict = passes.verdict_of(c.key)
    if verdict is None:
        return c.out  # it has a gang already, or it is newer than the pass: the next decides
    if verdict.decision.action is not Action.START and not _may_preempt(verdict):
        # saying why it waits never makes a pass count wrongly: no need to hold a pass back
        return _enact(c, verdict, passes.preempt_lock, preempting=False)
    # starts (and priority preemption, which starts the job at once) of one pass are
    # enacted side by side; the next pass waits for them. While the next pass is being
    # made the start is deferred, not blocked: the loop reconciles the job again once
    # that pass is made, with its verdict there
    with passes.enacting(c.key) as entered:
        if not entered:
            c.out.deferred = True
            return c.out
        verdict = passes.verdict_of(c.key)
        if verdict is None:
            return c.out
        return _enact(c, verdict, passes.preempt_lock)


def _may_preempt(verdict: JobVerdict) -> bool:
    """A waiting job that priority preemption could start now (lower-priority victims exist)."""
    if verdict.decision.action is not Action.WAIT or verdict.held_by_quota:
        return False
    return preempt(verdict.cycle, verdict.decision) is not None


def _enact(
    c: _Cycle, verdict: JobVerdict, preempt_lock: threading.Lock, *, preempting: bool = True
) -> Outcome:
    """Carry out the pass's verdict for this job: start it, reclaim, preempt, or say why not.

    `preempt_lock` serialises the choice of priority-preemption victims between jobs;
    without `preempting` a waiting job only says why it waits.
    """
    out = c.out
    decision = verdict.decision
    admission = verdict.admission
    if admission is not None and admission.verdict is Verdict.RECLAIM:
        grace = admission.grace_seconds or 30
        for victim in admission.victims:
            c.ops.preempt(
                victim,
                by=c.key,
                why=f"{STOP_WHY[admission.cause]}{admission.queue}",
                grace_seconds=grace,
            )
    elif preempting and decision.action is Action.WAIT and not verdict.held_by_quota:
        with preempt_lock:
            decision = _try_preempt(c, verdict.cycle, decision)
    why = decision.why
    status = c.job.get("status") or {}
    if why is not None:
        out.status = waiting_status(decision, c.now, c.generation)
        out.status["conditions"].append(verdict.quota_condition(c.now, c.generation))
        if why.message != status.get("whyWaiting"):
            if why.unresolvable:
                out.events.append(("Warning", why.code, why.message))
            else:  # a quota reason names itself; waiting for GPUs is plain "Waiting"
                reason = "Waiting" if why.code == "WaitingForGPUs" else why.code
                out.events.append(("Normal", reason, why.message))
        return out
    degrees = decision.degrees or choose_degrees(
        c.spec.parallelism, decision.workers, decision.gpus_per_worker
    )
    pods = worker_pods(c.job, c.spec, decision, c.gen, degrees)
    # a one-worker gang has no rendezvous to resolve: no Service (one API write less)
    c.ops.start(c.namespace, headless_service(c.job) if len(pods) > 1 else None, pods)
    # one status patch: the plan records the spec.replicas it is for
    out.status = started_status(
        c.name, decision, degrees, c.now, c.generation, replicas=c.spec.replicas
    )
    out.status["conditions"].append(verdict.quota_condition(c.now, c.generation))
    out.events.append(("Normal", "Started", decision.reason))
    since = queued_since(c.job)
    waited = max(0.0, (c.now - since).total_seconds()) if since is not None else 0.0
    out.admitted = ((admission.queue or "") if admission is not None else "", waited)
    if degrees.note:
        out.events.append(("Warning", "ParallelismHints", degrees.note))
    return out


def cluster_facts(ops: ClusterOps, namespaces: NamespaceLabels | None = None) -> ClusterFacts:
    """What the cluster holds beyond its nodes and pods, as `ops` reads it now.

    Where its claims may be used, its namespaces' labels (a pod affinity's
    `namespaceSelector`; `namespaces` when already read), what its RuntimeClasses
    add to pods and how many CSI volumes each node may attach; what the pass, the
    stuck rule and the re-plan all read.
    """
    return ClusterFacts(
        volumes=ops.volume_rules(),
        namespaces=namespaces if namespaces is not None else namespace_labels(ops.namespaces()),
        runtimes=ops.runtime_rules(),
        limits=ops.volume_limits(),
    )


def fresh_pass(ops: ClusterOps, now: datetime, include: Collection[str] = ()) -> SchedulingPass:
    """A scheduling pass over every waiting job, on the cluster as `ops` reads it now.

    With Queues, the serving workloads that wait for quota keep their place by
    age in its admission cycle (`training_quota.waiting_serving`).
    """
    view = QuotaView.parse(ops.queues(), ops.local_queues(), ops.namespaces())
    waits = waiting_serving(ops.inference_pipelines(), ops.model_variants()) if view.on else []
    return schedule(
        ops.training_jobs(),
        ops.nodes(),
        ops.pods(),
        view,
        decider=_decider(ops),
        now=now,
        include=include,
        serving_waits=waits,
        facts=cluster_facts(ops, view.namespaces),
    )


UNWATCHED_CAUSES = ("ProfileMissing", "ProfileUnusable")
"""Why-not causes that no watch event clears (the profile ConfigMap is read, not watched)."""


class PassCache:
    """The scheduling pass a control loop's reconciles share, and when to make the next.

    Reconciles read verdicts from the latest pass (`verdict`); the loop makes
    the next one (`refresh`) once something the pass did not predict has changed
    (`invalidate`: every event that concerns waiting jobs, except a job's own
    write of its verdict), or when the latest is `max_age_s` old (reasons that
    change with time: deadlines, predicted completions). Between passes a stale
    verdict is still enacted: like a scheduling cycle of kube-scheduler or KAI,
    a pass is a snapshot, and a start that no longer fits is caught as a stuck
    gang and re-planned. Call `refresh` and `ensure` with `ClusterOps.decide_lock`
    held; enact verdicts inside `enacting` (many at once), never with the decide
    lock held.
    """

    def __init__(
        self,
        max_age_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_pass: Callable[[float, int], None] | None = None,
    ) -> None:
        """Keep passes for `max_age_s`; `on_pass(seconds, jobs)` observes each new one."""
        self.max_age_s = max_age_s
        self.clock = clock
        self.on_pass = on_pass
        self.last_seconds = 0.0
        """How long the latest pass took to make."""
        self.preempt_lock = threading.Lock()
        """Serialises priority preemption between the jobs enacting one pass."""
        self._gate = threading.Condition()
        self._enacting = 0
        self._making = False
        self._deferred: set[str] = set()
        self._current: SchedulingPass | None = None
        self._made = 0.0
        self._stale = True
        self._to_start: set[str] = set()

    @property
    def latest(self) -> SchedulingPass | None:
        """The latest pass, current or stale (None before the first)."""
        return self._current

    def invalidate(self) -> None:
        """Something the pass did not predict changed: `refresh` makes a new one."""
        self._stale = True

    def phase_of(self, key: str) -> str | None:
        """The phase the latest pass gives job `key` (None: it did not decide it)."""
        current = self._current
        verdict = current.verdicts.get(key) if current is not None else None
        return None if verdict is None else decided_phase(verdict.decision)

    def refresh(
        self, ops: ClusterOps, now: datetime, include: Collection[str] = ()
    ) -> SchedulingPass | None:
        """A new pass if the latest is stale, too old or missing a job of `include`; else None."""
        current = self._current
        if (
            current is not None
            and not self._stale
            and self.clock() - self._made <= self.max_age_s
            and all(k in current.verdicts for k in include)
        ):
            return None
        self._stale = False
        with self._gate:  # no enactment of the latest pass is under way while the next is made
            self._making = True
            while self._enacting:
                self._gate.wait()
        try:
            started = time.perf_counter()
            current = fresh_pass(ops, now, include)
            self.last_seconds = time.perf_counter() - started
            self._current, self._made = current, self.clock()
            self._to_start = {
                k for k, v in current.verdicts.items() if v.decision.action is Action.START
            }
        finally:
            with self._gate:
                self._making = False
                self._gate.notify_all()
        if self.on_pass is not None:
            self.on_pass(self.last_seconds, len(current.verdicts))
        return current

    def due(self, after_s: float) -> bool:
        """The latest pass is `after_s` old and a job in it waits for what no watch announces.

        That is a model profile ConfigMap that is missing or unusable (ConfigMaps
        are not watched): such a job is decided again every `after_s` seconds.
        """
        current = self._current
        if current is None or self.clock() - self._made < after_s:
            return False
        return any(v.decision.cause in UNWATCHED_CAUSES for v in current.verdicts.values())

    def needs_pass(self) -> bool:
        """There is no pass yet, or the latest is too old to enact."""
        return self._current is None or self.clock() - self._made > self.max_age_s

    def ensure(self, ops: ClusterOps, now: datetime) -> None:
        """Make a pass if `needs_pass` (call with the decide lock held)."""
        if self.needs_pass():
            self._stale = True
            self.refresh(ops, now)

    @contextmanager
    def enacting(self, key: str) -> Iterator[bool]:
        """Hold while job `key` enacts a start of the latest pass: no new pass is made meanwhile.

        Many jobs enact starts of one pass at once (their API calls overlap); a
        new pass waits until they are done, so it sees every gang they created.
        Yields False, holding nothing, while the next pass is being made: the
        caller defers, and `deferred` hands `key` back once that pass is made.
        """
        with self._gate:
            entered = not self._making
            if entered:
                self._enacting += 1
            else:
                self._deferred.add(key)
        try:
            yield entered
        finally:
            if entered:
                with self._gate:
                    self._enacting -= 1
                    self._gate.notify_all()

    def starts_left(self) -> int:
        """Starts of the latest pass that no reconcile has finished enacting yet."""
        with self._gate:
            return len(self._to_start)

    def settled(self, key: str) -> None:
        """Job `key` was reconciled (not deferred) or is gone: it enacts no start of this pass."""
        with self._gate:
            self._to_start.discard(key)

    def deferred(self) -> set[str]:
        """The jobs that deferred a start while the latest pass was made (each given once)."""
        with self._gate:
            keys, self._deferred = self._deferred, set()
        return keys

    def verdict_of(self, key: str) -> JobVerdict | None:
        """Job `key`'s verdict in the latest pass (None: not in it, or no pass yet)."""
        current = self._current
        return None if current is None else current.verdicts.get(key)

    def stop_of(self, key: str, plan: Mapping[str, Any]) -> str | None:
        """Why the latest pass gives running job `key`'s lease up, or None.

        Only for the gang that pass saw: one started after it (`plan.startTime`) keeps
        running until a pass has seen it.
        """
        current = self._current
        why = None if current is None else current.stops.get(key)
        if why is None or current is None:
            return None
        started = parse_time(plan.get("startTime"))
        if started is None or started > current.now:
            return None
        return why


def _try_preempt(c: _Cycle, cycle: Cycle, decision: Decision) -> Decision:
    """Stop lower-priority preemptible jobs if that lets this one start now."""
    preemption = preempt(cycle, decision)
    if preemption is None:
        return decision
    for victim in preemption.victims:
        c.ops.preempt(victim, by=cycle.key, why=_PRIORITY, grace_seconds=30)
    c.out.events.append(
        (
            "Normal",
            "Preempting",
            f"stopping lower-priority preemptible {', '.join(preemption.victims)} "
            "(checkpoint first) to start now",
        )
    )
    return preemption.decision


def merged_status(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The status patch: new fields over old, conditions merged by type."""
    if "conditions" in new:
        new = new | {"conditions": merge_conditions(old.get("conditions") or [], new["conditions"])}
    return new
