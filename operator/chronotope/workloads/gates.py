"""The TrainingJob start gates, in the shape of kube-scheduler's plugins (pure).

`decide` says whether one job could start now and where, on the capacity a
scheduling pass (`workloads.training_pass`) has left when the job's turn comes.
Before the controller starts it, the gates of `START_GATES` run in order on
that decision, each able only to hold the start back (turn it into a WAIT
with a reason) or to move it to another GPU type:

- `FleetGate`: the cluster-wide training policy (the code `chronotope simulate
  training` runs) would not start it now, or would start it on another type;
- `JointGate`: the joint CP-SAT plan of the jobs that could start now gives
  the GPUs to others (and, when it starts this one, its nodes and GPUs).

An advisory gate that fails lets the decision through (a fault in an
optimisation must not stall the job); a required one raises. A waiting job
then gets the `preempt` step (kube-scheduler's PostFilter): the lower-priority
preemptible jobs whose stop lets it start now.

Every gate reads one `Cycle`: the job, the cluster's capacity, the other
jobs, and a `Decider` that decides other jobs on the same capacity once per
cycle. Nothing here talks to the API server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar, Protocol

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.planners.profile import ModelProfile
from chronotope.sharing.labels import GENERATION_ANNOTATION
from chronotope.workloads.capacity import Capacity, NodeCapacity, Placements, facts_of, take
from chronotope.workloads.fleet import (
    BandPlan,
    FleetJob,
    FleetOutcome,
    estimate_ratios,
    fleet_gate,
    gang_gpus,
    idle_gpus,
    plan_band,
)
from chronotope.workloads.gang import GENERATION_LABEL, JOB_LABEL
from chronotope.workloads.job_spec import job_spec_or_none
from chronotope.workloads.joint import Contender, arbitrate, options_for
from chronotope.workloads.node_fit import job_rules
from chronotope.workloads.preemption import Preemption, capacity_without, plan_preemption
from chronotope.workloads.profiled import ProfilePlanner
from chronotope.workloads.queueing import queue_key
from chronotope.workloads.replan import (
    completed_fraction,
    parse_time,
    progress,
    remaining_work,
)
from chronotope.workloads.training import Action, Decision, decide, least_workers

__all__ = [
    "CONTENDING",
    "MAX_CONTENDERS",
    "START_GATES",
    "BandView",
    "Cycle",
    "Decider",
    "FleetGate",
    "Gate",
    "JointGate",
    "frees_at",
    "job_key",
    "preempt",
    "run_gates",
]

log = logging.getLogger(__name__)

CONTENDING = (None, "", "Waiting", "Resizing")
"""Phases of a job that has not started (it contends for GPUs)."""

MAX_CONTENDERS = 8
"""Other jobs in one joint plan at most (queue heads, in queue order)."""

ProfileLookup = Callable[[str, str], "ModelProfile | str"]
"""(namespace, ConfigMap name) -> the model profile, or why it cannot be used."""

PodsOf = Callable[[str | None, str | None], list[dict[str, Any]]]
"""(namespace, label selector; None: all) -> the pods."""


def job_key(job: Mapping[str, Any]) -> str:
    """The job as `namespace/name`."""
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


_LiveJob = tuple[Mapping[str, Any], TrainingJobSpec]
"""A live whole-GPU job that waits or holds GPUs, with its spec (`Decider._contending`)."""


class Decider:
    """`decide` for any job, memoised on (job, capacity, time) for one cycle.

    One reconcile asks for the same other jobs' decisions in its queue, fleet and
    joint gates; for a job planned from a model profile each is a planner run.
    Make a new one per cycle: the memo holds the capacities it saw.
    """

    def __init__(self, profile: ProfileLookup, pods: PodsOf) -> None:
        """Read model profiles with `profile` and a job's pods with `pods`."""
        self._profile = profile
        self._pods = pods
        self._memo: dict[tuple[Any, ...], tuple[Capacity, Decision]] = {}
        self._bands: dict[tuple[Any, ...], tuple[BandView, BandPlan, frozenset[str]]] = {}
        self._checks: dict[tuple[Any, ...], _NodeCheck] = {}
        """Each band's node check, once planned: where its starts left the cluster."""
        self._views: dict[int, tuple[BandView, list[_LiveJob]]] = {}
        self._gangs: set[tuple[str, str, str]] | None = None

    def band(self, cycle: Cycle, priority: int) -> tuple[BandPlan, frozenset[str]]:
        """The fleet policy's plan for the band of `priority`, and the band's jobs; once a cycle.

        The band is every live whole-GPU job of that priority that waits (without
        workers yet) or holds GPUs, the job being decided included: each reconcile,
        and each job ahead in a queue, reads the same plan.
        """
        view = cycle.band_on or BandView(cycle.capacity, cycle.jobs)
        return self.band_on(view, cycle.now, priority, me=cycle.key)

    def band_on(
        self, view: BandView, now: datetime, priority: int, *, me: str = ""
    ) -> tuple[BandPlan, frozenset[str]]:
        """`band` on `view`, `me` being the job decided (counted as waiting)."""
        key = (priority, id(view), now)
        hit = self._bands.get(key)
        if hit is not None and hit[0] is view:  # held by the memo: its id is not reused
            return hit[1], hit[2]
        check = None
        if view.nodes:
            # the bands above are planned first, and this one on what their starts leave
            # (the pass starts higher priorities first)
            above = [p for p in self.priorities(view) if p > priority]
            after = None
            if above:
                self.band_on(view, now, min(above))
                after = self._checks.get((min(above), id(view), now))
            check = _NodeCheck(self, view, now, after=after)
        band: list[tuple[FleetJob, int]] = []
        for job, full in self._contending(view):
            if full.priority != priority:
                continue
            phase = (job.get("status") or {}).get("phase")
            if phase in CONTENDING and job_key(job) != me and self.has_gang(job):
                continue  # started a moment ago: its GPUs already count as taken
            spec = full
            allowed = view.types.get(job_key(job))
            if allowed is not None:
                options = [t for t in spec.gpu_types if t.name in allowed]
                if not options:
                    continue
                spec = spec.model_copy(update={"gpu_types": options})
            f = _fleet_job(job, spec, now)
            band.append((f, f.running_gpus or gang_gpus(spec)))
        plan = plan_band(
            band,
            view.capacity if check is None else check.left,
            now,
            estimate_ratios(view.jobs),
            fits=None if check is None else check.fits,
            took=None if check is None else check.took,
        )
        members = frozenset(f.key for f, _ in band if f.running_on is None)
        self._bands[key] = (view, plan, members)
        if check is not None:
            self._checks[key] = check
        return plan, members

    def _contending(self, view: BandView) -> list[_LiveJob]:
        """`view`'s live whole-GPU jobs that wait or hold GPUs, with their specs; once a view."""
        hit = self._views.get(id(view))
        if hit is not None and hit[0] is view:
            return hit[1]
        out = []
        for job in view.jobs:
            meta = job.get("metadata") or {}
            phase = (job.get("status") or {}).get("phase")
            if meta.get("deletionTimestamp") or phase not in (*CONTENDING, "Running", "Starting"):
                continue
            spec = job_spec_or_none(job)
            if spec is not None and spec.gpu.shared is None:
                out.append((job, spec))
        self._views[id(view)] = (view, out)
        return out

    def fits_without(
        self, view: BandView, now: datetime, key: str, gpu_type: str, leaving: Sequence[str]
    ) -> bool:
        """Whether job `key` of `view` fits `gpu_type`'s nodes once the jobs `leaving` stop.

        The check the band makes of a lease (`_NodeCheck.fits`), for one job alone: True
        without nodes to check (a capacity given by hand: a band checks nothing then
        either), False for a job `view` does not know.
        """
        if not view.nodes:
            return True
        wanted = {key, *leaving}
        fleet = {
            k: _fleet_job(j, spec, now)
            for j, spec in self._contending(view)
            if (k := job_key(j)) in wanted
        }
        if len(fleet) < len(wanted):
            return False
        gone = tuple(fleet[v] for v in leaving)
        return _NodeCheck(self, view, now).fits(fleet[key], gpu_type, gone)

    def priorities(self, view: BandView) -> set[int]:
        """The priorities of `view`'s bands."""
        return {spec.priority for _, spec in self._contending(view)}

    def planner(self, namespace: str, spec: TrainingJobSpec) -> ProfilePlanner | str | None:
        """The job's profile planner; None without a model profile; why, when it is unusable."""
        name = spec.parallelism.model_profile if spec.parallelism is not None else None
        if name is None:
            return None
        profile = self._profile(namespace, name)
        if isinstance(profile, str):
            return profile
        return ProfilePlanner(profile, name, spec)

    def decide(
        self,
        namespace: str,
        spec: TrainingJobSpec,
        capacity: Capacity,
        now: datetime,
        *,
        frees_at: Mapping[str, datetime] | None = None,
        remaining: float = 1.0,
    ) -> Decision:
        """`workloads.training.decide` for the job, with its profile planner when it names one.

        Memoised unless `frees_at` is given; a missing or unusable profile makes the
        job IMPOSSIBLE with the reason.
        """
        key = None
        if frees_at is None:
            key = (namespace, spec.model_dump_json(), id(capacity), now, remaining)
            hit = self._memo.get(key)
            if hit is not None and hit[0] is capacity:  # held by the memo: its id is not reused
                return hit[1]
        planner = self.planner(namespace, spec)
        if isinstance(planner, str):
            cause = "ProfileMissing" if "not found" in planner else "ProfileUnusable"
            decision = Decision(Action.IMPOSSIBLE, planner, cause=cause)
        else:
            decision = decide(spec, capacity, now, frees_at, planner=planner, remaining=remaining)
        if key is not None:
            self._memo[key] = (capacity, decision)
        return decision

    def has_gang(self, job: Mapping[str, Any]) -> bool:
        """The job has live workers of its current gang (it started, whatever its status says).

        The pods are read once a cycle (`live_gangs`): a pass asks this of every job.
        """
        meta = job.get("metadata") or {}
        gen = str((meta.get("annotations") or {}).get(GENERATION_ANNOTATION, "0"))
        if self._gangs is None:
            self._gangs = live_gangs(self._pods(None, None))
        return (str(meta.get("namespace")), str(meta.get("name")), gen) in self._gangs


class _NodeCheck:
    """`fleet.Fits` and `fleet.Took` on a band's cluster, for one plan.

    A job fits a type when `decide` starts it on that type alone: on the band's
    capacity less the plan's starts so far (each placed as the pass's gang rule
    would, `take_start`), or, when running jobs leave, on the cluster without their
    pods (`preemption.capacity_without`) less the same starts.
    """

    def __init__(
        self, decider: Decider, view: BandView, now: datetime, *, after: _NodeCheck | None = None
    ) -> None:
        """Check on `view`'s cluster, less the starts of the band planned before (`after`)."""
        self._decider, self._view, self._now = decider, view, now
        self._left = view.capacity if after is None else after.left
        self._started: list[tuple[TrainingJobSpec, Decision]] = (
            [] if after is None else list(after._started)
        )
        self._last: dict[tuple[str, str], tuple[Capacity, TrainingJobSpec, Decision]] = {}

    def _there(
        self, job: FleetJob, gpu_type: str, capacity: Capacity
    ) -> tuple[TrainingJobSpec, Decision]:
        """The job's spec on `gpu_type` alone, and `decide` on `capacity` for it."""
        hit = self._last.get((job.key, gpu_type))
        if hit is not None and hit[0] is capacity:  # `took` right after `fits`
            return hit[1], hit[2]
        only = job.spec.model_copy(
            update={"gpu_types": [t for t in job.spec.gpu_types if t.name == gpu_type]}
        )
        d = self._decider.decide(job.key.split("/", 1)[0], only, capacity, self._now)
        self._last[job.key, gpu_type] = (capacity, only, d)
        return only, d

    @property
    def left(self) -> Capacity:
        """The cluster less the starts placed so far."""
        return self._left

    def fits(self, job: FleetJob, gpu_type: str, victims: tuple[FleetJob, ...]) -> bool:
        """Whether the job's workers fit `gpu_type` now, once `victims` have stopped."""
        capacity = self._left
        if victims:
            view = self._view
            gone = {v.key for v in victims}
            facts = facts_of(view.capacity)
            capacity = capacity_without(
                gone, nodes=view.nodes, pods=view.pods, facts=facts, read=view.read
            )
            for spec, d in self._started:
                capacity = take_start(capacity, spec, d)[0]
        return self._there(job, gpu_type, capacity)[1].action is Action.START

    def took(self, job: FleetJob, gpu_type: str) -> Placements | None:
        """Place the job's workers on `gpu_type` beside the starts before it, if they fit.

        The gang is the one `fits` decided (the last decision for the job on that type),
        placed as the pass's gang rule places it (`take_start`): no `decide` again.
        """
        hit = self._last.get((job.key, gpu_type))
        spec, d = (hit[1], hit[2]) if hit is not None else self._there(job, gpu_type, self._left)
        if d.action is not Action.START:
            return None
        left, placements = take_start(self._left, spec, d)
        if len(placements) != d.workers:
            return None
        self._left = left
        if any(len(gpus) != d.gpus_per_worker for _, gpus in placements):
            placements = ()  # the nodes' GPU indices are not known: nothing to carry
        self._started.append((spec, replace(d, placements=placements)))
        return placements


def take_start(
    capacity: Capacity, spec: TrainingJobSpec, d: Decision
) -> tuple[tuple[NodeCapacity, ...], Placements]:
    """`capacity` once the job of `spec` starts as `d` says, and where its workers go.

    Its gang is placed by the extender's rule (`capacity.take`, with the job's node
    rules, strategy and topology); a joint plan's placements are kept.
    """
    assert d.gpu_type is not None
    return take(
        capacity,
        d.gpu_type,
        d.workers,
        d.gpus_per_worker,
        strategy=spec.placement.strategy,
        placements=d.placements,
        rules=job_rules(spec),
        topology=spec.placement.topology,
        required=spec.placement.required,
    )


def live_gangs(pods: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """(namespace, job, gang generation) of every TrainingJob worker pod not being deleted."""
    out = set()
    for p in pods:
        meta = p.get("metadata") or {}
        labels = meta.get("labels") or {}
        job = labels.get(JOB_LABEL)
        if job is None or meta.get("deletionTimestamp"):
            continue
        out.add((str(meta.get("namespace")), str(job), str(labels.get(GENERATION_LABEL))))
    return out


@dataclass(frozen=True, eq=False)
class BandView:
    """What a priority band's plan reads: the capacity, the jobs, and the types quota allows."""

    capacity: Capacity
    jobs: Sequence[Mapping[str, Any]]
    types: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Job key -> the GPU types the band may give it, where its queue's quota narrows them
    (a waiting job: the type quota admits it on; a running job: its own, and those its
    queue has room for once it gives its own up); a job not named: every type it accepts;
    a job named with no type it accepts is left out of the band (a running one keeps
    what it holds, and the band does not count its GPUs)."""
    nodes: Sequence[Mapping[str, Any]] = ()
    pods: Sequence[Mapping[str, Any]] = ()
    """The cluster `capacity` was read from: with them, a lease the policy would give up
    for a waiting job is given up only if its workers fit once it has stopped."""
    read: Capacity | None = None
    """`cluster_capacity` of `nodes` and `pods`, when known: a check with jobs leaving
    then reads again only their nodes (`capacity.cluster_without`)."""


@dataclass(frozen=True)
class Cycle:
    """What one start decision reads: the job, the cluster and the other jobs."""

    job: Mapping[str, Any]
    spec: TrainingJobSpec
    now: datetime
    capacity: Capacity
    jobs: Sequence[Mapping[str, Any]]
    decider: Decider
    remaining: float = 1.0
    """Share of the job's work still to do (1.0 for a fresh job)."""
    nodes: Sequence[Mapping[str, Any]] = field(default=())
    pods: Sequence[Mapping[str, Any]] = field(default=())
    band_on: BandView | None = None
    """What the fleet policy's band plan reads, when not this cycle's capacity and jobs
    (a scheduling pass plans each band once, on the capacity it started from)."""

    @property
    def key(self) -> str:
        """The job as `namespace/name`."""
        return job_key(self.job)

    @property
    def namespace(self) -> str:
        """The job's namespace."""
        return str(self.job["metadata"]["namespace"])

    def start_options(
        self, namespace: str, spec: TrainingJobSpec, best: Decision, remaining: float
    ) -> tuple[Decision, ...]:
        """`best` plus the start decision on each other GPU type, at `best`'s gang size."""
        per_type = [best]
        for option in spec.gpu_types:
            if option.name == best.gpu_type:
                continue
            only = spec.model_copy(update={"gpu_types": [option]})
            per_type.append(
                self.decider.decide(namespace, only, self.capacity, self.now, remaining=remaining)
            )
        return options_for(per_type)

    def whole_gpu_jobs(
        self, jobs: Sequence[Mapping[str, Any]], phases: tuple[str | None, ...]
    ) -> Iterator[tuple[Mapping[str, Any], TrainingJobSpec]]:
        """The other live whole-GPU jobs in `phases`, in the given order, with their specs.

        A job still "waiting" in our view that already has workers started a moment
        ago (its status is not in the view yet) is left out: its GPUs already count
        as taken.
        """
        me = self.key
        for job in jobs:
            meta = job.get("metadata") or {}
            phase = (job.get("status") or {}).get("phase")
            if job_key(job) == me or meta.get("deletionTimestamp") or phase not in phases:
                continue
            spec = job_spec_or_none(job)
            if spec is None:
                continue
            if spec.gpu.shared is not None or (phase in CONTENDING and self.decider.has_gang(job)):
                continue
            yield job, spec


class Gate(Protocol):
    """One start gate: holds a START back (WAIT with a reason) or moves it to another type."""

    name: ClassVar[str]
    advisory: ClassVar[bool]
    """A fault in an advisory gate lets the decision through; a required gate raises."""

    def __call__(self, cycle: Cycle, decision: Decision) -> Decision:
        """`decision` (a START) as this gate lets it through, moves it, or holds it back."""
        ...


def _fleet_job(job: Mapping[str, Any], spec: TrainingJobSpec, now: datetime) -> FleetJob:
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    plan = status.get("plan") or {}
    running = status.get("phase") in ("Running", "Starting") and plan.get("gpuType")
    return FleetJob(
        key=job_key(job),
        spec=spec,
        arrival=parse_time(meta.get("creationTimestamp")) or now,
        done=completed_fraction(status, now),
        progress=progress(status, now),
        running_on=str(plan["gpuType"]) if running else None,
        running_gpus=int(float(plan.get("totalGpus") or 0)) if running else 0,
        order=queue_key(job),
    )


def fleet_verdict(
    cycle: Cycle,
    job: Mapping[str, Any],
    spec: TrainingJobSpec,
    decision: Decision,
    remaining: float,
) -> Decision:
    """`decision` for `job` (a start) as held back or moved by `workloads.fleet`.

    `workloads.fleet` runs the same code as `chronotope simulate training`'s policy.
    """
    if spec.gpu.shared is not None:
        return decision
    namespace = str((job.get("metadata") or {}).get("namespace"))
    view = replace(cycle, job=job, spec=spec)
    me = job_key(job)
    plain = spec.parallelism is None or spec.parallelism.model_profile is None
    band, members = cycle.decider.band(cycle, spec.priority)
    if plain and me in members and decision.workers * decision.gpus_per_worker == gang_gpus(spec):
        # the band's plan, made once a cycle, is this job's own fleet verdict
        if not any(k != me for k in band.keys):
            return decision
        outcome = band.outcome(me)
        return _enact(
            cycle,
            namespace=namespace,
            spec=spec,
            decision=decision,
            remaining=remaining,
            outcome=outcome,
        )
    others = [
        _fleet_job(other, other_spec, cycle.now)
        for other, other_spec in view.whole_gpu_jobs(
            cycle.jobs, (*CONTENDING, "Running", "Starting")
        )
        if other_spec.priority == spec.priority
    ]
    if not others:
        return decision
    mine = replace(
        _fleet_job(job, spec, cycle.now), done=1.0 - remaining, progress=None, running_on=None
    )
    if spec.parallelism is not None and spec.parallelism.model_profile is not None:
        # the profile, not relativeSpeed, says how fast each type is: speed = work / run time
        options = cycle.start_options(namespace, spec, decision, remaining)
        work = spec.estimate.duration_seconds * remaining
        mine = replace(
            mine,
            speeds={
                str(d.gpu_type): work / max(1.0, (d.finish - cycle.now).total_seconds())
                for d in options
                if d.finish is not None
            },
        )
    outcome = fleet_gate(
        replace(mine, running_gpus=0),
        decision.workers * decision.gpus_per_worker,
        others,
        cycle.capacity,
        cycle.now,
        errors=estimate_ratios(cycle.jobs),
    )
    return _enact(
        cycle,
        namespace=namespace,
        spec=spec,
        decision=decision,
        remaining=remaining,
        outcome=outcome,
    )


def _enact(
    cycle: Cycle,
    *,
    namespace: str,
    spec: TrainingJobSpec,
    decision: Decision,
    remaining: float,
    outcome: FleetOutcome,
) -> Decision:
    """`decision` held back, kept or moved to the type the fleet `outcome` names."""
    if not outcome.starts:
        return Decision(Action.WAIT, outcome.reason)
    if outcome.gpu_type is None:
        return decision
    if outcome.gpu_type != decision.gpu_type:
        option = next((t for t in spec.gpu_types if t.name == outcome.gpu_type), None)
        if option is None:  # quota admits the job on the decision's type only: start there
            return replace(
                decision,
                reason=f"{decision.reason} (the fleet policy would pick {outcome.gpu_type}, "
                "which its queue's quota does not admit now)",
            )
        only = spec.model_copy(update={"gpu_types": [option]})
        there = cycle.decider.decide(
            namespace, only, cycle.capacity, cycle.now, remaining=remaining
        )
        if there.action is not Action.START:
            uncounted = _uncounted(cycle.capacity, only, there)
            if uncounted:
                # the policy counts the type's free GPUs on every node as one pool, and this
                # job's workers do not fit them so (nodes too small or fragmented, node
                # rules, CPU, a required domain): start where decide put them rather than
                # wait for nothing (decide weighed waiting for that type already)
                return replace(
                    decision,
                    reason=f"{decision.reason} (the fleet policy would pick "
                    f"{outcome.gpu_type}, {uncounted})",
                )
            return Decision(
                Action.WAIT, f"{outcome.reason}, but {outcome.gpu_type} has no room yet"
            )
        decision = there
    if len(outcome.placements) == decision.workers and not decision.placements:
        # where the plan's node check put its workers, beside the plan's other starts
        decision = replace(decision, placements=outcome.placements)
    return replace(decision, reason=f"{decision.reason}; {outcome.reason}")


def _uncounted(capacity: Capacity, only: TrainingJobSpec, there: Decision) -> str:
    """Why the fleet policy's type has room for `only` by its count, not by `there`.

    `only`: the job on the one type the fleet policy picked (it starts a job only where
    that type's free GPUs, counted as one pool, hold its gang); `there`: `decide`'s
    answer on it, no start. '' when the free GPUs do not hold the gang even as one pool
    (the capacity moved since the policy's plan was made).
    """
    free = idle_gpus(capacity).get(only.gpu_types[0].name, 0)
    if free < least_workers(only) * (only.gpu.count or 1):
        return ""
    why = there.reason.removeprefix("waiting for GPUs: ")
    return f"counting its {free} free GPUs as one pool, where its workers do not fit now: {why}"


class FleetGate:
    """Among jobs of this job's priority, start it only where the training policy would."""

    name: ClassVar[str] = "fleet"
    advisory: ClassVar[bool] = True

    def __call__(self, cycle: Cycle, decision: Decision) -> Decision:
        """The decision as held back or moved by the fleet policy (`fleet_verdict`)."""
        return fleet_verdict(cycle, cycle.job, cycle.spec, decision, cycle.remaining)


class JointGate:
    """Start only if the joint CP-SAT plan of the jobs that could start now starts this one.

    The contenders are the heads of the other queues: in each queue, the first
    job (policy order) wanting an overlapping GPU type that could start now and
    that the fleet policy would start; jobs behind this one in its own queue
    come after it in the scheduling pass anyway. When the plan starts this job, its nodes
    and GPUs go on the decision (the extender honours them).
    """

    name: ClassVar[str] = "joint"
    advisory: ClassVar[bool] = True

    def __call__(self, cycle: Cycle, decision: Decision) -> Decision:
        """WAIT or START on the chosen type and GPUs, as the joint plan with the queue heads says.

        A shared-GPU job passes unchanged, and so does one with no contenders.
        """
        if cycle.spec.gpu.shared is not None:
            return decision
        mine_types = {t.name for t in cycle.spec.gpu_types}
        served = {cycle.spec.queue}
        contenders = []
        for job, spec in cycle.whole_gpu_jobs(sorted(cycle.jobs, key=queue_key), CONTENDING):
            if spec.queue in served or not {t.name for t in spec.gpu_types} & mine_types:
                continue
            ns = str(job["metadata"].get("namespace"))
            left = remaining_work(job.get("status") or {})
            best = cycle.decider.decide(ns, spec, cycle.capacity, cycle.now, remaining=left)
            if best.action is Action.START:
                best = fleet_verdict(cycle, job, spec, best, left)
            if best.action is not Action.START:
                continue  # cannot start, or the fleet policy holds it: it contends for nothing
            served.add(spec.queue)
            options = cycle.start_options(ns, spec, best, left)
            contenders.append(Contender(job_key(job), spec, options))
            if len(contenders) >= MAX_CONTENDERS:
                break
        if not contenders:
            return decision
        me = cycle.key
        mine = Contender(
            me,
            cycle.spec,
            cycle.start_options(cycle.namespace, cycle.spec, decision, cycle.remaining),
        )
        outcome = arbitrate(me, [mine, *contenders], cycle.capacity, cycle.now)
        if not outcome.starts:
            return Decision(Action.WAIT, outcome.reason)
        chosen = next((d for d in mine.options if d.gpu_type == outcome.gpu_type), decision)
        return replace(
            chosen, reason=f"{chosen.reason}; {outcome.reason}", placements=outcome.placements
        )


START_GATES: tuple[Gate, ...] = (FleetGate(), JointGate())
"""The gates a START passes, in order."""


def run_gates(gates: Sequence[Gate], cycle: Cycle, decision: Decision) -> Decision:
    """Run `gates` in order while the decision is still a START."""
    for gate in gates:
        if decision.action is not Action.START:
            break
        try:
            decision = gate(cycle, decision)
        except Exception:
            if not gate.advisory:
                raise
            log.exception("gate %s failed for %s; deciding without it", gate.name, cycle.key)
    return decision


def preempt(cycle: Cycle, decision: Decision) -> Preemption | None:
    """The PostFilter step for a WAIT: the jobs to stop so that this one starts now.

    The victims are lower-priority preemptible jobs (`workloads.preemption`);
    None when no such set lets the job start, or its profile is unusable.
    """
    planner = cycle.decider.planner(cycle.namespace, cycle.spec)
    if isinstance(planner, str):
        return None
    view = cycle.band_on
    same = view is not None and view.nodes is cycle.nodes and view.pods is cycle.pods
    return plan_preemption(
        cycle.key,
        cycle.spec,
        cycle.jobs,
        cycle.nodes,
        cycle.pods,
        now=cycle.now,
        planner=planner,
        facts=facts_of(cycle.capacity),
        read=view.read if same and view is not None else None,
    )


def frees_at(jobs: Sequence[Mapping[str, Any]], me: str) -> dict[str, datetime]:
    """Earliest predicted completion per GPU type among running jobs (when a type frees up)."""
    out: dict[str, datetime] = {}
    for job in jobs:
        if job_key(job) == me:
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
