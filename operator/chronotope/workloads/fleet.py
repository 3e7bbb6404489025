"""The cluster-wide training policy in the operator: the simulator's `chronotope` policy (pure).

`chronotope simulate training` measures `workloads.training_policy`
(deadline-urgent jobs first, then shortest remaining GPU-time; a plan ahead
per GPU type, so a job may wait for a faster type; idle GPUs backfilled).
The operator runs the same code: the TrainingJobs of one priority band (the
one being decided and the others waiting or running at that priority)
become the simulator's jobs, and a job starts only when that policy would
give it GPUs now, on the type it chose. Priorities, queues and preemption
stay with the controller; this gate orders jobs of equal priority.
The policy's learned estimate errors come from the Succeeded jobs'
`status.estimateRatio` (`estimate_ratios`), the ratios the simulator's policy
learns as its jobs finish.

Mapping: a job's work is `estimate.durationSeconds` on its reference type
times the share not yet done; its speed on each type is
`gpuTypes[].relativeSpeed` (for the job being decided with a model profile, the
profile's predicted speed per type; for other profile jobs 1.0); its
deadline is the utility's soft deadline, else its hard one; its gang is
`replicas x gpu.count` GPUs (a running job: what its plan holds). Capacity per
type is what is free now plus what the band's running jobs hold. Running jobs
hold a lease, as in the simulator: a running job that may yield (`yields_lease`:
preemptible, checkpointing, not elastic) and whose type the policy's allocation
does not keep is stopped from its checkpoint (`BandPlan.stops`), to wait or to
restart on the type the policy moves it to; the policy charges a lease round
(`LEASE_S`) on top of the restart for giving a lease up, so it does so only
for a clear gain. The policy counts a type's GPUs as one pool, so a lease given
up for a waiting job, a move to another type, and a start now, are checked
against the nodes (`Fits`): a lease is kept when the workers would not fit once
it had stopped, and a type's GPUs go only to a job whose workers fit there.
Other running jobs keep their GPUs, and a start the policy plans on them waits.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.capacity import Capacity, Placements
from chronotope.workloads.training_policy import LEASE_S, ChronotopePolicy, Job, JobState

__all__ = [
    "BandPlan",
    "Fits",
    "FleetJob",
    "FleetOutcome",
    "Took",
    "estimate_ratios",
    "fleet_gate",
    "gang_gpus",
    "idle_gpus",
    "lease_yields",
    "plan_band",
    "yields_lease",
]

NAMED_HOLDERS = 5
"""Jobs named in a waiting job's reason at most (the rest are "...")."""


@dataclass(frozen=True)
class FleetJob:
    """One TrainingJob of the priority band, as the fleet policy sees it."""

    key: str
    spec: TrainingJobSpec
    arrival: datetime
    done: float
    """Share of the work already done (0..1)."""
    running_on: str | None = None
    running_gpus: int = 0
    speeds: Mapping[str, float] | None = None
    """Speed per type relative to the estimate's reference; default `gpuTypes[].relativeSpeed`
    (a job planned from a model profile passes the profile's predictions)."""
    progress: float | None = None
    """Share of the estimated work done, uncapped (above 1 past the estimate); None: `done`."""
    order: tuple[Any, ...] = ()
    """Its place in the scheduling pass (`queueing.queue_key`), where the pass starts jobs
    in that order: the plan's node check places its starts so."""


Fits = Callable[[FleetJob, str, tuple[FleetJob, ...]], bool]
"""Whether a job's workers fit the nodes of a GPU type now once these running jobs have
stopped (the policy counts a type's GPUs as one pool; its nodes decide)."""
Took = Callable[[FleetJob, str], Placements | None]
"""Places a start now of the plan on its type's nodes, beside the starts placed before it
(a type's starts are checked together, not each on the GPUs free before any of them):
where its workers go, or None when they no longer fit (nothing is placed). The checks
after it count its workers as placed."""


@dataclass(frozen=True)
class _Check:
    """`Fits` and `Took` on the plan's job indices, and where each start's workers went."""

    fits: Callable[[int, str, tuple[int, ...]], bool]
    place: Callable[[int, str], Placements | None]
    placed: dict[int, Placements] = field(default_factory=dict)

    def took(self, i: int, gpu_type: str) -> bool:
        """Place job `i`'s workers on `gpu_type` beside the starts before it, if they fit."""
        where = self.place(i, gpu_type)
        if where is not None:
            self.placed[i] = where
        return where is not None


@dataclass(frozen=True)
class FleetOutcome:
    """The fleet gate's answer: whether the job starts now, on which type, and why."""

    starts: bool
    gpu_type: str | None
    reason: str
    placements: Placements = ()
    """Where the plan's node check put the workers of a start now (`Took`), if it did."""


def _deadline(spec: TrainingJobSpec) -> datetime | None:
    u = spec.utility
    if u is None:
        return None
    return u.soft_deadline or u.deadline


def _job(i: int, f: FleetJob, now: datetime, types: set[str], gpus: int) -> JobState | None:
    given = f.speeds or {t.name: (t.relative_speed or 1.0) for t in f.spec.gpu_types}
    speeds = {t: v for t, v in given.items() if t in types and v > 0}
    if not speeds:
        return None  # the policy skips types missing from a job's speeds
    deadline = _deadline(f.spec)
    # the policy sees what the simulator's noisy-estimate runs give it: the owner's
    # estimate and the work observed done, never a true remaining (the operator has
    # none), so a job past its estimate gets the policy's doubling rule
    estimate = max(f.spec.estimate.duration_seconds, 1.0)
    done = estimate * max(0.0, f.done if f.progress is None else f.progress)
    job = Job(
        job_id=i,
        arrival_s=(f.arrival - now).total_seconds(),
        num_gpus=gpus,
        work_s=max(estimate, done + 1.0),
        job_type="trainingjob",
        speed=speeds,
        deadline_s=(deadline - now).total_seconds() if deadline is not None else None,
        estimate_s=estimate,
    )
    return JobState(job=job, remaining_s=job.work_s - done, gpu_type=f.running_on)


@dataclass(frozen=True)
class BandPlan:
    """The policy's answer for a whole priority band at once: who starts now, on which type.

    `starts` maps each job given GPUs now (`namespace/name`) to its type. It is what the
    policy allocates, cut to the GPUs really free: a waiting job the policy gives the
    GPUs of running jobs that yield their lease (`yields`) waits for them to stop; one
    given GPUs of running jobs that keep them (no checkpoint, not preemptible, elastic)
    does not start, and the GPUs left idle by it are backfilled to the band's other
    waiting jobs (the policy's own backfill rule: fastest relative to the job's best
    type first, then policy order). No GPU that a waiting job of the band accepts
    stays idle, except those kept for a job that waits for leases there.
    """

    keys: tuple[str, ...]
    """The band's jobs the policy planned (types with GPUs, gangs that fit a type)."""
    starts: Mapping[str, str]
    yields: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """Waiting job -> (type, running jobs): the policy runs the job now on the GPUs of
    those running jobs, whose lease it gives up (each running job yields to one job)."""
    stops: Mapping[str, str] = field(default_factory=dict)
    """Running job -> why: the lease the policy gives up (the job stops from its
    checkpoint and waits, or restarts on the type the policy moves it to)."""
    unfit: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """Waiting job -> (type, running jobs): the policy would run the job on their GPUs,
    but its workers would not fit the nodes once they had stopped (`Fits`): they keep
    their lease."""
    placements: Mapping[str, Placements] = field(default_factory=dict)
    """Job started now -> where the node check placed its workers, each start beside
    the ones before it (`Took`): its start goes there, so the plan's starts fit together."""
    wished: Mapping[str, str] = field(default_factory=dict)
    """Job -> type: the jobs the policy runs now where they do not run yet, in its own order (its
    plan's order, then its backfill's): waiting jobs, those given leases among them, and
    running jobs it moves to another type; then the band's backfill. Its *wish*, which
    quota admits first and in this order, each on the type wished first, as the
    simulator's queues do (`sim.training.queues.QuotaPolicy`, whose pending jobs are the
    same: a running job the wish moves holds no quota there)."""
    giving: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Type -> the running jobs there whose lease the policy gives up (it runs them
    elsewhere or not now), its least preferred first: the leases `yields` deals out."""

    def outcome(self, key: str) -> FleetOutcome:
        """Whether job `key` starts now, where, and why (a job left out of the plan passes)."""
        if key not in self.keys:
            return FleetOutcome(True, None, "")
        if key in self.starts:
            return FleetOutcome(
                True,
                self.starts[key],
                f"{_POLICY} runs it now on {self.starts[key]}",
                self.placements.get(key, ()),
            )
        if key in self.unfit:
            gpu_type, victims = self.unfit[key]
            return FleetOutcome(
                False,
                None,
                f"{_POLICY} would run it now on {gpu_type} in place of {', '.join(victims)}, "
                "but its workers would not fit the nodes once they had stopped: they keep "
                "their lease",
            )
        if key in self.yields:
            gpu_type, victims = self.yields[key]
            return FleetOutcome(
                False,
                gpu_type,
                f"{_POLICY} runs it now on {gpu_type} in place of {', '.join(victims)}: "
                "their lease is given up (checkpoint, then stop); it starts once they have "
                "stopped",
            )
        ahead = [k for k in self.starts if k != key]
        shown = ahead[:NAMED_HOLDERS]
        holders = (
            ", ".join(shown) + (" ..." if len(ahead) > len(shown) else "") if ahead else "no job"
        )
        return FleetOutcome(
            False,
            None,
            f"{_POLICY} gives the GPUs now to {holders} and plans this job later "
            "(possibly on a faster type once it frees up)",
        )


_POLICY = (
    "cluster policy (as simulated: deadlines at risk first, then shortest remaining "
    "GPU-time, planned ahead per GPU type)"
)


def plan_band(
    band: Sequence[tuple[FleetJob, int]],
    capacity: Capacity,
    now: datetime,
    errors: Sequence[float] = (),
    *,
    fits: Fits | None = None,
    took: Took | None = None,
) -> BandPlan:
    """The simulator's policy over the band's jobs (each with its gang in GPUs), once.

    `errors`: finished jobs' (true / estimated) work ratios (`estimate_ratios`), from
    which the policy learns how wrong estimates are, as it does in the simulator.
    `fits`: checks against the nodes each start now, each lease the policy would
    give up for a waiting job, and each move of a running job to another type
    (None: none is checked); one that fails is not made. `took`: told each start now
    the plan makes, so that the checks after it count its workers as placed.
    """
    idle = idle_gpus(capacity)
    free = dict(idle)
    for o, _ in band:
        if o.running_on is not None:
            free[o.running_on] = free.get(o.running_on, 0) + o.running_gpus
    types = {t for t, c in free.items() if c > 0}
    # ids in one global order (age, then name), so that every job's reconcile computes
    # the same plan: "me first on ties" would let two tied jobs each wait for the other
    entries = sorted(band, key=lambda e: (e[0].arrival, e[0].key))
    states: list[JobState] = []
    planned: list[FleetJob] = []
    waiting: set[int] = set()
    yieldable: set[int] = set()
    for f, gpus in entries:
        state = _job(len(states), f, now, types, gpus)
        if state is not None and gpus <= max(free.get(t, 0) for t in state.job.speed):
            if f.running_on is None:
                waiting.add(len(states))
            elif yields_lease(f.spec):
                yieldable.add(len(states))
            states.append(state)
            planned.append(f)
    if not states:
        return BandPlan((), {})
    pools = {t: free[t] for t in types}  # types with GPUs to give
    alloc = ChronotopePolicy(round_s=LEASE_S, errors=errors).allocate(0.0, states, pools)
    keys = [f.key for f in planned]
    check = _by_index(fits, took, planned)
    starts = _starts_now(alloc, states, waiting, idle, check)
    if check is not None:
        order = [f.order for f in planned]
        starts = _placed_in_turn(starts, states, idle, check, order)
    # a job the policy gives leases to waits for them, rather than backfill a slower type
    yields, unfit = lease_yields(
        alloc,
        states,
        waiting - starts.keys(),
        yieldable,
        idle,
        fits=None if check is None else check.fits,
    )
    starts |= _backfill(alloc, states, waiting - starts.keys() - yields.keys(), idle, check)
    spared: set[int] = set()
    if check is not None:
        # with the nodes checked, a lease is given up only to a job that takes it (its
        # workers fit once it has stopped) or for a move whose workers fit: no other
        # waiting job can use the GPUs it would free
        taken = {v for _, vs in yields.values() for v in vs}
        spared = {v for v in yieldable if alloc.get(v) is None} - taken
        while True:  # a move that stays frees nothing: the others are checked again
            more = _unfit_moves(alloc, states, yieldable - spared, taken, check.fits)
            more |= _idle_moves(alloc, states, yieldable - spared - more, taken)
            if more <= spared:
                break
            spared |= more
    return BandPlan(
        tuple(keys),
        {keys[i]: t for i, t in sorted(starts.items())},
        {keys[i]: (t, tuple(keys[v] for v in vs)) for i, (t, vs) in sorted(yields.items())},
        _stops(alloc, states, keys, yieldable - spared, yields),
        {
            keys[i]: (t, tuple(keys[v] for v in vs))
            for i, (t, vs) in sorted(unfit.items())
            if i not in starts
        },
        {} if check is None else {keys[i]: p for i, p in check.placed.items() if i in starts},
        _wished(alloc, starts, waiting, states, keys),
        {
            t: tuple(keys[v] for v in vs)
            for t, vs in sorted(_giving(alloc, states, yieldable).items())
        },
    )


def _wished(
    alloc: Mapping[int, str],
    starts: Mapping[int, str],
    waiting: Collection[int],
    states: Sequence[JobState],
    keys: list[str],
) -> dict[str, str]:
    """`BandPlan.wished`: the jobs `alloc` runs where they do not run yet, then the other starts.

    Those of `alloc` in its order: waiting jobs, and running ones it moves to another type.
    """
    order = [(i, t) for i, t in alloc.items() if i in waiting or states[i].gpu_type != t]
    order += [(i, t) for i, t in starts.items() if i not in alloc]
    return {keys[i]: t for i, t in order}


def idle_gpus(capacity: Capacity) -> dict[str, int]:
    """The free GPUs per type on schedulable nodes: one pool a type, as the policy counts."""
    idle: dict[str, int] = {}
    for n in capacity:
        if n.schedulable:
            idle[n.gpu_model] = idle.get(n.gpu_model, 0) + n.free
    return idle


def _by_index(fits: Fits | None, took: Took | None, planned: Sequence[FleetJob]) -> _Check | None:
    """`fits` and `took` on the plan's job indices."""
    if fits is None:
        return None
    check, told = fits, took

    def fitting(i: int, gpu_type: str, victims: tuple[int, ...]) -> bool:
        return check(planned[i], gpu_type, tuple(planned[v] for v in victims))

    def placing(i: int, gpu_type: str) -> Placements | None:
        return () if told is None else told(planned[i], gpu_type)

    return _Check(fitting, placing)


def _unfit_moves(
    alloc: Mapping[int, str],
    states: Sequence[JobState],
    yieldable: Collection[int],
    taken: Collection[int],
    fits: Callable[[int, str, tuple[int, ...]], bool],
) -> set[int]:
    """The running jobs `alloc` moves to a type their workers would not fit: they stay.

    `yieldable`: the running jobs that may give their lease up; `taken`: those whose
    GPUs a waiting job takes (they stop whatever their move). Each move is checked
    with the jobs that leave its type gone; one that stays frees nothing, so the
    others are checked again.
    """
    kept: set[int] = set()
    changed = True
    while changed:
        changed = False
        leaving = {v for v in yieldable if v not in kept and alloc.get(v) != states[v].gpu_type}
        for v in sorted(leaving):
            there = alloc.get(v)
            if v in taken or there is None:
                continue
            gone = tuple(u for u in sorted(leaving) if u != v and states[u].gpu_type == there)
            if not fits(v, there, gone):
                kept.add(v)
                changed = True
    return kept


def _idle_moves(
    alloc: Mapping[int, str],
    states: Sequence[JobState],
    moving: Collection[int],
    taken: Collection[int],
) -> set[int]:
    """The running jobs `alloc` moves to a slower type whose GPUs no job would take: they stay.

    A move to a slower type only frees the job's GPUs for other work; it is kept when a
    waiting job takes them (`taken`) or another job of `moving` moves onto that type.
    """
    leaving = {v for v in moving if alloc.get(v) not in (None, states[v].gpu_type)}
    entering = {alloc[u] for u in leaving}
    return {
        v
        for v in leaving
        if v not in taken
        and not _faster(states[v], alloc[v])
        and states[v].gpu_type not in entering
    }


def _faster(state: JobState, there: str) -> bool:
    """Whether a running job moved to `there` runs faster than where it runs now."""
    speed = state.job.speed
    return speed.get(there, 0.0) > speed.get(state.gpu_type or "", 0.0)


def _stops(
    alloc: Mapping[int, str],
    states: Sequence[JobState],
    keys: Sequence[str],
    yieldable: Collection[int],
    yields: Mapping[int, tuple[str, tuple[int, ...]]],
) -> dict[str, str]:
    """Running job -> why, for each job of `yieldable` whose type `alloc` does not keep."""
    to = {v: keys[i] for i, (_, vs) in yields.items() for v in vs}
    stops: dict[str, str] = {}
    for v in sorted(yieldable):
        held, there = states[v].gpu_type, alloc.get(v)
        if there == held:
            continue
        if there is not None and _faster(states[v], there):
            why = f"moves it from {held} to {there}, where it finishes sooner"
        elif there is not None:  # a slower type: its GPUs serve other work better
            why = f"moves it from {held} to {there}, to free its {held} GPUs for other work"
        elif v in to:
            why = f"gives its {held} GPUs to {to[v]}"
        else:
            why = f"gives its {held} GPUs to shorter or more urgent work"
        stops[keys[v]] = f"{_POLICY} {why} (its lease is given up: checkpoint, stop, re-plan)"
    return stops


def yields_lease(spec: TrainingJobSpec) -> bool:
    """Whether the policy may stop this running job for its lease.

    Only a preemptible job that checkpoints (it resumes where it stopped) and is
    not elastic (an elastic job's size and type are re-planned by SAILOR's rule,
    `workloads.replan`).
    """
    return (
        spec.preemptible
        and spec.checkpoint is not None
        and spec.min_replicas is None
        and spec.max_replicas is None
    )


def _giving(
    alloc: Mapping[int, str], states: Sequence[JobState], yieldable: Collection[int]
) -> dict[str, list[int]]:
    """Type -> the `yieldable` running jobs there whose type `alloc` does not keep.

    The policy's least preferred first: those it does not run at all, then the
    last in its order.
    """
    rank = {i: r for r, i in enumerate(alloc)}
    giving: dict[str, list[int]] = {}
    for v in sorted(yieldable, key=lambda v: -rank.get(v, len(rank))):
        gpu_type = states[v].gpu_type
        if gpu_type is not None and alloc.get(v) != gpu_type:
            giving.setdefault(gpu_type, []).append(v)
    return giving


def lease_yields(
    alloc: Mapping[int, str],
    states: Sequence[JobState],
    waiting: Collection[int],
    yieldable: Collection[int],
    idle: dict[str, int],
    *,
    fits: Callable[[int, str, tuple[int, ...]], bool] | None = None,
) -> tuple[dict[int, tuple[str, tuple[int, ...]]], dict[int, tuple[str, tuple[int, ...]]]]:
    """Waiting jobs `alloc` runs now on GPUs of running jobs whose lease it gives up.

    `alloc` is the policy's allocation (job index -> type), `waiting` the jobs that
    did not start on the `idle` GPUs (what is left of them), `yieldable` the running
    jobs that may be stopped. A running job whose type `alloc` does not keep gives up
    its lease; in plan order, each waiting job `alloc` places on a type takes the
    idle GPUs left there and as many of those leases as it needs (the policy's
    least preferred first, as each is needed at most once); a job they do not cover
    takes nothing, and neither does one whose workers `fits` says would not fit the
    nodes once those jobs had stopped (their leases stay for the jobs after it).
    Job index -> (type, the running jobs it takes over), for those that take them and
    for those `fits` refused; the idle GPUs the takers take leave `idle`.
    """
    giving = _giving(alloc, states, yieldable)
    spare: dict[str, int] = {}  # what the chosen leases free beyond their takers' gangs
    out: dict[int, tuple[str, tuple[int, ...]]] = {}
    unfit: dict[int, tuple[str, tuple[int, ...]]] = {}
    for i, gpu_type in alloc.items():
        pool = giving.get(gpu_type, [])
        if i not in waiting or not pool:
            continue
        gang = states[i].job.num_gpus
        from_spare = min(spare.get(gpu_type, 0), gang)
        from_idle = min(idle.get(gpu_type, 0), gang - from_spare)
        need = gang - from_spare - from_idle
        chosen: list[int] = []
        for v in pool:
            if need <= 0:
                break
            chosen.append(v)
            need -= states[v].job.num_gpus
        if need > 0 or not (chosen or from_spare):  # idle GPUs alone: its nodes refused it
            continue
        if chosen and fits is not None and not fits(i, gpu_type, tuple(chosen)):
            unfit[i] = (gpu_type, tuple(chosen))
            continue
        for v in chosen:
            pool.remove(v)
        idle[gpu_type] = idle.get(gpu_type, 0) - from_idle
        spare[gpu_type] = spare.get(gpu_type, 0) - from_spare - need
        out[i] = (gpu_type, tuple(chosen))
    return out, unfit


def _starts_now(
    alloc: Mapping[int, str],
    states: Sequence[JobState],
    waiting: set[int],
    idle: dict[str, int],
    check: _Check | None = None,
) -> dict[int, str]:
    """The waiting jobs of `alloc` that fit the `idle` GPUs of their type, in plan order.

    `check`: and whose workers fit that type's nodes now, each alone.
    """
    starts: dict[int, str] = {}
    for i, t in alloc.items():
        if (
            i in waiting
            and _fits_idle(states[i], t, idle)
            and (check is None or check.fits(i, t, ()))
        ):
            starts[i] = t
            idle[t] -= states[i].job.num_gpus
    return starts


def _placed_in_turn(
    starts: Mapping[int, str],
    states: Sequence[JobState],
    idle: dict[str, int],
    check: _Check,
    order: Sequence[tuple[Any, ...]],
) -> dict[int, str]:
    """`starts` (each fits its type's nodes alone) placed together, in the scheduling pass's order.

    `order`: each job's place in the pass (`FleetJob.order`), which starts them in that
    order: each is placed beside those before it (`check.took`), and one whose workers
    no longer fit is dropped, its GPUs back in `idle` for the backfill.
    """
    kept: dict[int, str] = {}
    for i in sorted(starts, key=lambda i: (order[i], i)):
        t = starts[i]
        if check.took(i, t):
            kept[i] = t
        else:
            idle[t] += states[i].job.num_gpus
    return kept


def _backfill(
    alloc: Mapping[int, str],
    states: Sequence[JobState],
    waiting: Collection[int],
    idle: dict[str, int],
    check: _Check | None = None,
) -> dict[int, str]:
    """The policy's backfill again, on the GPUs its plan gave to running jobs that keep them.

    The `waiting` jobs, fastest relative to their best type first, then in plan order;
    `check`: on a type whose nodes their workers fit now, beside the starts before them.
    """
    starts: dict[int, str] = {}
    rank = {i: r for r, i in enumerate(alloc)}
    left = sorted(waiting, key=lambda i: (rank.get(i, len(rank)), i))
    cands = sorted(
        (-states[i].job.speed[t] / max(states[i].job.speed.values()), r, i, t)
        for r, i in enumerate(left)
        for t in states[i].job.speed
    )
    for _, _, i, t in cands:
        if i in starts or not _fits_idle(states[i], t, idle):
            continue
        if check is None or (check.fits(i, t, ()) and check.took(i, t)):
            starts[i] = t
            idle[t] -= states[i].job.num_gpus
    return starts


def _fits_idle(state: JobState, gpu_type: str, idle: Mapping[str, int]) -> bool:
    return idle.get(gpu_type, 0) >= state.job.num_gpus


def fleet_gate(
    me: FleetJob,
    my_gpus: int,
    others: Sequence[FleetJob],
    capacity: Capacity,
    now: datetime,
    *,
    errors: Sequence[float] = (),
) -> FleetOutcome:
    """Whether the simulator's policy, over `me` and `others`, starts `me` now, and where."""
    band = [(me, my_gpus), *((o, o.running_gpus or gang_gpus(o.spec)) for o in others)]
    return plan_band(band, capacity, now, errors).outcome(me.key)


def estimate_ratios(jobs: Iterable[Mapping[str, Any]]) -> list[float]:
    """The (true / estimated) work ratios of the Succeeded jobs (`status.estimateRatio`)."""
    out: list[float] = []
    for job in jobs:
        status = job.get("status") or {}
        ratio = status.get("estimateRatio")
        if status.get("phase") == "Succeeded" and isinstance(ratio, int | float) and ratio > 0:
            out.append(float(ratio))
    return out


def gang_gpus(spec: TrainingJobSpec) -> int:
    """The GPUs of the job's full gang (`replicas x gpu.count`)."""
    return spec.replicas * (spec.gpu.count or 1)
