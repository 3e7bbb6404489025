"""One scheduling pass over every waiting TrainingJob (pure; KAI-Scheduler's `runOnce`).

Each job's start used to be decided in its own reconcile, against every job
ahead of it re-decided from scratch: N waiting jobs cost N^2 decisions a round
(issue 18, part 7). A pass decides them all at once, in the policy order of
`workloads.queueing.queue_key` (priority, then deadline, then age), on one
capacity that shrinks as it goes:

1. the cluster's capacity and every waiting job's start decision on it;
2. the quota step (`training_quota.admission_cycle`, one Kueue admission
   cycle): who waits for quota, who reclaims, and the GPU type quota admits;
3. in policy order, each job still in the running is decided on what the
   jobs before it left, then passes the start gates (`gates.START_GATES`);
   a start takes its GPUs from the capacity (`capacity.take`), so a job
   behind it starts only on what is left over (backfill by reservation: a
   job ahead that cannot start holds nothing back, and no GPU idles behind a
   blocked head).
4. a second round when quota admitted a job on a type whose GPUs the starts
   ahead of it took, and the job accepts other types (quota runs once, before
   the GPUs: Kueue reserves quota, then its pods wait): steps 1-3 again, on
   what is left, for those jobs, the other jobs quota admitted that did not
   start (they keep their reservations: they ask again, in the same order),
   and the jobs quota held back that those reservations may have held back
   (same cohort, a type they reserved). The first round's starts hold their
   GPUs and quota; reclaim and preemption are off (the round admits only
   quota nobody holds). A second round's starts replace those jobs' first
   verdicts; the rest keep theirs.

The pass also lists the running jobs whose lease the policy of their priority
band gives up (`SchedulingPass.stops`, `fleet.BandPlan.stops`): each one's
reconcile stops it from its checkpoint, as the simulator's lease round does.

The result is one `JobVerdict` per job; the controller enacts a job's verdict
in that job's reconcile (start its gang, or write why it waits, preempt or
reclaim), and computes a new pass only when something the pass did not itself
predict changes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypedDict

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.capacity import (
    NO_FACTS,
    Capacity,
    ClusterFacts,
    cluster_capacity,
    workers_binding,
)
from chronotope.workloads.fleet import yields_lease
from chronotope.workloads.gates import (
    START_GATES,
    BandView,
    Cycle,
    Decider,
    Gate,
    JointGate,
    frees_at,
    job_key,
    run_gates,
    take_start,
)
from chronotope.workloads.job_spec import job_spec_or_none
from chronotope.workloads.queueing import queue_key
from chronotope.workloads.quota import Admission, QueueQuota, Unit, Verdict
from chronotope.workloads.replan import remaining_work
from chronotope.workloads.training import Action, Decision
from chronotope.workloads.training_quota import (
    ENDED,
    HOLDING,
    QuotaView,
    ServingWait,
    admission_cycle,
    quota_wait,
    serving_workloads,
)
from chronotope.workloads.training_status import QUOTA_RESERVED, condition

__all__ = [
    "JOINT_PER_PASS",
    "LEASE_CHECKS",
    "NAMED_HOLDERS",
    "JobVerdict",
    "SchedulingPass",
    "schedule",
    "started_plan",
]

NAMED_HOLDERS = 3
"""Jobs ahead named in a queued job's reason at most (the rest are "...")."""

JOINT_PER_PASS = 16
"""Starts per pass that the joint CP-SAT gate arbitrates; later ones skip it (it is
advisory, and one CP-SAT solve per start would make a pass over thousands of jobs
quadratic in solver time). The fleet gate still runs for every start."""

ROUNDS = 2
"""Rounds of a pass at most (the module docstring's step 4)."""

_POLICY_ORDER = "policy order: priority, then deadline, then age"


@dataclass(frozen=True)
class JobVerdict:
    """What the pass decided for one job, and what its reconcile needs to enact it."""

    decision: Decision
    cycle: Cycle
    """The job's cycle as decided: the capacity left at its turn, its spec as quota narrowed it."""
    admission: Admission | None = None
    """The quota verdict (None when quotas are off or the job cannot run at all)."""
    held_by_quota: bool = False
    """Quota holds the job back (WAIT or RECLAIM): no priority preemption is tried."""
    quotas_on: bool = False
    """Some Queue exists: quota was asked (else every job runs free of quota)."""

    def quota_condition(self, now: datetime, generation: int | None) -> dict[str, Any]:
        """The job's `QuotaReserved` condition (Kueue's): whether its queue's quota admits it.

        True when quota admits its start (within nominal quota, or borrowing) or no
        Queue exists; False with the quota's reason while quota holds it back
        (`QuotaExceeded`, a missing Queue, reclaiming or preempting first,
        `WaitingForQuota` of a preferred type), or `Inadmissible` for a job that
        can never run here (quota is not asked).
        """
        admission, decision = self.admission, self.decision
        if not self.quotas_on:
            ok, reason, why = True, "QuotasOff", "no Queue exists: quotas are off"
        elif admission is None:
            ok, reason = False, "Inadmissible"
            why = "it can never run here, so its queue's quota is not asked"
        elif decision.cause == "WaitingForQuota" or self.held_by_quota:
            ok, reason, why = False, decision.cause or "QuotaExceeded", decision.reason
        else:
            ok, reason, why = True, "QuotaReserved", _quota_note(admission)
        return condition(QUOTA_RESERVED, ok, reason, why, now=now, generation=generation)


@dataclass(frozen=True)
class SchedulingPass:
    """The verdicts of one pass, by job key (`namespace/name`)."""

    now: datetime
    verdicts: Mapping[str, JobVerdict] = field(default_factory=dict)
    stops: Mapping[str, str] = field(default_factory=dict)
    """Running jobs whose lease the cluster policy gives up, and why (`fleet.BandPlan.stops`):
    each one's reconcile stops it from its checkpoint, to be decided again."""


def _waiting(job: Mapping[str, Any]) -> bool:
    meta = job.get("metadata") or {}
    phase = (job.get("status") or {}).get("phase")
    return not meta.get("deletionTimestamp") and phase not in (*HOLDING, *ENDED)


def _narrowed(spec: TrainingJobSpec, admission: Admission) -> TrainingJobSpec:
    if admission.demand is None:
        return spec
    gpu_type = admission.demand.gpu_type
    option = next((t for t in spec.gpu_types if t.name == gpu_type), None)
    if option is None:
        return spec
    return spec.model_copy(update={"gpu_types": [option]})


def _quota_note(admission: Admission) -> str:
    note = f"queue {admission.queue}"
    if admission.verdict is Verdict.BORROW:
        lent = ", ".join(
            f"{n} {pool[0]}" + (" GPU(s)" if pool[1] is Unit.GPUS else " share milli")
            for pool, n in admission.borrowed.items()
        )
        return f"{note} borrows {lent} in its cohort"
    return f"{note} admits it within its nominal quota"


def started_plan(d: Decision, now: datetime) -> dict[str, Any]:
    """The `status.plan` of a job that start decision `d` starts at `now`."""
    plan = {
        "gpuType": d.gpu_type,
        "workers": d.workers,
        "totalGpus": d.workers * d.gpus_per_worker,
        "startTime": now.isoformat(),
    }
    if d.finish is not None:
        plan["predictedCompletionTime"] = d.finish.isoformat()
    return plan


def _started(job: Mapping[str, Any], d: Decision, now: datetime) -> dict[str, Any]:
    """`job` as it will look once started: Starting on the decision's type (for later jobs)."""
    plan = started_plan(d, now)
    return {**job, "status": {**(job.get("status") or {}), "phase": "Starting", "plan": plan}}


def _queued_behind(
    spec: TrainingJobSpec, starts: Sequence[tuple[str, str, int]], fallback: Decision
) -> Decision:
    """WAIT naming the jobs ahead that this pass starts on a type `spec` accepts."""
    mine = {t.name for t in spec.gpu_types}
    holders = [f"{k} ({n} on {t})" for k, t, n in starts if t in mine]
    if not holders:
        return fallback
    shown = ", ".join(holders[:NAMED_HOLDERS]) + (" ..." if len(holders) > NAMED_HOLDERS else "")
    text = (
        f"queued behind {holders[0].split(' ')[0]} ({_POLICY_ORDER}): the jobs ahead "
        f"that start now take the GPUs it fits on: {shown}"
    )
    if fallback.action is Action.WAIT and fallback.gpu_type is not None:
        # a planned later start (on GPUs that free up): keep it, and say both
        return replace(fallback, reason=f"{text}; {fallback.reason}")
    return Decision(Action.WAIT, text)


def schedule(
    jobs: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    view: QuotaView,
    *,
    decider: Decider,
    now: datetime,
    include: Collection[str] = (),
    gates: Sequence[Gate] = START_GATES,
    capacity: Capacity | None = None,
    serving_waits: Sequence[ServingWait] = (),
    facts: ClusterFacts = NO_FACTS,
) -> SchedulingPass:
    """Decide every waiting job (and those in `include`) at `now`; see the module docstring.

    A job waits when it has no live gang and is neither started nor ended; a
    job whose spec the models reject is left out (it holds nothing back).
    `capacity` replaces the one read from `nodes` and `pods` (a test seam).
    `serving_waits`: the serving workloads quota holds back
    (`training_quota.waiting_serving`), which keep their place by age in the
    admission cycle. `facts`: what the cluster holds beyond its nodes and pods
    (`capacity.ClusterFacts`: claims' volumes, namespaces' labels).
    """
    read = None
    if capacity is None:
        capacity = read = cluster_capacity(nodes, pods, facts=facts)
    # the policy's wish, quota aside, once: the admission order of every round
    wish = _wish(BandView(capacity, list(jobs), {}, nodes, pods, read), decider, now, view)
    one_round = partial(
        _round,
        nodes=nodes,
        pods=pods,
        decider=decider,
        now=now,
        gates=gates,
        serving_waits=serving_waits,
        read=read,
        wished=wish["wished"],
    )
    run, verdicts = one_round(
        jobs, view, capacity, include=include, joint_left=JOINT_PER_PASS, leases=wish["leases"]
    )
    stops = _lease_stops(run)
    calm = view.without_preemption() if run.crowded else view
    for _ in range(ROUNDS - 1):
        if not run.crowded:
            break
        # quota reserved a type whose GPUs the jobs ahead took: decide those jobs again (with
        # the module docstring's others), this round's starts holding their GPUs and quota
        started = {k for k, v in verdicts.items() if v.decision.action is Action.START}
        jobs = [
            _started(j, verdicts[k].decision, now) if (k := job_key(j)) in started else j
            for j in jobs
        ]
        # the jobs quota admitted that did not start keep their reservations (they ask again,
        # in the same order), so only the crowded jobs' reservations are freed
        reserved = {
            k
            for k, v in verdicts.items()
            if k not in started
            and v.admission is not None
            and v.admission.verdict in (Verdict.ADMIT, Verdict.BORROW)
        }
        only = reserved | _held_by_reservations(view, verdicts, run.crowded)
        run, more = one_round(
            jobs, calm, run.left, include=include, joint_left=run.joint_left, only=only
        )
        verdicts.update({k: v for k, v in more.items() if v.decision.action is Action.START})
    return SchedulingPass(now, verdicts, stops)


def _lease_stops(run: _Pass) -> dict[str, str]:
    """The running jobs whose lease the policy of their priority band gives up, and why.

    The bands are planned on the capacity and jobs the round's start gates read
    (`Cycle.band_on`), so a band's plan is made once for both.
    """
    stops: dict[str, str] = {}
    for priority in sorted(set(run.may_yield.values())):
        plan, _ = run.decider.band_on(run.band_on, run.now, priority)
        stops.update(plan.stops)
    return stops


LEASE_CHECKS = 64
"""Leases within a queue the wish checks against the nodes per pass at most (`_wish`)."""


class _Wish(TypedDict):
    wished: dict[str, tuple[int, str]]
    leases: dict[str, tuple[str, ...]]


def _wish(view: BandView, decider: Decider, now: datetime, quota: QuotaView) -> _Wish:
    """The cluster policy's wish, quota aside, for the admission cycle.

    Each priority band planned over all its jobs on `view`'s GPUs counted per type
    (every job, every type it accepts), as the simulator's queues ask the policy
    before quota (`sim.training.queues.QuotaPolicy`): `wished`, job key -> its place
    and type (`fleet.BandPlan.wished`), which quota admits first, in this order and
    on that type first; `leases`, a waiting job the policy runs in place of running
    jobs (`BandPlan.yields`) -> running jobs of its own queue whose lease the policy
    gives up on that type (`BandPlan.giving`, its least preferred first, as many as
    hold the GPUs the policy found for it there), which it may stop (`quota.admit`,
    pass 6). The policy pairs takers and leases quota aside, often across queues,
    where quota cannot give them; the simulator's queues admit each queue's wished
    jobs before those the wish drops, whoever the policy paired: so does this. Not
    the lease of a job the wish moves to another type ahead of the taker (quota
    would admit that one first, and keep it where it runs when its queue has no
    room on the wished type, as the simulator's queues do: stopping it would only
    start it again); only where the taker's workers fit the nodes once they have
    stopped (`Decider.fits_without`), at most `LEASE_CHECKS` checks in the wish's
    order, and none while workers of ours wait to bind (each check would read the
    whole cluster then, `capacity.cluster_without`; their binds make a new pass).
    Nothing unless `quota` is on.
    """
    wished: dict[str, tuple[int, str]] = {}
    given: dict[str, tuple[str, ...]] = {}
    if not quota.on:
        return {"wished": wished, "leases": given}
    counted = BandView(view.capacity, view.jobs)
    offers: list[tuple[str, str, tuple[str, ...], int]] = []
    giving: dict[tuple[int, str], list[str]] = {}  # (band, type) -> the leases given up
    for priority in decider.priorities(counted):
        plan, _ = decider.band_on(counted, now, priority)
        for key, gpu_type in plan.wished.items():
            wished.setdefault(key, (len(wished), gpu_type))
        offers += [(key, t, victims, priority) for key, (t, victims) in plan.yields.items()]
        giving |= {(priority, t): list(vs) for t, vs in plan.giving.items()}
    if not offers or workers_binding(view.pods):
        # none, or a later pass gives them once the workers are bound (a check is cheap then)
        return {"wished": wished, "leases": given}
    queues = _queues_of(quota, view.jobs)
    gpus = _gpus_held(view.jobs)
    last = (len(wished), "")
    checks = LEASE_CHECKS
    for key, gpu_type, victims, band in sorted(offers, key=lambda o: wished.get(o[0], last)):
        if checks <= 0:
            break
        # its own queue's leases on the type, the policy's least preferred first, as many
        # as hold the GPUs the policy found for it there (those of the leases it paired
        # it with): not one the wish moves ahead of it (quota would admit that one
        # first, and keep it where it runs when its queue has no room on the wished type)
        pool = giving.get((band, gpu_type), [])
        own = _enough(
            [
                v
                for v in pool
                if key in queues
                and queues.get(v) == queues[key]
                and wished.get(v, last) > wished.get(key, last)
            ],
            gpus,
            sum(gpus.get(v, 0) for v in victims),
        )
        if not own:
            continue
        checks -= 1
        if decider.fits_without(view, now, key, gpu_type, own):
            given[key] = own
            pool[:] = [v for v in pool if v not in own]
    return {"wished": wished, "leases": given}


def _enough(pool: Sequence[str], gpus: Mapping[str, int], need: int) -> tuple[str, ...]:
    """The first jobs of `pool` whose GPUs add up to `need` (none when all of them fall short)."""
    out: list[str] = []
    for v in pool:
        if need <= 0:
            break
        out.append(v)
        need -= gpus.get(v, 0)
    return tuple(out) if need <= 0 else ()


def _gpus_held(jobs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Started job's key -> the GPUs its gang holds (`status.plan.totalGpus`)."""
    out = {}
    for job in jobs:
        status = job.get("status") or {}
        if status.get("phase") in HOLDING:
            out[job_key(job)] = int(float((status.get("plan") or {}).get("totalGpus") or 0))
    return out


def _queues_of(quota: QuotaView, jobs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Job key -> the Queue its LocalQueue names (jobs of a missing one are left out)."""
    out = {}
    for job in jobs:
        spec = job_spec_or_none(job)
        ns = str((job.get("metadata") or {}).get("namespace"))
        local = quota.local_queues.get((ns, spec.queue)) if spec is not None else None
        if local is not None:
            out[job_key(job)] = local.queue
    return out


def _may_yield(jobs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The started whole-GPU jobs whose lease the fleet policy may give up, with their priority."""
    out = {}
    for job in jobs:
        if (job.get("status") or {}).get("phase") not in HOLDING:
            continue
        spec = job_spec_or_none(job)
        if spec is not None and spec.gpu.shared is None and yields_lease(spec):
            out[job_key(job)] = spec.priority
    return out


def _held_by_reservations(
    view: QuotaView, verdicts: Mapping[str, JobVerdict], crowded: Collection[str]
) -> set[str]:
    """The jobs quota held back that the crowded jobs' reservations may have held back.

    Those of the same cohort (or queue, without one) that accept a type a crowded job
    reserved: no other quota is freed when the crowded jobs are decided again.
    """
    groups = {name: QueueQuota.from_spec(name, spec).group for name, spec in view.queues.items()}
    freed = set()
    for key in crowded:
        a = verdicts[key].admission
        if a is not None and a.queue in groups and a.demand is not None:
            freed.add((groups[a.queue], a.demand.gpu_type))
    out = set()
    for key, v in verdicts.items():
        a = v.admission
        if a is None or a.verdict is not Verdict.WAIT or a.queue not in groups:
            continue
        if any((groups[a.queue], t.name) in freed for t in v.cycle.spec.gpu_types):
            out.add(key)
    return out


def _round(
    jobs: Sequence[Mapping[str, Any]],
    view: QuotaView,
    capacity: Capacity,
    *,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    decider: Decider,
    now: datetime,
    include: Collection[str],
    gates: Sequence[Gate],
    joint_left: int,
    only: Collection[str] | None = None,
    serving_waits: Sequence[ServingWait] = (),
    read: Capacity | None = None,
    wished: Mapping[str, tuple[int, str]] | None = None,
    leases: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[_Pass, dict[str, JobVerdict]]:
    """One round of the pass: steps 1-3 of the module docstring on `capacity`.

    `only`: decide just these jobs (a later round), the others as they are. `read`:
    the capacity read from `nodes` and `pods` (None: given by the caller). `wished`
    and `leases`: the policy's wish for the admission cycle (`_wish`; a later round
    has no `leases`: it stops nobody).
    """
    frees = frees_at(jobs, "")
    order: list[tuple[Mapping[str, Any], TrainingJobSpec]] = []
    for job in sorted(jobs, key=queue_key):
        if not (_waiting(job) or job_key(job) in include):
            continue
        if only is not None and job_key(job) not in only:
            continue
        spec = job_spec_or_none(job)
        if spec is None or decider.has_gang(job):
            continue
        order.append((job, spec))
    first = {
        job_key(job): decider.decide(
            str(job["metadata"]["namespace"]),
            spec,
            capacity,
            now,
            frees_at=frees,
            remaining=remaining_work(job.get("status") or {}),
        )
        for job, spec in order
    }
    admissions: dict[str, Admission] = {}
    band_types: dict[str, frozenset[str]] = {}
    may_yield = _may_yield(jobs)
    if view.on:
        asking = {k: d for k, d in first.items() if d.action is not Action.IMPOSSIBLE}
        # what holds quota (started jobs; InferencePipeline and serving-group pods), and what
        # asks for it: a job that can never run here asks for nothing
        holding = [
            j
            for j in jobs
            if (j.get("status") or {}).get("phase") in HOLDING or job_key(j) in asking
        ]
        serving = serving_workloads(view, pods)
        quota = admission_cycle(
            view,
            holding,
            asking,
            now,
            serving=serving,
            moving=may_yield.keys(),
            serving_waits=serving_waits,
            wished=wished,
            leases=leases,
        )
        admissions = quota.admissions
        # the fleet policy's band gives a job only the types quota lets it run on: the
        # type quota admits a waiting job on, the types a running one may move to
        band_types = dict(quota.move_types)
        for k, a in admissions.items():
            if a.demand is not None and a.verdict in (Verdict.ADMIT, Verdict.BORROW):
                band_types[k] = frozenset({a.demand.gpu_type})
    held = {
        k
        for k, a in admissions.items()
        if k in first and a.verdict in (Verdict.WAIT, Verdict.RECLAIM)
    }
    # the competition the gates see: neither jobs that quota holds back nor jobs that can
    # never run here (a missing model profile, too few GPUs) contend for GPUs
    aside = held | {k for k, d in first.items() if d.action is Action.IMPOSSIBLE}
    others = [j for j in jobs if job_key(j) not in aside]
    run = _Pass(
        now=now,
        decider=decider,
        gates=gates,
        frees=dict(frees),
        capacity=capacity,
        left=capacity,
        others=others,
        band_on=BandView(capacity, list(others), band_types, nodes, pods, read),
        may_yield=may_yield,
        index={job_key(j): i for i, j in enumerate(others)},
        nodes=nodes,
        pods=pods,
        joint_left=joint_left,
    )
    verdicts: dict[str, JobVerdict] = {}
    for job, spec in order:
        key = job_key(job)
        verdict = run.verdict(job, spec, first[key], admissions.get(key), key in held)
        verdicts[key] = replace(verdict, quotas_on=view.on)
    return run, verdicts


@dataclass
class _Pass:
    """The state of a pass in progress: the capacity left, the starts so far."""

    now: datetime
    decider: Decider
    gates: Sequence[Gate]
    frees: dict[str, datetime]
    """When each GPU type frees up first: running jobs' predicted ends, and this pass's starts."""
    capacity: Capacity
    left: Capacity
    others: list[Mapping[str, Any]]
    band_on: BandView
    may_yield: dict[str, int]
    """The running jobs whose lease the policy may give up, with their priority."""
    index: dict[str, int]
    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    starts: list[tuple[str, str, int]] = field(default_factory=list)
    joint_left: int = JOINT_PER_PASS
    crowded: set[str] = field(default_factory=set)
    """Jobs quota admitted on a type whose GPUs the starts ahead took, that accept others."""

    def verdict(
        self,
        job: Mapping[str, Any],
        spec: TrainingJobSpec,
        first: Decision,
        admission: Admission | None,
        held: bool,
    ) -> JobVerdict:
        """Decide `job` on what is left (`first`: its decision on the whole capacity)."""
        ns = str(job["metadata"]["namespace"])
        remaining = remaining_work(job.get("status") or {})
        cycle = Cycle(
            job=job,
            spec=spec,
            now=self.now,
            capacity=self.left,
            jobs=self.others,
            decider=self.decider,
            remaining=remaining,
            nodes=self.nodes,
            pods=self.pods,
            band_on=self.band_on,
        )
        if first.action is Action.IMPOSSIBLE:
            return JobVerdict(first, cycle)
        if held:
            assert admission is not None
            return JobVerdict(quota_wait(admission), cycle, admission, held_by_quota=True)
        narrowed = spec if admission is None else _narrowed(spec, admission)
        decision = first
        if narrowed is not spec or self.left is not self.capacity:
            cycle = replace(cycle, spec=narrowed)
            decision = self.decider.decide(
                ns, narrowed, self.left, self.now, frees_at=self.frees, remaining=remaining
            )
        if decision.action is Action.START and admission is not None and admission.preferred:
            decision = self._later_on_preferred(
                ns, spec, narrowed, decision, admission, remaining=remaining
            )
        if decision.action is Action.START:
            if admission is not None and admission.demand is not None:
                decision = replace(decision, reason=f"{decision.reason}; {_quota_note(admission)}")
            use = self.gates
            if self.joint_left <= 0:
                use = [g for g in self.gates if not isinstance(g, JointGate)]
            self.joint_left -= any(isinstance(g, JointGate) for g in use)
            decision = run_gates(use, cycle, decision)
        elif first.action is Action.START:
            decision = _queued_behind(narrowed, self.starts, decision)
            if len(narrowed.gpu_types) < len(spec.gpu_types):
                self.crowded.add(job_key(job))
        if decision.action is Action.START and decision.gpu_type is not None:
            decision = self._take(job, spec, decision)
        return JobVerdict(decision, cycle, admission)

    def _later_on_preferred(
        self,
        ns: str,
        spec: TrainingJobSpec,
        narrowed: TrainingJobSpec,
        now_there: Decision,
        admission: Admission,
        *,
        remaining: float,
    ) -> Decision:
        """Start now where quota admits the job, or wait for its preferred type's quota.

        The plan-ahead on quota (TetriSched's choice, with the queue's forecast):
        `decide` weighs starting now on the admitted type against starting on
        the preferred type when its quota frees up (and its GPUs, if later); it
        waits only if that gives strictly more utility (a deadline it would miss).
        """
        assert admission.preferred is not None
        gpu_type, when, whose = admission.preferred
        option = next((t for t in spec.gpu_types if t.name == gpu_type), None)
        if option is None:
            return now_there
        both = spec.model_copy(update={"gpu_types": [*narrowed.gpu_types, option]})
        at = datetime.fromtimestamp(when, UTC)
        frees = {**self.frees, gpu_type: max(at, self.frees.get(gpu_type, at))}
        no_room_now = [  # its quota holds that type back now, whatever GPUs are free
            n if n.gpu_model != gpu_type else replace(n, free=0, free_gpus=()) for n in self.left
        ]
        choice = self.decider.decide(
            ns, both, no_room_now, self.now, frees_at=frees, remaining=remaining
        )
        if choice.action is not Action.WAIT or choice.gpu_type != gpu_type:
            return now_there
        return replace(
            choice,
            reason=f"{choice.reason}; its queue's {gpu_type} quota frees up "
            f"{at:%Y-%m-%d %H:%M} ({whose} ends)",
            cause="WaitingForQuota",
        )

    def _take(self, job: Mapping[str, Any], spec: TrainingJobSpec, d: Decision) -> Decision:
        """The start's GPUs leave the capacity; later jobs see the job as started.

        Returns the decision with its workers' nodes and GPUs, as the gang rule
        placed them on what was left (a joint plan's are kept), so its pods carry
        them and the extender puts the gang where this pass counted it.
        """
        gpu_type = d.gpu_type
        assert gpu_type is not None
        self.left, placements = take_start(self.left, spec, d)
        # where the gang rule placed it on what was left; none when some worker fit
        # nowhere (a plan's placements on GPUs taken since would double-book them)
        d = replace(d, placements=placements if len(placements) == d.workers else ())
        key = job_key(job)
        self.starts.append((key, gpu_type, d.workers * d.gpus_per_worker))
        if d.finish is not None:  # its GPUs free up when it is predicted to finish
            self.frees[gpu_type] = min(self.frees.get(gpu_type, d.finish), d.finish)
        if key in self.index:
            self.others[self.index[key]] = _started(job, d, self.now)
        return d
