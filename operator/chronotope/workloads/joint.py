"""Joint planning of the TrainingJobs that could start now (TetriSched, with CP-SAT; pure).

`decide` plans one job at a time. When several waiting jobs could each start
now but compete for the same GPUs, whoever is reconciled first would win.
Instead, the contenders become solver workloads (`solver.batch`): each offers
an alternative per GPU type it can start on now (same gang size; duration
and utility for that type) plus later start slots, and CP-SAT picks the set
that maximises total utility (priority-weighted, zero past a deadline),
placing gangs all-or-nothing on concrete nodes. A job starts now only when
the joint plan starts it now, on the type the plan chose; otherwise it waits
with the plan's reason. The plan is deterministic (fixed seed, one worker),
so every contender's reconcile reaches the same answer.

Whole GPUs only: shared-GPU jobs are left to `decide` (the extender packs
them). Each node offers its untouched GPUs (by index) and the CPU and memory
its bound pods leave; each worker asks for its template's CPU and memory, and
may go only on the nodes its template's node rules admit (`node_fit`, through
`capacity.admitting`: the solver's `PodRequest.nodes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from chronotope.api.v1alpha1.trainingjob import TopologyLevel, TrainingJobSpec, UtilityFunction
from chronotope.solver.batch import BatchSettings, plan
from chronotope.solver.model import (
    MILLI,
    Alternative,
    ClusterSnapshot,
    Gpu,
    Node,
    PodRequest,
    Workload,
)
from chronotope.solver.slots import domain_of
from chronotope.workloads.capacity import Capacity, Placements, admitting, in_cluster, unblocked
from chronotope.workloads.node_fit import job_rules
from chronotope.workloads.training import Action, Decision, required_topology

__all__ = ["Contender", "JointOutcome", "arbitrate"]

SPEED_BONUS = 0.1
"""Share of a job's utility added for running on its fastest type (scaled by speed)."""


@dataclass(frozen=True)
class Contender:
    """A waiting job that could start now, with its start alternative per GPU type."""

    key: str
    """namespace/name"""
    spec: TrainingJobSpec
    options: tuple[Decision, ...]
    """START decisions, one per GPU type, all with the same number of workers."""


@dataclass(frozen=True)
class JointOutcome:
    """The joint plan's answer for one job: whether it starts now, on which type, and why."""

    starts: bool
    gpu_type: str | None
    reason: str
    placements: Placements = ()
    """Per member, in member order: the plan's node and GPUs (when it starts now)."""


def _snapshot(capacity: Capacity) -> ClusterSnapshot:
    nodes = []
    for n in sorted(capacity, key=lambda n: n.name):
        free = set(n.free_gpus or range(n.free)) if n.schedulable else set()
        gpus = tuple(
            Gpu(
                index=i,
                model=n.gpu_model,
                memory_mib=n.memory_mib,
                free_milli=MILLI if i in free else 0,
            )
            for i in range(n.total)
        )
        nodes.append(
            Node(
                name=n.name,
                cpu_milli=n.cpu_free_milli,
                memory_mib=n.memory_free_mib,
                gpus=gpus,
                # each domain as `solver.slots.domain_of` names it (a node without the
                # label is a domain of its own), so a required topology means the same here
                zone=domain_of(n.name, n.labels, TopologyLevel.ZONE) or "",
                rack=domain_of(n.name, n.labels, TopologyLevel.RACK) or "",
                nvlink_domain=domain_of(n.name, n.labels, TopologyLevel.NVLINK_DOMAIN) or "",
            )
        )
    return ClusterSnapshot(nodes=tuple(nodes), time_s=0.0)


_SAME = {
    TopologyLevel.ANY: "",
    TopologyLevel.NODE: "name",
    TopologyLevel.NVLINK_DOMAIN: "nvlink_domain",
    TopologyLevel.RACK: "rack",
    TopologyLevel.ZONE: "zone",
}
"""The snapshot node's attribute all of a gang's nodes share, per required topology."""


def _deadline_s(spec: TrainingJobSpec, now: datetime) -> float | None:
    utility = spec.utility
    if utility is None or utility.function is UtilityFunction.CONSTANT:
        return None
    assert utility.deadline is not None
    return (utility.deadline - now).total_seconds()


def _allowed_nodes(c: Contender, capacity: Capacity) -> frozenset[str] | None:
    """The nodes of its options' types the job's workers may use now; None: every one of them.

    Not those its node rules refuse, nor those where a pod holds a host port its
    workers ask or a pod anti-affinity keeps them off (the snapshot models CPU and
    memory itself, not ports or pods).
    """
    rules, per_worker = job_rules(c.spec), c.options[0].gpus_per_worker
    types = [str(d.gpu_type) for d in c.options]
    seen = [admitting(capacity, t, rules, per_worker) for t in types]
    if not any(s.refused or s.blocked or s.shunned for s in seen):
        return None
    return frozenset(
        name
        for t, s in zip(types, seen, strict=True)
        for name in unblocked(capacity, t, rules, s.nodes, per_worker)
    )


def _workload(c: Contender, now: datetime, capacity: Capacity) -> Workload:
    first = c.options[0]
    per_worker = first.gpus_per_worker
    durations = [max(1.0, (d.finish - now).total_seconds()) if d.finish else 1.0 for d in c.options]
    fastest = min(durations)
    alternatives = tuple(
        Alternative(
            gpu_model=str(d.gpu_type),
            duration_s=duration,
            # equal utilities (no deadline): the faster type is worth a little more
            utility=max(d.utility or 0.0, 1e-3) * (1 + SPEED_BONUS * fastest / duration),
        )
        for d, duration in zip(c.options, durations, strict=True)
    )
    # a worker's CPU and memory as kube-scheduler counts them (its RuntimeClass's overhead
    # too; a bad request counts none: the extender reports it when a worker is scheduled)
    rules = in_cluster(capacity, job_rules(c.spec))
    return Workload(
        name=c.key,
        pod=PodRequest(
            name=c.key,
            cpu_milli=rules.cpu_milli,
            memory_mib=rules.memory_mib,
            num_gpus=per_worker,
            gpu_milli=MILLI,
            gpu_models=tuple(a.gpu_model for a in alternatives),
            nodes=_allowed_nodes(c, capacity),
        ),
        replicas=first.workers,
        alternatives=alternatives,
        deadline_s=_deadline_s(c.spec, now),
        strategy=c.spec.placement.strategy,
        same_topology=_SAME[required_topology(c.spec)],
        priority=c.spec.priority,
    )


def arbitrate(
    me: str,
    contenders: Sequence[Contender],
    capacity: Capacity,
    now: datetime,
    *,
    time_limit_s: float = 1.0,
) -> JointOutcome:
    """Whether `me` (one of `contenders`) starts now under the joint plan, and on which type."""
    ordered = sorted(contenders, key=lambda c: c.key)
    workloads = [_workload(c, now, capacity) for c in ordered]
    # a proven optimum: with priority weights spanning orders of magnitude, a 2 % gap
    # would leave low-priority jobs' choices (e.g. their faster GPU type) to chance
    settings = BatchSettings(time_limit_s=time_limit_s, seed=0, workers=1, gap_limit=0.0)
    joint = plan(_snapshot(capacity), workloads, settings)
    starting = sorted(joint.chosen)
    others = [k for k in starting if k != me]
    if me in joint.chosen:
        with_whom = f" beside {', '.join(others)}" if others else ""
        members = {p.pod: (p.node, p.gpu_indices) for p in joint.placements}
        mine = next(w for w in workloads if w.name == me).member_names()
        placed = tuple(members[m] for m in mine if m in members)
        return JointOutcome(
            True,
            joint.chosen[me],
            f"joint plan over {len(ordered)} job(s) that could start (CP-SAT, {joint.status}) "
            f"starts it now on {joint.chosen[me]}{with_whom}",
            placed if len(placed) == len(mine) else (),
        )
    later = next((d for d in joint.deferred if d.workload == me), None)
    unplaced = next((u for u in joint.unplaced if u.name == me), None)
    if later is not None:
        what = f"planned to start on {later.gpu_model} in about {later.start_s / 60:.0f} min"
    elif unplaced is not None:
        what = unplaced.summary()
    else:
        what = "not started now"
    who = ", ".join(others) if others else "no other job"
    return JointOutcome(
        False,
        None,
        f"joint plan over {len(ordered)} job(s) that could start now (CP-SAT, {joint.status}, "
        f"total utility {joint.utility:.2f}) gives the GPUs to {who}; this job: {what}",
    )


def options_for(decisions: Sequence[Decision]) -> tuple[Decision, ...]:
    """START decisions of one size (the most common one first chosen), for a `Contender`."""
    starts = [d for d in decisions if d.action is Action.START and d.gpu_type]
    if not starts:
        return ()
    size = starts[0].workers
    return tuple(d for d in starts if d.workers == size)
