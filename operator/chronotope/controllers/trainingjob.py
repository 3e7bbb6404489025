"""TrainingJob reconciliation: decide (pure), then enact (API), then report (status, events).

One function, `reconcile`, is the whole loop for one job, in the KAI-Scheduler
`runOnce` spirit: read the job and the cluster, keep a running gang as it is,
restart it (from its checkpoint) when the user scaled it or it lost workers,
and otherwise decide where and when it starts. It returns the status to show
and the events to post; the kopf handler applies them. Because status is
recomputed from the cluster each time, an operator restart mid-resize
converges on the same state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.planners.profile import ModelProfile, profile_from_data
from chronotope.workloads.capacity import cluster_capacity
from chronotope.workloads.fleet import FleetJob, fleet_gate
from chronotope.workloads.gang import GENERATION_LABEL, JOB_LABEL, headless_service, worker_pods
from chronotope.workloads.joint import Contender, arbitrate, options_for
from chronotope.workloads.parallelism import Degrees, choose_degrees
from chronotope.workloads.preemption import plan_preemption
from chronotope.workloads.profiled import ProfilePlanner
from chronotope.workloads.queueing import blocking_job, queue_key
from chronotope.workloads.replan import (
    better_plan,
    completed_fraction,
    parse_time,
    remaining_work,
)
from chronotope.workloads.training import Action, Decision, decide
from chronotope.workloads.training_status import (
    condition,
    merge_conditions,
    pods_status,
    waiting_status,
)

if TYPE_CHECKING:
    from chronotope.kube.store import OperatorCache

__all__ = [
    "GENERATION_ANNOTATION",
    "PLANNED_FOR_ANNOTATION",
    "PREEMPTED_BY_ANNOTATION",
    "ClusterOps",
    "Outcome",
    "reconcile",
]

log = logging.getLogger(__name__)

GENERATION_ANNOTATION = "chronotope.dev/gang-generation"
PLANNED_FOR_ANNOTATION = "chronotope.dev/planned-for-replicas"
PREEMPTED_BY_ANNOTATION = "chronotope.dev/preempted-by"
PROFILE_TTL_S = 5.0
_DONE = ("Succeeded", "Failed")


@dataclass
class Outcome:
    status: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(Normal | Warning, reason, message)"""


class ClusterOps:
    """The API calls `reconcile` needs (a seam: tests and the operator pass real ones)."""

    def __init__(self, api: Any, cache: OperatorCache | None = None) -> None:
        from chronotope.kube import workloads as kw

        self.api = api
        self._kw = kw
        self.cache = cache
        """Watch-fed nodes, pods and TrainingJobs; without it every read lists from the API."""
        # decide-and-start is one critical section across all jobs: the next decision
        # must see the workers the previous one created
        self.decide_lock = threading.Lock()
        self.decisions: dict[tuple[Any, ...], tuple[Sequence[Any], Decision]] | None = None
        """Decisions already made in the current critical section (see `memo_decisions`)."""
        self._profiles: dict[tuple[str, str], tuple[str, ModelProfile | str]] = {}
        self._profile_reads: dict[tuple[str, str], tuple[float, ModelProfile | str]] = {}

    @contextmanager
    def memo_decisions(self) -> Iterator[None]:
        """Take `decide_lock`; inside, deciding the same job on the same capacity is done once.

        One reconcile asks for the same other jobs' decisions in its queue, fleet and
        joint gates; for a job planned from a model profile each is a planner run.
        """
        with self.decide_lock:
            self.decisions = {}
            try:
                yield
            finally:
                self.decisions = None

    def model_profile(self, namespace: str, name: str) -> ModelProfile | str:
        """The model profile in ConfigMap `namespace/name`, or why it cannot be used.

        Read at most once per `PROFILE_TTL_S` (one reconcile plans many jobs), and
        parsed again only when the ConfigMap's resourceVersion changed.
        """
        recent = self._profile_reads.get((namespace, name))
        if recent is not None and time.monotonic() - recent[0] < PROFILE_TTL_S:
            return recent[1]
        result = self._read_profile(namespace, name)
        self._profile_reads[(namespace, name)] = (time.monotonic(), result)
        return result

    def _read_profile(self, namespace: str, name: str) -> ModelProfile | str:
        cm = self._kw.read_config_map(self.api, namespace, name)
        if cm is None:
            return (
                f"model profile {name} not found: no ConfigMap {namespace}/{name} "
                "(create it with `chronotope profile configmap`)"
            )
        version = str(cm["metadata"].get("resourceVersion", ""))
        cached = self._profiles.get((namespace, name))
        if cached is not None and cached[0] == version:
            return cached[1]
        parsed: ModelProfile | str
        try:
            parsed = profile_from_data(cm.get("data") or {}, source=f"ConfigMap {namespace}/{name}")
        except ValueError as exc:
            parsed = f"model profile {name} is unusable: {exc}"
        self._profiles[(namespace, name)] = (version, parsed)
        return parsed

    def nodes(self) -> list[dict[str, Any]]:
        if self.cache is not None:
            return self.cache.nodes.list()
        return self._kw.list_nodes(self.api)

    def pods(
        self, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        if self.cache is not None:
            return self.cache.pods.list(namespace, selector)
        return self._kw.list_pods(self.api, namespace, selector)

    def training_jobs(self) -> list[dict[str, Any]]:
        if self.cache is not None:
            return self.cache.training_jobs.list()
        return self._kw.list_custom(self.api, "chronotope.dev", "v1alpha1", "trainingjobs")

    def start(self, namespace: str, service: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self._kw.ensure_service(self.api, namespace, service)
        self._kw.create_pods(self.api, pods)
        if self.cache is not None:  # the next decision must count them (watch may lag)
            self.cache.pods.put(pods)

    def stop(self, namespace: str, names: Sequence[str]) -> None:
        self._kw.delete_pods(self.api, namespace, names)

    def preempt(self, job_key: str, by: str) -> None:
        """Mark the victim (its own reconcile reports it) and stop its workers gracefully."""
        namespace, name = job_key.split("/", 1)
        self._kw.annotate_custom(
            self.api,
            ("chronotope.dev", "v1alpha1", "trainingjobs"),
            namespace,
            name,
            {PREEMPTED_BY_ANNOTATION: by},
        )
        workers = self.pods(namespace, f"{JOB_LABEL}={name}")
        self.stop(namespace, [p["metadata"]["name"] for p in workers])


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
    def generation(self) -> int | None:
        value = self.job["metadata"].get("generation")
        return int(value) if value is not None else None


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _frees_at(jobs: Sequence[Mapping[str, Any]], me: str) -> dict[str, datetime]:
    """Earliest predicted completion per GPU type among running jobs (when a type frees up)."""
    out: dict[str, datetime] = {}
    for job in jobs:
        meta = job.get("metadata") or {}
        if f"{meta.get('namespace')}/{meta.get('name')}" == me:
            continue
        status = job.get("status") or {}
        plan = status.get("plan") or {}
        when = plan.get("predictedCompletionTime")
        if (
            status.get("phase") not in ("Running", "Starting")
            or not when
            or not plan.get("gpuType")
        ):
            continue
        t = parse_time(when)
        assert t is not None
        out[plan["gpuType"]] = min(out.get(plan["gpuType"], t), t)
    return out


def reconcile(job: Mapping[str, Any], ops: ClusterOps, now: datetime) -> Outcome:
    meta = job["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    annotations = meta.get("annotations") or {}
    status = dict(job.get("status") or {})
    if status.get("phase") in _DONE:
        return Outcome()
    spec = TrainingJobSpec.model_validate(job["spec"])
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
    if current and plan:
        return _running(cycle, current, plan)
    if plan and not current and status.get("phase") in ("Starting", "Running"):
        # the whole gang is gone: preempted, or its nodes were deleted; plan it afresh
        preempted_by = annotations.get(PREEMPTED_BY_ANNOTATION)
        why = (
            f"preempted by {preempted_by} (higher priority): checkpointed, stopped, re-queued"
            if preempted_by
            else "all workers are gone (nodes deleted?); re-planning"
        )
        return _restart(cycle, [], why, "Preempted" if preempted_by else "GangLost")
    return _start_or_wait(cycle, status)


def _running(c: _Cycle, current: list[dict[str, Any]], plan: Mapping[str, Any]) -> Outcome:
    meta = c.job["metadata"]
    out = c.out
    planned_for = int((meta.get("annotations") or {}).get(PLANNED_FOR_ANNOTATION, c.spec.replicas))
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
    elif failed or missing > 0:
        lost = len(failed) + max(missing, 0)
        restart_why = (
            f"lost {lost} worker(s) (node gone or worker failed); restarting the gang "
            "from its checkpoint with a new plan"
        )
        out.events.append(("Warning", "WorkersLost", restart_why))
    elif _stuck(current, plan, c.now):
        restart_why = (
            f"the gang could not be placed within {STUCK_AFTER_S:.0f}s "
            "(another workload took the GPUs); re-planning"
        )
        out.events.append(("Normal", "Replanning", restart_why))
    elif (moved := _availability_replan(c, current, plan, cluster_nodes)) is not None:
        restart_why = moved
        out.events.append(("Normal", "Replanning", restart_why))
    if restart_why is not None:
        return _restart(c, current, restart_why)
    if all((p.get("status") or {}).get("phase") == "Succeeded" for p in current):
        out.status = {"phase": "Succeeded", "whyWaiting": None}
        out.events.append(("Normal", "Succeeded", "all workers finished"))
        return out
    out.status = pods_status(current, plan, c.now, c.generation)
    return out


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
        capacity = cluster_capacity(nodes, pods, ignore_pods=mine)
        left = remaining_work(c.job.get("status") or {})
        decision = _decide(c.ops, c.namespace, c.spec, capacity, c.now, remaining=left)
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


def _stuck(current: Sequence[Mapping[str, Any]], plan: Mapping[str, Any], now: datetime) -> bool:
    """No worker bound long after the start: the plan raced with another placement."""
    if any((p.get("spec") or {}).get("nodeName") for p in current):
        return False
    started = plan.get("startTime")
    if not started:
        return False
    since = parse_time(started)
    assert since is not None
    return (now - since).total_seconds() > STUCK_AFTER_S


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
    status = c.job.get("status") or {}
    c.out.status = {
        "phase": "Resizing",
        "whyWaiting": why,
        "plan": None,
        "placement": [],
        "replicas": 0,
        "restarts": int(status.get("restarts", 0)) + 1,
        "completedFraction": completed_fraction(status, c.now),
    }
    return c.out


def planner_for(
    ops: ClusterOps, namespace: str, spec: TrainingJobSpec
) -> ProfilePlanner | str | None:
    """The job's profile planner; None without a model profile; a reason when it is unusable."""
    name = spec.parallelism.model_profile if spec.parallelism is not None else None
    if name is None:
        return None
    profile = ops.model_profile(namespace, name)
    if isinstance(profile, str):
        return profile
    return ProfilePlanner(profile, name, spec)


def _decide(
    ops: ClusterOps,
    namespace: str,
    spec: TrainingJobSpec,
    capacity: Sequence[Any],
    now: datetime,
    *,
    frees_at: Mapping[str, datetime] | None = None,
    remaining: float = 1.0,
) -> Decision:
    memo, key = ops.decisions, None
    if memo is not None and frees_at is None:
        key = (namespace, spec.model_dump_json(), id(capacity), now, remaining)
        hit = memo.get(key)
        if hit is not None and hit[0] is capacity:  # the memo holds it: its id is not reused
            return hit[1]
    planner = planner_for(ops, namespace, spec)
    if isinstance(planner, str):
        cause = "ProfileMissing" if "not found" in planner else "ProfileUnusable"
        decision = Decision(Action.IMPOSSIBLE, planner, cause=cause)
    else:
        decision = decide(spec, capacity, now, frees_at, planner=planner, remaining=remaining)
    if memo is not None and key is not None:
        memo[key] = (capacity, decision)
    return decision


def _start_or_wait(c: _Cycle, status: Mapping[str, Any]) -> Outcome:
    with c.ops.memo_decisions():
        return _start_or_wait_locked(c, status)


def _start_or_wait_locked(c: _Cycle, status: Mapping[str, Any]) -> Outcome:
    out = c.out
    nodes, pods, jobs = c.ops.nodes(), c.ops.pods(), c.ops.training_jobs()
    me = f"{c.namespace}/{c.name}"
    capacity = cluster_capacity(nodes, pods)
    remaining = remaining_work(status)
    decision = _decide(
        c.ops,
        c.namespace,
        c.spec,
        capacity,
        c.now,
        frees_at=_frees_at(jobs, me),
        remaining=remaining,
    )
    if decision.action is Action.START:
        decision = _queue_gate(c, capacity, jobs, decision)
        for gate in (_fleet_gate, _joint_gate):
            if decision.action is Action.START:
                decision = _advisory(
                    gate, c, capacity, jobs, decision=decision, remaining=remaining
                )
    elif decision.action is Action.WAIT:
        decision = _try_preempt(c, jobs, nodes, pods, decision)
    if decision.action is not Action.START:
        out.status = waiting_status(decision, c.now, c.generation)
        if decision.reason != status.get("whyWaiting"):
            kind = "Warning" if decision.action is Action.IMPOSSIBLE else "Normal"
            reason = (
                (decision.cause or "Unschedulable")
                if decision.action is Action.IMPOSSIBLE
                else "Waiting"
            )
            out.events.append((kind, reason, decision.reason))
        return out
    assert decision.finish is not None
    degrees = decision.degrees or choose_degrees(
        c.spec.parallelism, decision.workers, decision.gpus_per_worker
    )
    c.ops.start(
        c.namespace,
        headless_service(c.job),
        worker_pods(c.job, c.spec, decision, c.gen, degrees),
    )
    total = decision.workers * decision.gpus_per_worker
    out.annotations[PLANNED_FOR_ANNOTATION] = str(c.spec.replicas)
    out.status = {
        "phase": "Starting",
        "whyWaiting": None,
        "selector": f"{JOB_LABEL}={c.name}",
        "plan": {
            "gpuType": decision.gpu_type,
            "workers": decision.workers,
            "totalGpus": total,
            "parallelism": _parallelism(degrees),
            "startTime": _iso(c.now),
            "predictedCompletionTime": _iso(decision.finish),
            "expectedUtility": decision.utility,
            "predictedSamplesPerSecond": decision.samples_per_second,
            "planner": decision.planner_note
            or "parallelism hints (no model profile): " + _degrees_text(degrees),
        },
        "conditions": [
            condition(
                "Schedulable",
                True,
                "Planned",
                decision.reason,
                now=c.now,
                generation=c.generation,
            )
        ],
    }
    out.events.append(("Normal", "Started", decision.reason))
    if degrees.note:
        out.events.append(("Warning", "ParallelismHints", degrees.note))
    return out


_CONTENDING = (None, "", "Waiting", "Resizing")


def _start_options(
    ops: ClusterOps,
    namespace: str,
    spec: TrainingJobSpec,
    capacity: Sequence[Any],
    now: datetime,
    *,
    best: Decision,
    remaining: float,
) -> tuple[Decision, ...]:
    """`best` plus the start decision on each other GPU type, at `best`'s gang size."""
    per_type = [best]
    for option in spec.gpu_types:
        if option.name == best.gpu_type:
            continue
        only = spec.model_copy(update={"gpu_types": [option]})
        per_type.append(_decide(ops, namespace, only, capacity, now, remaining=remaining))
    return options_for(per_type)


def _whole_gpu_jobs(
    ops: ClusterOps, jobs: Sequence[Mapping[str, Any]], me: str, phases: tuple[str | None, ...]
) -> Iterator[tuple[Mapping[str, Any], TrainingJobSpec]]:
    """The other live whole-GPU jobs in `phases`, in the given order, with their specs.

    A job still "waiting" in our view that already has workers started a moment
    ago (its status is not in the view yet): it is left out, its GPUs already
    count as taken.
    """
    for job in jobs:
        meta = job.get("metadata") or {}
        phase = (job.get("status") or {}).get("phase")
        if (
            f"{meta.get('namespace')}/{meta.get('name')}" == me
            or meta.get("deletionTimestamp")
            or phase not in phases
        ):
            continue
        try:
            spec = TrainingJobSpec.model_validate(job.get("spec") or {})
        except ValueError:
            continue
        if spec.gpu.shared is not None or (phase in _CONTENDING and _has_gang(ops, job)):
            continue
        yield job, spec


def _has_gang(ops: ClusterOps, job: Mapping[str, Any]) -> bool:
    """The job has live workers of its current gang (it started, whatever its status says)."""
    meta = job.get("metadata") or {}
    gen = str((meta.get("annotations") or {}).get(GENERATION_ANNOTATION, "0"))
    return any(
        not p["metadata"].get("deletionTimestamp")
        and (p["metadata"].get("labels") or {}).get(GENERATION_LABEL) == gen
        for p in ops.pods(str(meta.get("namespace")), f"{JOB_LABEL}={meta.get('name')}")
    )


def _advisory(
    gate: Callable[[_Cycle, Sequence[Any], Sequence[Mapping[str, Any]], Decision, float], Decision],
    c: _Cycle,
    capacity: Sequence[Any],
    jobs: Sequence[Mapping[str, Any]],
    *,
    decision: Decision,
    remaining: float,
) -> Decision:
    """Run a gate that may only hold a start back; a fault in it must not stall the job."""
    try:
        return gate(c, capacity, jobs, decision, remaining)
    except Exception:
        log.exception(
            "%s failed for %s/%s; deciding without it", gate.__name__, c.namespace, c.name
        )
        return decision


def _fleet_job(job: Mapping[str, Any], spec: TrainingJobSpec, now: datetime) -> FleetJob:
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    plan = status.get("plan") or {}
    running = status.get("phase") in ("Running", "Starting") and plan.get("gpuType")
    return FleetJob(
        key=f"{meta.get('namespace')}/{meta.get('name')}",
        spec=spec,
        arrival=parse_time(meta.get("creationTimestamp")) or now,
        done=completed_fraction(status, now),
        running_on=str(plan["gpuType"]) if running else None,
        running_gpus=int(float(plan.get("totalGpus") or 0)) if running else 0,
    )


def _fleet_gate(
    c: _Cycle,
    capacity: Sequence[Any],
    jobs: Sequence[Mapping[str, Any]],
    decision: Decision,
    remaining: float,
) -> Decision:
    """Among jobs of this job's priority, start it only if the simulated policy would."""
    return _fleet_verdict(
        c.ops, c.job, c.spec, capacity, jobs, decision=decision, remaining=remaining, now=c.now
    )


def _fleet_verdict(
    ops: ClusterOps,
    job: Mapping[str, Any],
    spec: TrainingJobSpec,
    capacity: Sequence[Any],
    jobs: Sequence[Mapping[str, Any]],
    *,
    decision: Decision,
    remaining: float,
    now: datetime,
) -> Decision:
    """`decision` for `job` (a start) as held back or moved by `workloads.fleet`.

    `workloads.fleet` runs the same code as `chronotope simulate training`'s policy.
    """
    if spec.gpu.shared is not None:
        return decision
    meta = job.get("metadata") or {}
    namespace = str(meta.get("namespace"))
    me = f"{namespace}/{meta.get('name')}"
    others = [
        _fleet_job(other, other_spec, now)
        for other, other_spec in _whole_gpu_jobs(
            ops, jobs, me, (*_CONTENDING, "Running", "Starting")
        )
        if other_spec.priority == spec.priority
    ]
    if not others:
        return decision
    mine = replace(_fleet_job(job, spec, now), done=1.0 - remaining, running_on=None)
    if spec.parallelism is not None and spec.parallelism.model_profile is not None:
        # the profile, not relativeSpeed, says how fast each type is: speed = work / run time
        options = _start_options(
            ops, namespace, spec, capacity, now, best=decision, remaining=remaining
        )
        work = spec.estimate.duration_seconds * remaining
        mine = replace(
            mine,
            speeds={
                str(d.gpu_type): work / max(1.0, (d.finish - now).total_seconds())
                for d in options
                if d.finish is not None
            },
        )
    outcome = fleet_gate(
        replace(mine, running_gpus=0),
        decision.workers * decision.gpus_per_worker,
        others,
        capacity,
        now,
    )
    if not outcome.starts:
        return Decision(Action.WAIT, outcome.reason)
    if outcome.gpu_type is None:
        return decision
    if outcome.gpu_type != decision.gpu_type:
        option = next(t for t in spec.gpu_types if t.name == outcome.gpu_type)
        only = spec.model_copy(update={"gpu_types": [option]})
        there = _decide(ops, namespace, only, capacity, now, remaining=remaining)
        if there.action is not Action.START:
            return Decision(
                Action.WAIT, f"{outcome.reason}, but {outcome.gpu_type} has no room yet"
            )
        decision = there
    return replace(decision, reason=f"{decision.reason}; {outcome.reason}")


MAX_CONTENDERS = 8
"""Other jobs in one joint plan at most (queue heads, in queue order)."""


def _joint_gate(
    c: _Cycle,
    capacity: Sequence[Any],
    jobs: Sequence[Mapping[str, Any]],
    decision: Decision,
    remaining: float,
) -> Decision:
    """Start only if the joint CP-SAT plan of the jobs that could start now starts this one.

    The contenders are the heads of the other queues: in each queue, the first
    job (policy order) wanting an overlapping GPU type that could start now;
    jobs behind it wait for it anyway (the queue gate), and so do the jobs
    behind this one in its own queue.
    """
    if c.spec.gpu.shared is not None:
        return decision
    me = f"{c.namespace}/{c.name}"
    mine_types = {t.name for t in c.spec.gpu_types}
    served = {c.spec.queue}
    contenders = []
    for job, spec in _whole_gpu_jobs(c.ops, sorted(jobs, key=queue_key), me, _CONTENDING):
        if spec.queue in served or not {t.name for t in spec.gpu_types} & mine_types:
            continue
        meta = job["metadata"]
        ns = str(meta.get("namespace"))
        left = remaining_work(job.get("status") or {})
        best = _decide(c.ops, ns, spec, capacity, c.now, remaining=left)
        if best.action is not Action.START:
            continue  # cannot start: it does not hold its queue back (backfilling)
        served.add(spec.queue)
        options = _start_options(c.ops, ns, spec, capacity, c.now, best=best, remaining=left)
        contenders.append(Contender(f"{ns}/{meta.get('name')}", spec, options))
        if len(contenders) >= MAX_CONTENDERS:
            break
    if not contenders:
        return decision
    mine = Contender(
        me,
        c.spec,
        _start_options(
            c.ops, c.namespace, c.spec, capacity, c.now, best=decision, remaining=remaining
        ),
    )
    outcome = arbitrate(me, [mine, *contenders], capacity, c.now)
    if not outcome.starts:
        return Decision(Action.WAIT, outcome.reason)
    chosen = next((d for d in mine.options if d.gpu_type == outcome.gpu_type), decision)
    # the plan's nodes and GPUs go on the workers; the extender honours them
    return replace(
        chosen, reason=f"{chosen.reason}; {outcome.reason}", placements=outcome.placements
    )


def _queue_gate(
    c: _Cycle, capacity: Sequence[Any], jobs: Sequence[Mapping[str, Any]], decision: Decision
) -> Decision:
    """Hold a startable job back while a job ahead of it in its queue could start now."""

    def could_start(job: Mapping[str, Any], other: TrainingJobSpec) -> bool:
        """It could start now, and the cluster policy would start it (else it backfills)."""
        namespace = str(job["metadata"]["namespace"])
        left = remaining_work(job.get("status") or {})
        d = _decide(c.ops, namespace, other, capacity, c.now, remaining=left)
        if d.action is Action.START:
            d = _fleet_verdict(
                c.ops, job, other, capacity, jobs, decision=d, remaining=left, now=c.now
            )
        return d.action is Action.START

    ahead = blocking_job(c.job, c.spec, jobs, could_start)
    if ahead is None:
        return decision
    return Decision(
        Action.WAIT,
        f"queued behind {ahead} in queue {c.spec.queue} "
        "(policy order: priority, then deadline, then age)",
    )


def _try_preempt(
    c: _Cycle,
    jobs: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    decision: Decision,
) -> Decision:
    """Stop lower-priority preemptible jobs if that lets this one start now."""
    me = f"{c.namespace}/{c.name}"
    planner = planner_for(c.ops, c.namespace, c.spec)
    if isinstance(planner, str):
        return decision
    preemption = plan_preemption(me, c.spec, jobs, nodes, pods, now=c.now, planner=planner)
    if preemption is None:
        return decision
    for victim in preemption.victims:
        c.ops.preempt(victim, by=me)
    c.out.events.append(
        (
            "Normal",
            "Preempting",
            f"stopping lower-priority preemptible {', '.join(preemption.victims)} "
            "(checkpoint first) to start now",
        )
    )
    return preemption.decision


def _parallelism(degrees: Degrees) -> dict[str, Any]:
    out: dict[str, Any] = {
        "data": degrees.data,
        "tensor": degrees.tensor,
        "pipeline": degrees.pipeline,
    }
    if degrees.micro_batch_size is not None:
        out["microBatchSize"] = degrees.micro_batch_size
    return out


def _degrees_text(d: Degrees) -> str:
    text = f"data {d.data} x tensor {d.tensor} x pipeline {d.pipeline}"
    return text + (f", microbatch {d.micro_batch_size}" if d.micro_batch_size else "")


def merged_status(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The status patch: new fields over old, conditions merged by type."""
    if "conditions" in new:
        new = new | {"conditions": merge_conditions(old.get("conditions") or [], new["conditions"])}
    return new
