"""Batch planning of pending gangs with CP-SAT, in the TetriSched style.

Each workload offers alternatives: a GPU model (with its own duration and
utility) times a start slot in the plan-ahead window. The model picks at most
one alternative per workload (`start[w|model|tS]`). Alternatives that start
now are placed member by member on concrete nodes and GPUs (`on[p|node]`,
`gpu[p|node|g]`) with per-node CPU/memory and per-GPU share/memory packing;
later starts only reserve GPU share per model and slot (they are re-planned
next cycle, which is why only what starts now is enacted). Gangs are all or
nothing; PACK/SPREAD are soft, STRICT_PACK/STRICT_SPREAD and a shared
topology domain are hard. The objective is total utility (priority-weighted,
zero past the deadline, a little less for every slot of delay) minus a
fragmentation term (`opened[node|g]`: a share that opens a fully free GPU)
and the soft-strategy penalties. Every variable is named, and an unplaced
workload gets its reason in plain words. `plan` is pure and blocking; call
`plan_async` from an event loop.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from chronotope.solver.batch_greedy import GreedyPick, greedy_candidates
from chronotope.solver.model import (
    MILLI,
    Alternative,
    ClusterSnapshot,
    Node,
    Placement,
    PlacementStrategy,
    Reason,
    Unplaced,
    Workload,
)
from chronotope.solver.online import node_reasons

__all__ = ["BatchSettings", "Deferred", "Plan", "plan", "plan_async"]

SCALE = 1000


class Deferred(BaseModel):
    """A workload planned to start later (not enacted; re-planned next cycle)."""

    model_config = ConfigDict(frozen=True)
    workload: str
    gpu_model: str
    start_s: float


class Plan(BaseModel):
    """The batch decision: what starts now, what is planned later, what cannot run."""

    model_config = ConfigDict(frozen=True)
    placements: tuple[Placement, ...] = ()
    chosen: dict[str, str] = Field(default_factory=dict)
    """workload -> GPU model of the alternative that starts now."""
    deferred: tuple[Deferred, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    preemption_candidates: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    utility: float = 0.0
    status: str = "UNKNOWN"
    objective_terms: dict[str, float] = Field(default_factory=dict)


class BatchSettings(BaseModel):
    """Plan-ahead window, solver limits and objective weights of one `plan` call."""

    model_config = ConfigDict(frozen=True)
    slot_s: float = 600.0
    horizon_slots: int = Field(default=4, ge=1)
    time_limit_s: float = 2.0
    seed: int = 0
    workers: int = 1
    candidate_nodes: int = 12
    """Nodes offered per (workload, GPU model): best fit on the greedy pass's residual."""
    gap_limit: float = 0.02
    """Stop once the objective is proven within this relative gap of the optimum."""
    delay_discount: float = 0.02
    frag_weight: float = 0.05
    pack_weight: float = 0.01
    spread_weight: float = 0.01
    hint: Plan | None = None


@dataclass
class _Alt:
    """One alternative of one workload: a GPU model at a start slot, with its value."""

    workload: Workload
    alt: Alternative
    slot: int
    value: int
    var: Any = None
    nodes: list[Node] = field(default_factory=list)

    @property
    def model(self) -> str:
        return self.alt.gpu_model

    @property
    def tag(self) -> str:
        return f"{self.workload.name}|{self.alt.gpu_model}"


class _Vars:
    """The model's placement variables, keyed by what they mean (not by joined strings).

    `on(member, model, node)`: the member runs on the node under that model's
    alternative; `gpu(member, model, node, index)`: it takes that GPU;
    `used(workload, model, node)`: some member of a multi-member gang is there;
    `opened(node, index)`: a share opens a fully free GPU.
    """

    def __init__(self, m: Any) -> None:
        self._m = m
        self.on: dict[tuple[str, str, str], Any] = {}
        self.gpu: dict[tuple[str, str, str, int], Any] = {}
        self.used: dict[tuple[str, str, str], Any] = {}
        self.opened: dict[tuple[str, int], Any] = {}

    def new_on(self, member: str, model: str, node: str) -> Any:
        var = self._m.new_bool_var(f"on[{member}|{model}|{node}]")
        self.on[member, model, node] = var
        return var

    def new_gpu(self, member: str, model: str, node: str, index: int) -> Any:
        var = self._m.new_bool_var(f"gpu[{member}|{model}|{node}|{index}]")
        self.gpu[member, model, node, index] = var
        return var

    def new_used(self, workload: str, model: str, node: str) -> Any:
        var = self._m.new_bool_var(f"uses[{workload}|{model}|{node}]")
        self.used[workload, model, node] = var
        return var

    def new_opened(self, node: str, index: int) -> Any:
        var = self._m.new_bool_var(f"opened[{node}|{index}]")
        self.opened[node, index] = var
        return var


@dataclass
class _Usage:
    """What the start-now alternatives may take, per node and per GPU (coefficient, var)."""

    cpu: dict[str, list[tuple[int, Any]]] = field(default_factory=lambda: defaultdict(list))
    mem: dict[str, list[tuple[int, Any]]] = field(default_factory=lambda: defaultdict(list))
    gpu: dict[tuple[str, int], list[tuple[int, int, Any]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """(node, GPU index) -> (share, device memory, var) of members assigned GPU by GPU."""
    whole: dict[str, list[tuple[int, Any]]] = field(default_factory=lambda: defaultdict(list))
    """node -> (GPUs, var) of whole-GPU members that are counted, not assigned."""


Penalty = tuple[float, Any, str]
"""(weight, variable, label): subtracted from the objective when the variable is 1."""


def _alternatives(w: Workload, models: set[str]) -> list[Alternative]:
    if w.alternatives:
        return [a for a in w.alternatives if a.gpu_model in models or w.pod.num_gpus == 0]
    if w.pod.num_gpus == 0:
        return [Alternative(gpu_model="", duration_s=w.default_duration_s)]
    return [
        Alternative(gpu_model=m, duration_s=w.default_duration_s)
        for m in sorted(models)
        if w.pod.allows(m)
    ]


def _enumerate_alternatives(
    workloads: list[Workload], models: set[str], now: float, settings: BatchSettings
) -> tuple[list[_Alt], dict[str, list[Reason]]]:
    """Every (GPU model, start slot) worth something, and why a workload has none."""
    alts: list[_Alt] = []
    early: dict[str, list[Reason]] = defaultdict(list)
    for w in workloads:
        options = _alternatives(w, models)
        if not options:
            early[w.name].append(
                Reason(code="NoGpuModel", message="no GPU model it allows is in the cluster")
            )
        mine = 0
        for opt in options:
            for s in range(settings.horizon_slots):
                finish = now + s * settings.slot_s + opt.duration_s
                if w.deadline_s is not None and finish > w.deadline_s:
                    continue
                weight = opt.utility * (1 + max(w.priority, 0)) * (1 - settings.delay_discount * s)
                if weight <= 0:
                    continue
                alts.append(_Alt(w, opt, s, round(weight * SCALE)))
                mine += 1
        if options and not mine:
            fastest = min(o.duration_s for o in options)
            early[w.name].append(
                Reason(
                    code="DeadlineUnmeetable",
                    message=f"deadline {w.deadline_s:.0f}s cannot be met: the fastest alternative "
                    f"finishes at {now + fastest:.0f}s (utility 0)",
                )
            )
    return alts, early


def _add_choice(m: Any, alts: list[_Alt]) -> None:
    """One start variable per alternative; at most one alternative per workload."""
    by_w: dict[str, list[_Alt]] = defaultdict(list)
    for a in alts:
        a.var = m.new_bool_var(f"start[{a.workload.name}|{a.model}|t{a.slot}]")
        by_w[a.workload.name].append(a)
    for group in by_w.values():
        m.add_at_most_one(a.var for a in group)


def _add_members(m: Any, a: _Alt, v: _Vars, usage: _Usage) -> dict[str, Any]:
    """Place every member of a start-now alternative on one of its nodes (and GPUs).

    Returns node -> the variable that says the gang uses the node.
    """
    from ortools.sat.python.cp_model import LinearExpr

    w = a.workload
    # A single pod uses a node exactly when it is on it: no separate `uses` variable.
    single = w.replicas == 1
    used: dict[str, Any] = (
        {} if single else {n.name: v.new_used(w.name, a.model, n.name) for n in a.nodes}
    )
    for member in w.member_names():
        ys = []
        for n in a.nodes:
            y = v.new_on(member, a.model, n.name)
            ys.append(y)
            if single:
                used[n.name] = y
            else:
                m.add_implication(y, used[n.name])
            usage.cpu[n.name].append((w.pod.cpu_milli, y))
            usage.mem[n.name].append((w.pod.memory_mib, y))
            if _counted(w):
                usage.whole[n.name].append((w.pod.num_gpus, y))
            elif w.pod.num_gpus:
                zs = []
                for g in n.gpus:
                    if g.free_milli < w.pod.gpu_milli:
                        continue
                    z = v.new_gpu(member, a.model, n.name, g.index)
                    zs.append(z)
                    usage.gpu[n.name, g.index].append((w.pod.gpu_milli, w.pod.gpu_memory_mib, z))
                m.add(LinearExpr.sum(zs) == w.pod.num_gpus * y)
        m.add(LinearExpr.sum(ys) == a.var)
    return used


def _add_strategy(
    m: Any, a: _Alt, v: _Vars, used: dict[str, Any], settings: BatchSettings
) -> list[Penalty]:
    """STRICT_PACK / STRICT_SPREAD as constraints; PACK / SPREAD as objective terms."""
    w = a.workload
    nodes_used = list(used.values())
    if w.strategy is PlacementStrategy.STRICT_PACK:
        m.add(sum(nodes_used) <= 1)
    elif w.strategy is PlacementStrategy.STRICT_SPREAD:
        for n in a.nodes:
            m.add(sum(v.on[x, a.model, n.name] for x in w.member_names()) <= 1)
    elif w.strategy is PlacementStrategy.PACK:
        return [(settings.pack_weight, u, f"pack[{a.tag}]") for u in nodes_used]
    else:
        return [(-settings.spread_weight, u, f"spread[{a.tag}]") for u in nodes_used]
    return []


def _add_topology(m: Any, a: _Alt, used: dict[str, Any]) -> None:
    """All nodes a gang uses share one topology domain (zone, rack, NVLink domain)."""
    key = a.workload.same_topology
    if not key:
        return
    domains = sorted({getattr(n, key) for n in a.nodes})
    dvars = {d: m.new_bool_var(f"domain[{a.tag}|{d}]") for d in domains}
    m.add(sum(dvars.values()) <= 1)
    for n in a.nodes:
        m.add_implication(used[n.name], dvars[getattr(n, key)])


def _add_node_capacity(
    m: Any, snapshot: ClusterSnapshot, usage: _Usage, v: _Vars, settings: BatchSettings
) -> list[Penalty]:
    """Per node CPU and memory, per GPU share and device memory, whole GPUs by count.

    A share that opens a fully free GPU is charged the fragmentation weight.
    """
    from ortools.sat.python.cp_model import LinearExpr

    penalties: list[Penalty] = []
    for node in snapshot.nodes:
        if node.name in usage.cpu:
            m.add(_wsum(usage.cpu[node.name]) <= node.free_cpu)
            m.add(_wsum(usage.mem[node.name]) <= node.free_memory)
        for g in node.gpus:
            uses = usage.gpu.get((node.name, g.index))
            if not uses:
                continue
            m.add(_wsum([(s, z) for s, _, z in uses]) <= g.free_milli)
            if g.memory_mib:
                m.add(sum(mm * z for _, mm, z in uses) <= g.free_mem)
            if g.free_milli == MILLI and any(s < MILLI for s, _, _ in uses):
                opened = v.new_opened(node.name, g.index)
                # Linear form of "a share here opens the GPU": a much tighter LP bound
                # than one implication per share, so CP-SAT proves its gap limit quickly.
                m.add(sum(s * z for s, _, z in uses if s < MILLI) <= MILLI * opened)
                penalties.append((settings.frag_weight, opened, "fragmentation"))
        if usage.whole.get(node.name):
            # Whole-GPU pods are counted, not assigned GPU by GPU (that would make most
            # of the model): they share the node's fully free GPUs with shares that open one.
            busy = []
            for g in node.gpus:
                if g.free_milli != MILLI:
                    continue
                if (node.name, g.index) in v.opened:
                    busy.append(v.opened[node.name, g.index])
                busy += [z for s, _, z in usage.gpu.get((node.name, g.index), []) if s == MILLI]
            full = sum(1 for g in node.gpus if g.free_milli == MILLI)
            m.add(_wsum(usage.whole[node.name]) + LinearExpr.sum(busy) <= full)
    return penalties


def _free_by_model(snapshot: ClusterSnapshot) -> dict[str, int]:
    free: dict[str, int] = defaultdict(int)
    for n in snapshot.nodes:
        for g in n.gpus:
            free[n.gpu_model] += g.free_milli
    return free


def _add_reservations(
    m: Any,
    alts: list[_Alt],
    models: set[str],
    free_by_model: dict[str, int],
    settings: BatchSettings,
) -> list[Penalty]:
    """Later starts reserve GPU share per model and slot (today's use assumed to persist).

    A later start cannot be packed yet; it is charged the fragmentation of opening
    a GPU per share member, so deferring is never a way to dodge that term.
    """
    penalties: list[Penalty] = [
        (settings.frag_weight * a.workload.replicas, a.var, "fragmentation")
        for a in alts
        if a.slot > 0 and a.workload.pod.is_share
    ]
    for model_name in models:
        for slot in range(settings.horizon_slots):
            terms = [
                a.workload.pod.total_gpu_milli * a.workload.replicas * a.var
                for a in alts
                if a.model == model_name and a.slot <= slot < a.slot + _span(a, settings)
            ]
            if terms:
                m.add(sum(terms) <= free_by_model[model_name])
    return penalties


def _set_objective(m: Any, alts: list[_Alt], penalties: list[Penalty]) -> None:
    """Maximise total utility minus the penalties."""
    m.maximize(
        _wsum([(a.value, a.var) for a in alts])
        - _wsum([(round(wt * SCALE), var) for wt, var, _ in penalties])
    )


def _solve(m: Any, settings: BatchSettings) -> tuple[Any, Any, str]:
    """Run CP-SAT with the settings' limits; (solver, status, status name)."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = settings.time_limit_s
    solver.parameters.relative_gap_limit = settings.gap_limit
    # Symmetry detection and probing cost most of the presolve time on openb pods
    # (identical GPUs make huge orbits) and did not pay for themselves.
    solver.parameters.symmetry_level = 0
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.random_seed = settings.seed
    solver.parameters.num_workers = settings.workers
    status = solver.solve(m)
    return solver, status, solver.status_name(status)


def plan(snapshot: ClusterSnapshot, workloads: list[Workload], settings: BatchSettings) -> Plan:
    """Choose alternatives and place what starts now. Pure; blocks for up to the time limit."""
    from ortools.sat.python import cp_model

    running = [w for w in workloads if w.running_on]
    workloads = [w for w in workloads if not w.running_on]
    models = {n.gpu_model for n in snapshot.nodes if n.gpus}
    alts, early = _enumerate_alternatives(workloads, models, snapshot.time_s, settings)
    m = cp_model.CpModel()
    _add_choice(m, alts)
    now_alts = [x for x in alts if x.slot == 0]
    cands, picks = greedy_candidates(
        snapshot, [(a.workload, a.model, a.value) for a in now_alts], settings.candidate_nodes
    )
    context = _Context(snapshot, workloads, running, settings, alts, picks, early)
    if settings.hint is None:
        quick = _greedy_within_gap(context)
        if quick is not None:
            return quick
    v, usage = _Vars(m), _Usage()
    penalties: list[Penalty] = []
    for a in now_alts:
        a.nodes = [snapshot.nodes[i] for i in cands.get((a.workload.name, a.model), [])]
        if not a.nodes:
            m.add(a.var == 0)
            continue
        used = _add_members(m, a, v, usage)
        penalties += _add_strategy(m, a, v, used, settings)
        _add_topology(m, a, used)
    penalties += _add_node_capacity(m, snapshot, usage, v, settings)
    free_by_model = _free_by_model(snapshot)
    penalties += _add_reservations(m, alts, models, free_by_model, settings)
    _set_objective(m, alts, penalties)
    if settings.hint is not None:
        _apply_hint(m, settings.hint, alts, v)
    else:
        later = _defer_greedily(alts, picks, settings, free_by_model)
        _apply_greedy(m, snapshot=snapshot, picks=picks, alts=alts, v=v, later=later)
    solver, status, status_name = _solve(m, settings)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        fallback = None if settings.hint is not None else _greedy_within_gap(context, force=True)
        if fallback is not None:
            return fallback
        return Plan(
            status=status_name,
            unplaced=tuple(
                Unplaced(
                    name=w.name,
                    reasons=(
                        Reason(code="SolverNoSolution", message=f"solver returned {status_name}"),
                    ),
                )
                for w in workloads
            ),
        )
    return _extract(context, solver, v=v, usage=usage, penalties=penalties, status_name=status_name)


@dataclass(frozen=True)
class _Context:
    """What one `plan` call works on, for the helpers that read it."""

    snapshot: ClusterSnapshot
    workloads: list[Workload]
    running: list[Workload]
    settings: BatchSettings
    alts: list[_Alt]
    picks: dict[str, GreedyPick]
    early: dict[str, list[Reason]]


def _not_placed(
    c: _Context, placed: Container[str], *, outbid: str
) -> tuple[list[Unplaced], dict[str, tuple[str, ...]]]:
    """Why each workload not in `placed` was not started, and who could make room.

    The reasons were found before solving, per node, or the workload was outbid;
    the running preemptible lower-priority workloads that could make room are
    listed only for workloads that have some.
    """
    unplaced: list[Unplaced] = []
    candidates: dict[str, tuple[str, ...]] = {}
    for w in c.workloads:
        if w.name in placed:
            continue
        reasons = list(c.early.get(w.name, [])) or node_reasons(c.snapshot, w.pod)
        if not reasons:
            gang = _gang_reason(c.snapshot, w)
            reasons = [gang or Reason(code="OutbidInWindow", message=outbid)]
        unplaced.append(Unplaced(name=w.name, reasons=tuple(reasons)))
        victims = tuple(v.name for v in c.running if v.preemptible and v.priority < w.priority)
        if victims:
            candidates[w.name] = victims
    return unplaced, candidates


def _members_that_fit(node: Node, w: Workload, *, free: bool) -> int:
    """How many members of `w` the node holds, on what is free now or when empty."""
    pod = w.pod
    if not pod.may_use(node.name):
        return 0
    if pod.num_gpus and (not node.gpus or not pod.allows(node.gpu_model)):
        return 0
    cpu, mem = (node.free_cpu, node.free_memory) if free else (node.cpu_milli, node.memory_mib)
    fit = [cpu // pod.cpu_milli if pod.cpu_milli else w.replicas]
    fit.append(mem // pod.memory_mib if pod.memory_mib else w.replicas)
    if pod.is_share:
        fit.append(sum((g.free_milli if free else MILLI) // pod.gpu_milli for g in node.gpus))
    elif pod.num_gpus:
        whole = node.free_whole_gpus if free else len(node.gpus)
        fit.append(whole // pod.num_gpus)
    most = min(fit)
    return min(most, 1) if w.strategy is PlacementStrategy.STRICT_SPREAD else most


def _gang_reason(snapshot: ClusterSnapshot, w: Workload) -> Reason | None:
    """Why a gang whose every member fits some node alone still cannot start, or None.

    Unresolvable when the empty cluster holds fewer members than the gang has;
    else, when fewer members fit on what is free now, it may clear.
    """
    if w.replicas <= 1:
        return None
    pack = w.strategy is PlacementStrategy.STRICT_PACK
    for free in (False, True):
        counts = [_members_that_fit(n, w, free=free) for n in snapshot.nodes]
        most = max(counts, default=0) if pack else sum(counts)
        if most >= w.replicas:
            continue
        where = "one node" if pack else "the cluster"
        if not free:
            return Reason(
                code="GangTooLarge",
                message=f"the gang has {w.replicas} members of {w.pod.describe_gpus()}; "
                f"{where} holds at most {most} even when empty",
                unresolvable=True,
            )
        return Reason(
            code="InsufficientGpu",
            message=f"only {most} of the gang's {w.replicas} members fit on {where}'s "
            "free resources now",
        )
    return None


def _greedy_within_gap(c: _Context, *, force: bool = False) -> Plan | None:
    """The greedy plan when its utility is optimal (or `force`); else None.

    When the greedy pass started every workload at its best alternative (any
    slot), no plan has more utility; what is left to gain is only in the small
    fragmentation and PACK/SPREAD terms (0.05 and 0.01 of a workload's
    utility), which do not pay for the solver's time (docs/solver.md).
    `force` returns it anyway: the fallback when CP-SAT finds no solution in
    its time limit, so a hard cycle still starts what fits.
    """
    best: dict[str, int] = {}
    value_now: dict[tuple[str, str], int] = {}
    for a in c.alts:
        best[a.workload.name] = max(best.get(a.workload.name, 0), a.value)
        if a.slot == 0:
            value_now[a.workload.name, a.model] = a.value
    if not force and set(best) != set(c.picks):
        return None
    upper = float(sum(best.values()))
    got = 0.0
    terms: dict[str, float] = defaultdict(float)
    placements: list[Placement] = []
    opened: set[tuple[int, int]] = set()
    by_name = {w.name: w for w in c.workloads}
    settings = c.settings
    for name, pick in c.picks.items():
        w = by_name[name]
        got += value_now[name, pick.gpu_model]
        nodes = {idx for idx, _ in pick.members.values()}
        if w.strategy is PlacementStrategy.PACK:
            terms["pack"] += settings.pack_weight * len(nodes)
        elif w.strategy not in (PlacementStrategy.STRICT_PACK, PlacementStrategy.STRICT_SPREAD):
            terms["spread"] -= settings.spread_weight * len(nodes)
        for member, (idx, gpus) in pick.members.items():
            node = c.snapshot.nodes[idx]
            free = {g.index: g.free_milli for g in node.gpus}
            if w.pod.is_share and free[gpus[0]] == MILLI:
                opened.add((idx, gpus[0]))
            placements.append(
                Placement(
                    pod=member,
                    node=node.name,
                    gpu_indices=gpus,
                    gpu_milli=w.pod.gpu_milli,
                    start_s=c.snapshot.time_s,
                )
            )
    terms["fragmentation"] = settings.frag_weight * len(opened)
    if not force and got < upper:
        return None
    terms["utility"] = got / SCALE
    unplaced, candidates = _not_placed(
        c, c.picks, outbid="room exists, but the greedy fallback gave it to other workloads"
    )
    return Plan(
        placements=tuple(placements),
        chosen={name: pick.gpu_model for name, pick in c.picks.items()},
        unplaced=tuple(unplaced),
        preemption_candidates=candidates,
        utility=got / SCALE,
        status="GREEDY_FALLBACK" if force else "FEASIBLE",
        objective_terms=dict(terms),
    )


def _wsum(terms: list[tuple[int, Any]]) -> Any:
    """Weighted sum of (coefficient, variable) pairs, built in C++ (Python `sum` was slow)."""
    from ortools.sat.python import cp_model

    return cp_model.LinearExpr.weighted_sum([v for _, v in terms], [c for c, _ in terms])


def _counted(w: Workload) -> bool:
    """Whole-GPU pods without a device-memory need get a GPU count per node, not GPU vars."""
    return w.pod.num_gpus > 0 and w.pod.gpu_milli == MILLI and not w.pod.gpu_memory_mib


def _span(a: _Alt, settings: BatchSettings) -> int:
    """Slots an alternative occupies from its start slot."""
    return max(1, int(-(-a.alt.duration_s // settings.slot_s)))


def _defer_greedily(
    alts: list[_Alt],
    picks: dict[str, GreedyPick],
    settings: BatchSettings,
    free_by_model: dict[str, int],
) -> set[int]:
    """Later-start alternatives for the workloads the greedy pass did not start now.

    Most valuable first, each takes its best later alternative whose model still
    has GPU share in every slot it spans (the per-model reservation of `plan`,
    counting what the greedy pass started now). On a contended cluster most
    pending work is deferred; hinting none of it left CP-SAT a hint worth a
    quarter of the optimum and seconds of search (docs/solver.md). Returns the
    ids of the chosen alternatives.
    """
    use: dict[tuple[str, int], int] = defaultdict(int)

    def demand(a: _Alt) -> int:
        return a.workload.pod.total_gpu_milli * a.workload.replicas

    for a in alts:
        pick = picks.get(a.workload.name)
        if a.slot == 0 and pick is not None and pick.gpu_model == a.alt.gpu_model:
            for t in range(_span(a, settings)):
                use[a.alt.gpu_model, t] += demand(a)
    later: dict[str, list[_Alt]] = defaultdict(list)
    for a in alts:
        if a.slot > 0 and a.workload.name not in picks:
            later[a.workload.name].append(a)
    chosen: set[int] = set()
    order = sorted(later.values(), key=lambda opts: -max(a.value for a in opts))
    for opts in order:
        for a in sorted(opts, key=lambda x: -x.value):
            window = range(a.slot, min(a.slot + _span(a, settings), settings.horizon_slots))
            cap = free_by_model.get(a.alt.gpu_model, 0)
            if all(use[a.alt.gpu_model, t] + demand(a) <= cap for t in window):
                for t in window:
                    use[a.alt.gpu_model, t] += demand(a)
                chosen.add(id(a))
                break
    return chosen


def _apply_greedy(
    m: Any,
    *,
    snapshot: ClusterSnapshot,
    picks: dict[str, GreedyPick],
    alts: list[_Alt],
    v: _Vars,
    later: set[int],
) -> None:
    """Hint the greedy placement and deferrals (a complete feasible solution) to CP-SAT."""
    on_hint: set[tuple[str, str, str]] = set()
    gpu_hint: set[tuple[str, str, str, int]] = set()
    used_hint: set[tuple[str, str, str]] = set()
    opened_hint: set[tuple[str, int]] = set()
    shares = {a.workload.name for a in alts if a.workload.pod.is_share}
    for name, pick in picks.items():
        model = pick.gpu_model
        for member, (idx, gpus) in pick.members.items():
            node = snapshot.nodes[idx]
            on_hint.add((member, model, node.name))
            used_hint.add((name, model, node.name))
            free = {g.index: g.free_milli for g in node.gpus}
            for g in gpus:
                gpu_hint.add((member, model, node.name, g))
                if name in shares and free[g] == MILLI:
                    opened_hint.add((node.name, g))
    chosen = {name: pick.gpu_model for name, pick in picks.items()}
    for a in alts:
        now = a.slot == 0 and chosen.get(a.workload.name) == a.model
        m.add_hint(a.var, int(now or id(a) in later))
    for on_key, var in v.on.items():
        m.add_hint(var, int(on_key in on_hint))
    for gpu_key, var in v.gpu.items():
        m.add_hint(var, int(gpu_key in gpu_hint))
    for used_key, var in v.used.items():
        m.add_hint(var, int(used_key in used_hint))
    for opened_key, var in v.opened.items():
        m.add_hint(var, int(opened_key in opened_hint))


def _apply_hint(m: Any, hint: Plan, alts: list[_Alt], v: _Vars) -> None:
    """Hint a previous plan: its chosen and deferred alternatives, its members' nodes."""
    deferred = {(d.workload, d.gpu_model) for d in hint.deferred}
    for a in alts:
        chosen = hint.chosen.get(a.workload.name) == a.model and a.slot == 0
        later = (a.workload.name, a.model) in deferred and a.slot == 0
        m.add_hint(a.var, 1 if (chosen or later) else 0)
    placed = {(p.pod, p.node) for p in hint.placements}
    for (member, _model, node), var in v.on.items():
        m.add_hint(var, 1 if (member, node) in placed else 0)


def _member_gpus(
    a: _Alt,
    member: str,
    node: Node,
    *,
    val: Any,
    v: _Vars,
    usage: _Usage,
    pool: dict[str, list[int]],
) -> tuple[int, ...]:
    """The GPUs a placed member takes.

    Its GPU variables, or (counted whole GPUs) the first of the node's fully
    free GPUs no assigned member took.
    """
    w = a.workload
    if not _counted(w):
        return tuple(
            g.index
            for g in node.gpus
            if (member, a.model, node.name, g.index) in v.gpu
            and val(v.gpu[member, a.model, node.name, g.index])
        )
    if node.name not in pool:
        pool[node.name] = [
            g.index
            for g in node.gpus
            if g.free_milli == MILLI
            and not any(val(z) for _, _, z in usage.gpu.get((node.name, g.index), []))
        ]
    gpus = tuple(pool[node.name][: w.pod.num_gpus])
    del pool[node.name][: w.pod.num_gpus]
    return gpus


def _extract(
    c: _Context,
    solver: Any,
    *,
    v: _Vars,
    usage: _Usage,
    penalties: list[Penalty],
    status_name: str,
) -> Plan:
    """The plan the solver found: placements of what starts now, deferrals, reasons."""
    val = solver.value
    placements: list[Placement] = []
    chosen: dict[str, str] = {}
    deferred: list[Deferred] = []
    started: set[str] = set()
    pool: dict[str, list[int]] = {}
    utility = 0.0
    for a in c.alts:
        if not val(a.var):
            continue
        w = a.workload
        utility += a.value / SCALE
        started.add(w.name)
        if a.slot > 0:
            deferred.append(
                Deferred(
                    workload=w.name,
                    gpu_model=a.model,
                    start_s=c.snapshot.time_s + a.slot * c.settings.slot_s,
                )
            )
            continue
        chosen[w.name] = a.model
        for member in w.member_names():
            node = next(n for n in a.nodes if val(v.on[member, a.model, n.name]))
            placements.append(
                Placement(
                    pod=member,
                    node=node.name,
                    gpu_indices=_member_gpus(a, member, node, val=val, v=v, usage=usage, pool=pool),
                    gpu_milli=w.pod.gpu_milli,
                    start_s=c.snapshot.time_s,
                )
            )
    terms: dict[str, float] = defaultdict(float)
    for wt, var, label in penalties:
        terms[label.split("[")[0]] += wt * val(var)
    terms["utility"] = utility
    unplaced, candidates = _not_placed(
        c, started, outbid="room exists, but higher-utility workloads took it in this window"
    )
    return Plan(
        placements=tuple(placements),
        chosen=chosen,
        deferred=tuple(deferred),
        unplaced=tuple(unplaced),
        preemption_candidates=candidates,
        utility=utility,
        status=status_name,
        objective_terms=dict(terms),
    )


async def plan_async(
    snapshot: ClusterSnapshot, workloads: list[Workload], settings: BatchSettings
) -> Plan:
    """`plan` on a worker thread, so the operator's event loop keeps running."""
    return await asyncio.to_thread(plan, snapshot, workloads, settings)
