"""Space-time decisions for a TrainingJob (TetriSched-style, pure).

For every acceptable GPU type the job offers an alternative: run now on that
type (with as many workers as fit, down to minReplicas for an elastic job)
or wait until the type frees up (when running jobs there are predicted to
finish). Each alternative's completion time gives a utility through the job's
utility function (constant, linear decay after a soft deadline, step at a hard
deadline); the best one wins, so a job waits for faster GPUs exactly when its
utility says waiting pays, and runs on slower ones when it does not.

The decision carries its reason in plain words, for status and events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, TypeAlias

from chronotope.api.v1alpha1.trainingjob import (
    PlacementStrategy,
    TopologyLevel,
    TrainingJobSpec,
    Utility,
    UtilityFunction,
)
from chronotope.solver.model import Reason
from chronotope.solver.slots import domain_of, members_held
from chronotope.workloads.capacity import (
    Capacity,
    NodeCapacity,
    Placements,
    Usable,
    admitting,
    facts_of,
    in_cluster,
)
from chronotope.workloads.node_fit import (
    CPU_OR_MEMORY,
    NodeRules,
    Spread,
    job_rules,
    template_apart,
)
from chronotope.workloads.parallelism import Degrees

if TYPE_CHECKING:
    from chronotope.workloads.profiled import GangPlan, ProfilePlanner

__all__ = [
    "Action",
    "Decision",
    "decide",
    "least_workers",
    "required_topology",
    "utility_at",
    "workers_that_fit",
]


class Action(StrEnum):
    """What `decide` tells a job: start now, wait for GPUs, or impossible (never fits here)."""

    START = "Start"
    WAIT = "Wait"
    IMPOSSIBLE = "Impossible"


@dataclass(frozen=True)
class Decision:
    """What `decide` chose for a job: an action and its reason in words.

    A start, or a wait for one GPU type, also gives the type, workers, predicted finish
    and utility.
    """

    action: Action
    reason: str
    gpu_type: str | None = None
    workers: int = 0
    gpus_per_worker: int = 0
    finish: datetime | None = None
    utility: float | None = None
    degrees: Degrees | None = None
    """Set when a model profile chose the parallelisation."""
    samples_per_second: float | None = None
    score: float = 0.0
    """Ranks alternatives of equal utility above the finish time (samples per cost)."""
    planner_note: str = ""
    cause: str = ""
    """A CamelCase condition reason for a job that does not start (see `why`)."""
    placements: Placements = ()
    """Per worker (rank order): the node and GPUs a joint plan or the scheduling pass put
    it on; empty otherwise."""
    start: datetime | None = None
    """A WAIT: when the plan-ahead expects it to start (its GPUs or its quota free up)."""

    @property
    def why(self) -> Reason | None:
        """Why the job does not start now, as the one "why not" type; None for a START.

        IMPOSSIBLE is unresolvable (its code is `cause`, default Unschedulable);
        WAIT may clear (its code is `cause`, default WaitingForGPUs).
        """
        if self.action is Action.START:
            return None
        if self.action is Action.IMPOSSIBLE:
            return Reason(
                code=self.cause or "Unschedulable", message=self.reason, unresolvable=True
            )
        return Reason(code=self.cause or "WaitingForGPUs", message=self.reason)


def utility_at(utility: Utility | None, finish: datetime) -> float:
    """The value of finishing at `finish` (1.0 when the job states no utility)."""
    if utility is None:
        return 1.0
    value = utility.value
    if utility.function is UtilityFunction.CONSTANT:
        return value
    if utility.function is UtilityFunction.STEP:
        assert utility.deadline is not None
        return value if finish <= utility.deadline else 0.0
    assert utility.soft_deadline is not None
    assert utility.deadline is not None
    if finish <= utility.soft_deadline:
        return value
    if finish >= utility.deadline:
        return 0.0
    span = (utility.deadline - utility.soft_deadline).total_seconds()
    return value * (utility.deadline - finish).total_seconds() / span


def _strict(spec: TrainingJobSpec, strategy: PlacementStrategy) -> str:
    """`: why` its workers go one a node under StrictSpread, when its template says why."""
    if strategy is not PlacementStrategy.STRICT_SPREAD:
        return ""
    why = template_apart(spec.template)
    return f": {why}" if why else ""


def _levels(spread: Spread | None) -> str:
    """`: why` a domain holds no more workers than its spread in levels lets it ('' for None)."""
    if spread is None:
        return ""
    key = spread.term.key
    what = "a node" if spread.term.on_node else f"a {key} domain"
    return (
        f": a topology spread constraint (maxSkew {spread.skew} on {key}) matches its "
        f"workers' own labels, so {what} holds at most {spread.skew} more of them than the "
        "one that holds the fewest"
    )


def workers_that_fit(
    nodes: Sequence[NodeCapacity],
    per_worker: int,
    strategy: PlacementStrategy,
    free: bool,
    topology: TopologyLevel = TopologyLevel.ANY,
    *,
    spread: Spread | None = None,
) -> int:
    """How many workers of `per_worker` GPUs the nodes hold (now if `free`, else ever).

    `topology`: the domain every worker must share (a required `placement.topology`):
    the most any one such domain holds (`solver.slots.domain_of`, `members_held`).
    `spread`: the workers' own topology spread placed in levels (`node_fit.Spread.levels`):
    ever, with every GPU free and none of the pods it counts running, a domain of its key
    holds at most `maxSkew` more than the one that holds the fewest (now,
    `capacity.admitting` has cut each node's free GPUs to its share).
    """
    if topology is TopologyLevel.ANY:  # one pass: it is asked per job and type, often
        per_node = [
            (n.free if free else n.total) // per_worker for n in nodes if n.schedulable or not free
        ]
        if spread is not None and not free and per_node:
            return _held_in_levels(nodes, per_node, spread)
        return members_held(per_node, strategy)
    most = 0
    for group in _domains(nodes, topology):
        per_node = [
            (nodes[i].free if free else nodes[i].total) // per_worker
            for i in group
            if nodes[i].schedulable or not free
        ]
        most = max(most, members_held(per_node, strategy))
    return most


def _held_in_levels(nodes: Sequence[NodeCapacity], per_node: Sequence[int], spread: Spread) -> int:
    """How many workers nodes that each hold `per_node` hold under `spread` in levels.

    Each domain of its key (a node on `kubernetes.io/hostname`) at most `maxSkew` above
    the one that holds the fewest.
    """
    if spread.term.on_node:
        level = min(per_node) + spread.skew
        return sum(min(k, level) for k in per_node)
    held: dict[str, int] = {}
    for n, k in zip(nodes, per_node, strict=True):
        value = n.labels.get(spread.term.key, "")
        held[value] = held.get(value, 0) + k
    level = min(held.values()) + spread.skew
    return sum(min(k, level) for k in held.values())


_Groups: TypeAlias = tuple[tuple[int, ...], ...]
_DOMAINS: dict[tuple[int, TopologyLevel], tuple[Sequence[NodeCapacity], _Groups]] = {}
"""`_domains`' answers by the nodes (their id) and level: a pass asks per job of one
type's nodes, which change only where a start takes GPUs (`capacity.take`)."""
_DOMAINS_KEPT = 4096


def _domains(nodes: Sequence[NodeCapacity], level: TopologyLevel) -> _Groups:
    """The positions of `nodes` grouped by their `level` domain (`solver.slots.domain_of`)."""
    key = (id(nodes), level)
    hit = _DOMAINS.get(key)
    if hit is not None and hit[0] is nodes:  # held here: its id is not reused
        return hit[1]
    groups: dict[str | None, list[int]] = {}
    for i, n in enumerate(nodes):
        groups.setdefault(domain_of(n.name, n.labels, level), []).append(i)
    out = tuple(tuple(g) for g in groups.values())
    if len(_DOMAINS) >= _DOMAINS_KEPT:
        _DOMAINS.clear()
    _DOMAINS[key] = (nodes, out)
    return out


def least_workers(spec: TrainingJobSpec) -> int:
    """The fewest workers the job runs with: `minReplicas` (elastic), else `replicas`."""
    return min(spec.min_replicas or spec.replicas, spec.replicas)


def required_topology(spec: TrainingJobSpec) -> TopologyLevel:
    """The domain all the job's workers must share (Any: none; a preference is not a rule)."""
    return spec.placement.topology if spec.placement.required else TopologyLevel.ANY


def _speed(spec: TrainingJobSpec, gpu_type: str) -> float:
    for option in spec.gpu_types:
        if option.name == gpu_type:
            return option.relative_speed or 1.0
    return 1.0


def _duration(spec: TrainingJobSpec, gpu_type: str, workers: int) -> timedelta:
    seconds = spec.estimate.duration_seconds * spec.replicas / workers / _speed(spec, gpu_type)
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class _Estimator:
    """How one job's alternatives are priced: by its estimate, or by its model profile."""

    spec: TrainingJobSpec
    planner: ProfilePlanner | None
    reference: GangPlan | None
    least: int
    remaining: float

    def alternative(
        self,
        action: Action,
        gpu_type: str,
        nodes: Sequence[NodeCapacity],
        start: datetime,
        most: int,
    ) -> Decision | str:
        """Run on `gpu_type` from `start` with up to `most` workers, or why the profile cannot."""
        spec, per_worker = self.spec, self.spec.gpu.count or 1
        later = start if action is Action.WAIT else None
        if self.planner is None or self.reference is None:
            finish = start + _duration(spec, gpu_type, most) * self.remaining
            return Decision(
                action,
                "",
                gpu_type,
                most,
                per_worker,
                finish,
                utility_at(spec.utility, finish),
                start=later,
            )
        got = self.planner.plan(gpu_type, nodes, self.least, most, free=action is Action.START)
        if isinstance(got, str):
            return got
        finish = start + self.planner.duration(self.reference, got) * self.remaining
        return Decision(
            action,
            "",
            gpu_type,
            got.workers,
            per_worker,
            finish,
            utility_at(spec.utility, finish),
            degrees=got.degrees,
            samples_per_second=got.samples_per_second,
            score=got.score if self.planner.per_cost else 0.0,
            planner_note=got.note,
            start=later,
        )


def decide(
    spec: TrainingJobSpec,
    capacity: Capacity,
    now: datetime,
    frees_at: Mapping[str, datetime] | None = None,
    *,
    planner: ProfilePlanner | None = None,
    remaining: float = 1.0,
) -> Decision:
    """Pick the best alternative; see the module docstring. Pure.

    With a `planner` (the job names a model profile) the worker count,
    parallelisation and speed of each alternative come from the profile.
    `remaining` is the share of the job's work still to do (after restarts).
    """
    rules = job_rules(spec)
    facts = facts_of(capacity)
    volumes = rules.volumes(facts.volumes)
    least = least_workers(spec)
    shared = next((v.claim for v in volumes if v.one_pod), None)
    if shared is not None and least > 1:  # kube-scheduler's VolumeRestrictions
        return Decision(
            Action.IMPOSSIBLE,
            f"cannot ever run here: PersistentVolumeClaim {shared} is ReadWriteOncePod (one "
            f"pod may use it) and every one of its {least} workers mounts it",
            cause="VolumeConflict",
        )
    unready = [v.refusal for v in volumes if v.refusal is not None]
    for v in volumes:  # VolumeRestrictions: another bound pod uses the claim
        user = facts.used_by(v.claim, rules.who) if v.one_pod else None
        if user is not None:
            unready.append(
                f"PersistentVolumeClaim {v.claim} is ReadWriteOncePod and pod {user} uses it"
            )
    if unready:  # no node will do until the claim is there (and bound)
        return Decision(
            Action.IMPOSSIBLE,
            f"waiting for its volumes: {'; '.join(unready)}",
            cause="VolumeNotReady",
        )
    rejected = rules.runtime_refusal(facts.runtimes)
    if rejected is not None:  # its workers could not even be created
        return Decision(
            Action.IMPOSSIBLE,
            f"the API server would reject its workers: {rejected}",
            cause="RuntimeClassRejected",
        )
    rules = in_cluster(capacity, rules)  # what the messages name: with the class's overhead
    reference: GangPlan | None = None
    if planner is not None:
        ref = planner.reference(capacity)
        if isinstance(ref, str):
            return Decision(Action.IMPOSSIBLE, ref, cause="ProfileUnusable")
        reference = ref
    est = _Estimator(spec, planner, reference, least, remaining)
    starts: list[Decision] = []
    waits: list[Decision] = []
    why_not: list[str] = []
    for option in spec.gpu_types:
        seen = admitting(capacity, option.name, rules, spec.gpu.count or 1)
        start, wait, why = _on_type(est, option.name, seen, now, frees_at or {}, rules=rules)
        starts += start
        waits += wait
        why_not += why
    return _best(starts, waits, why_not, spec.gpu.count or 1)


def _on_type(
    est: _Estimator,
    gpu_type: str,
    seen: Usable,
    now: datetime,
    frees_at: Mapping[str, datetime],
    *,
    rules: NodeRules,
) -> tuple[list[Decision], list[Decision], list[str]]:
    """The start-now and wait-for-it alternatives on one GPU type, and why not.

    `seen`: the type's nodes as the job's workers see them (`capacity.admitting`):
    those they may use, with what their CPU and memory let them take now, and how
    many others refuse them, by reason.
    """
    nodes, refused = seen.nodes, seen.refused
    spec = est.spec
    per_worker = spec.gpu.count or 1
    want, least, strategy = spec.replicas, est.least, spec.placement.strategy
    if not nodes:
        if refused:
            return [], [], [f"{gpu_type}: {_refusals(refused, everyone=True)}"]
        return [], [], [f"no node has {gpu_type} GPUs"]
    topology = required_topology(spec)
    # each own spread alone bounds what the gang can ever hold (with two, both bind): the
    # tightest cuts ever and says why
    ever, spread = min(
        (
            (workers_that_fit(nodes, per_worker, strategy, False, topology, spread=s), s)
            for s in rules.spread
            if s.rises
        ),
        key=lambda held: held[0],
        default=(workers_that_fit(nodes, per_worker, strategy, False, topology), None),
    )
    if ever < least:
        where = "the cluster holds" if not refused else "the nodes its workers may use hold"
        more = f"; {_refusals(refused, everyone=False)}" if refused else ""
        return (
            [],
            [],
            [
                f"{gpu_type}: {where} at most {ever} worker(s) of {per_worker} "
                f"GPU(s) ({strategy.value}{_strict(spec, strategy)}{_levels(spread)}"
                f"{_within(topology)}), "
                f"the job needs {least}{more}"
            ],
        )
    if est.planner is not None:  # can the profile run here at all, with every GPU free?
        ever_plan = est.planner.plan(gpu_type, nodes, least, min(want, ever), free=False)
        if isinstance(ever_plan, str):
            return [], [], [f"{gpu_type}: {ever_plan}"]
    starts: list[Decision] = []
    waits: list[Decision] = []
    why_not: list[str] = []
    now_fit = min(want, workers_that_fit(nodes, per_worker, strategy, True, topology))
    if now_fit >= least:
        got = est.alternative(Action.START, gpu_type, nodes, now, now_fit)
        if isinstance(got, str):
            why_not.append(f"{gpu_type}: {got}")
        else:
            starts.append(got)
    else:
        mine = f" on the {len(nodes)} node(s) its workers may use" if refused else ""
        why_not.append(
            f"{gpu_type}: room for {now_fit} of {least} worker(s) now{_within(topology)}"
            f"{mine}{_cut(seen, rules)}"
        )
    if now_fit < want and gpu_type in frees_at:
        start = max(now, frees_at[gpu_type])
        later = est.alternative(Action.WAIT, gpu_type, nodes, start, min(want, ever))
        if not isinstance(later, str):
            waits.append(later)
    return starts, waits, why_not


def _within(topology: TopologyLevel) -> str:
    """' within one <domain>' for a required topology ('' for Any)."""
    return "" if topology is TopologyLevel.ANY else f" within one {topology.value}"


_THEIRS = "theirs, or a pod's there"


def _cut(seen: Usable, rules: NodeRules) -> str:
    """Why nodes with free GPUs give the workers fewer now, in words ('' when none do)."""
    out = ""
    if seen.short:
        lacks = (
            seen.lacks() or f"free {CPU_OR_MEMORY} for a worker: {rules.request_of(CPU_OR_MEMORY)}"
        )
        out += f" ({seen.short} node(s) have free GPUs but too little {lacks})"
    if seen.full:
        out += f" ({seen.full} node(s) have idle GPUs but no pod slot left: Too many pods)"
    if seen.blocked:
        ports = ", ".join(map(str, rules.host_ports))
        out += (
            f" ({seen.blocked} node(s) have free GPUs but a pod there holds a host port "
            f"its workers ask: {ports})"
        )
    if seen.shunned:
        out += (
            f" ({seen.shunned} node(s) have free GPUs but a required pod affinity or "
            f"anti-affinity or a topology spread keeps its workers off them, or lets fewer "
            f"there: {seen.shuns() or _THEIRS})"
        )
    return out


_REASONS_SHOWN = 3


def _refusals(refused: Mapping[str, int], *, everyone: bool) -> str:
    """The nodes of a type that refuse a job's workers, in words (most common reason first)."""
    n = sum(refused.values())
    reasons = sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{count} by {why}" for why, count in reasons[:_REASONS_SHOWN])
    more = " ..." if len(reasons) > _REASONS_SHOWN else ""
    lead = f"none of its {n} node(s) admits" if everyone else f"{n} node(s) refuse"
    return f"{lead} its workers ({shown}{more})"


def _best(
    starts: list[Decision], waits: list[Decision], why_not: list[str], per_worker: int
) -> Decision:
    """The best alternative with its reason in words, or why the job waits or never runs."""
    best_start = max(starts, key=_rank, default=None)
    best_wait = max(waits, key=_rank, default=None)
    # wait only for a strictly better utility: an estimate of when GPUs free up is only
    # an estimate, so on a tie the job starts now
    if best_wait is not None and (
        best_start is None or (best_wait.utility or 0.0) > (best_start.utility or 0.0) + 1e-9
    ):
        now_text = (
            f"running now on {best_start.gpu_type} would finish {best_start.finish:%Y-%m-%d %H:%M} "
            f"(utility {best_start.utility:.2f})"
            if best_start is not None
            else "nothing fits now" + (f" ({'; '.join(why_not)})" if why_not else "")
        )
        assert best_wait.finish is not None
        assert best_wait.utility is not None
        return _with_reason(
            best_wait,
            (
                f"waiting for {best_wait.gpu_type}: it frees up and finishes the job "
                f"{best_wait.finish:%Y-%m-%d %H:%M} (utility {best_wait.utility:.2f}); {now_text}"
            ),
        )
    if best_start is not None:
        assert best_start.finish is not None
        note = f"{best_start.workers} worker(s) x {per_worker} {best_start.gpu_type}"
        if best_start.utility == 0.0:
            note += "; the deadline cannot be met on any GPU type"
        if best_start.planner_note:
            note += f"; {best_start.planner_note}"
        return _with_reason(
            best_start, f"starting {note}, predicted to finish {best_start.finish:%Y-%m-%d %H:%M}"
        )
    if any("room for" in w for w in why_not):  # possible, just not now
        return Decision(Action.WAIT, "waiting for GPUs: " + "; ".join(why_not))
    return Decision(Action.IMPOSSIBLE, "cannot ever run here: " + "; ".join(why_not))


def _rank(d: Decision) -> tuple[float, float, float]:
    finish = d.finish.timestamp() if d.finish else float("inf")
    return (d.utility or 0.0, d.score, -finish)


def _with_reason(d: Decision, reason: str) -> Decision:
    return replace(d, reason=reason)
