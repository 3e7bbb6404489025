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
    workload: Workload
    alt: Alternative
    slot: int
    value: int
    var: Any = None
    nodes: list[Node] = field(default_factory=list)


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


def plan(snapshot: ClusterSnapshot, workloads: list[Workload], settings: BatchSettings) -> Plan:
    """Choose alternatives and place what starts now. Pure; blocks for up to the time limit."""
    from ortools.sat.python import cp_model

    _lin = cp_model.LinearExpr

    running = [w for w in workloads if w.running_on]
    workloads = [w for w in workloads if not w.running_on]
    m = cp_model.CpModel()
    now = snapshot.time_s
    models = {n.gpu_model for n in snapshot.nodes if n.gpus}
    alts: list[_Alt] = []
    early: dict[str, list[Reason]] = defaultdict(list)
    alts_of: dict[str, bool] = {}
    for w in workloads:
        options = _alternatives(w, models)
        if not options:
            early[w.name].append(
                Reason(code="NoGpuModel", message="no GPU model it allows is in the cluster")
            )
        for opt in options:
            for s in range(settings.horizon_slots):
                finish = now + s * settings.slot_s + opt.duration_s
                if w.deadline_s is not None and finish > w.deadline_s:
                    continue
                weight = opt.utility * (1 + max(w.priority, 0)) * (1 - settings.delay_discount * s)
                if weight <= 0:
                    continue
                alts.append(_Alt(w, opt, s, round(weight * SCALE)))
                alts_of[w.name] = True
        if options and not alts_of.get(w.name):
            fastest = min(o.duration_s for o in options)
            early[w.name].append(
                Reason(
                    code="DeadlineUnmeetable",
                    message=f"deadline {w.deadline_s:.0f}s cannot be met: the fastest alternative "
                    f"finishes at {now + fastest:.0f}s (utility 0)",
                )
            )
    by_w: dict[str, list[_Alt]] = defaultdict(list)
    for a in alts:
        a.var = m.new_bool_var(f"start[{a.workload.name}|{a.alt.gpu_model}|t{a.slot}]")
        by_w[a.workload.name].append(a)
    for group in by_w.values():
        m.add_at_most_one(a.var for a in group)

    cpu_use: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    mem_use: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    gpu_use: dict[tuple[str, int], list[tuple[int, int, Any]]] = defaultdict(list)
    penalties: list[tuple[float, Any, str]] = []
    on_vars: dict[tuple[str, str], Any] = {}
    gpu_vars: dict[tuple[str, str, int], Any] = {}
    used_vars: dict[tuple[str, str], Any] = {}
    whole_use: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    now_alts = [x for x in alts if x.slot == 0]
    cands, picks = greedy_candidates(
        snapshot,
        [(a.workload, a.alt.gpu_model, a.value) for a in now_alts],
        settings.candidate_nodes,
    )
    if settings.hint is None:
        quick = _greedy_within_gap(
            snapshot,
            workloads=workloads,
            running=running,
            settings=settings,
            alts=alts,
            picks=picks,
            early=early,
        )
        if quick is not None:
            return quick
    for a in now_alts:
        w = a.workload
        a.nodes = [snapshot.nodes[i] for i in cands.get((w.name, a.alt.gpu_model), [])]
        if not a.nodes:
            m.add(a.var == 0)
            continue
        tag = f"{w.name}|{a.alt.gpu_model}"
        # A single pod uses a node exactly when it is on it: no separate `uses` variable.
        single = w.replicas == 1
        used_node = (
            {} if single else {n.name: m.new_bool_var(f"uses[{tag}|{n.name}]") for n in a.nodes}
        )
        for member in w.member_names():
            ys = []
            for n in a.nodes:
                y = m.new_bool_var(f"on[{member}|{a.alt.gpu_model}|{n.name}]")
                on_vars[member + "|" + a.alt.gpu_model, n.name] = y
                ys.append(y)
                if single:
                    used_node[n.name] = y
                else:
                    m.add_implication(y, used_node[n.name])
                cpu_use[n.name].append((w.pod.cpu_milli, y))
                mem_use[n.name].append((w.pod.memory_mib, y))
                if _counted(w):
                    whole_use[n.name].append((w.pod.num_gpus, y))
                elif w.pod.num_gpus:
                    zs = []
                    for g in n.gpus:
                        if g.free_milli < w.pod.gpu_milli:
                            continue
                        z = m.new_bool_var(f"gpu[{member}|{a.alt.gpu_model}|{n.name}|{g.index}]")
                        gpu_vars[member + "|" + a.alt.gpu_model, n.name, g.index] = z
                        zs.append(z)
                        gpu_use[n.name, g.index].append((w.pod.gpu_milli, w.pod.gpu_memory_mib, z))
                    m.add(_lin.sum(zs) == w.pod.num_gpus * y)
            m.add(_lin.sum(ys) == a.var)
        if not single:
            for n in a.nodes:
                used_vars[tag, n.name] = used_node[n.name]
        nodes_used = list(used_node.values())
        if w.strategy is PlacementStrategy.STRICT_PACK:
            m.add(sum(nodes_used) <= 1)
        elif w.strategy is PlacementStrategy.STRICT_SPREAD:
            for n in a.nodes:
                m.add(
                    sum(on_vars[x + "|" + a.alt.gpu_model, n.name] for x in w.member_names()) <= 1
                )
        elif w.strategy is PlacementStrategy.PACK:
            penalties += [(settings.pack_weight, u, f"pack[{tag}]") for u in nodes_used]
        else:
            penalties += [(-settings.spread_weight, u, f"spread[{tag}]") for u in nodes_used]
        if w.same_topology:
            domains = sorted({getattr(n, w.same_topology) for n in a.nodes})
            dvars = {d: m.new_bool_var(f"domain[{tag}|{d}]") for d in domains}
            m.add(sum(dvars.values()) <= 1)
            for n in a.nodes:
                m.add_implication(used_node[n.name], dvars[getattr(n, w.same_topology)])
    opened_vars: dict[tuple[str, int], Any] = {}
    for node in snapshot.nodes:
        if node.name in cpu_use:
            m.add(_wsum(cpu_use[node.name]) <= node.free_cpu)
            m.add(_wsum(mem_use[node.name]) <= node.free_memory)
        for g in node.gpus:
            uses = gpu_use.get((node.name, g.index))
            if not uses:
                continue
            m.add(_wsum([(s, z) for s, _, z in uses]) <= g.free_milli)
            if g.memory_mib:
                m.add(sum(mm * z for _, mm, z in uses) <= g.free_mem)
            if g.free_milli == MILLI and any(s < MILLI for s, _, _ in uses):
                opened = m.new_bool_var(f"opened[{node.name}|{g.index}]")
                opened_vars[node.name, g.index] = opened
                # Linear form of "a share here opens the GPU": much tighter LP bound than
                # one implication per share, so CP-SAT proves its gap limit quickly.
                m.add(sum(s * z for s, _, z in uses if s < MILLI) <= MILLI * opened)
                penalties.append((settings.frag_weight, opened, "fragmentation"))
        if whole_use.get(node.name):
            # Whole-GPU pods are counted, not assigned GPU by GPU (that made most of the
            # model): they share the node's fully free GPUs with shares that open one.
            busy = []
            for g in node.gpus:
                if g.free_milli != MILLI:
                    continue
                if (node.name, g.index) in opened_vars:
                    busy.append(opened_vars[node.name, g.index])
                busy += [z for s, _, z in gpu_use.get((node.name, g.index), []) if s == MILLI]
            full = sum(1 for g in node.gpus if g.free_milli == MILLI)
            m.add(_wsum(whole_use[node.name]) + _lin.sum(busy) <= full)
    # A later start cannot be packed yet; charge it the fragmentation of opening a GPU
    # per share member, so deferring is never a way to dodge the fragmentation term.
    for a in alts:
        if a.slot > 0 and a.workload.pod.is_share:
            penalties.append((settings.frag_weight * a.workload.replicas, a.var, "fragmentation"))
    # Later starts reserve GPU share per model and slot (current usage assumed to persist).
    free_by_model: dict[str, int] = defaultdict(int)
    for n in snapshot.nodes:
        for g in n.gpus:
            free_by_model[n.gpu_model] += g.free_milli
    for model_name in models:
        for slot in range(settings.horizon_slots):
            terms = []
            for a in alts:
                if a.alt.gpu_model != model_name:
                    continue
                if a.slot <= slot < a.slot + _span(a, settings):
                    terms.append(a.workload.pod.total_gpu_milli * a.workload.replicas * a.var)
            if terms:
                m.add(sum(terms) <= free_by_model[model_name])
    m.maximize(
        _wsum([(a.value, a.var) for a in alts])
        - _wsum([(round(wt * SCALE), v) for wt, v, _ in penalties])
    )
    if settings.hint is not None:
        _apply_hint(m, settings.hint, alts, on_vars)
    else:
        _apply_greedy(
            m,
            snapshot=snapshot,
            picks=picks,
            alts=alts,
            on_vars=on_vars,
            gpu_vars=gpu_vars,
            used_vars=used_vars,
            opened_vars=opened_vars,
            later=_defer_greedily(alts, picks, settings, free_by_model),
        )
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = settings.time_limit_s
    solver.parameters.relative_gap_limit = settings.gap_limit
    # Symmetry detection and probing took 5 of 7 presolve seconds on 50 openb pods
    # (identical GPUs make huge orbits) and did not pay for themselves.
    solver.parameters.symmetry_level = 0
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.random_seed = settings.seed
    solver.parameters.num_workers = settings.workers
    status = solver.solve(m)
    status_name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE) and settings.hint is None:
        fallback = _greedy_within_gap(
            snapshot,
            workloads=workloads,
            running=running,
            settings=settings,
            alts=alts,
            picks=picks,
            early=early,
            force=True,
        )
        if fallback is not None:
            return fallback
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
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
    return _extract(
        snapshot,
        workloads=workloads,
        running=running,
        settings=settings,
        solver=solver,
        alts=alts,
        on_vars=on_vars,
        gpu_vars=gpu_vars,
        gpu_use=gpu_use,
        penalties=penalties,
        early=early,
        status_name=status_name,
    )


def _not_placed(
    workloads: list[Workload],
    placed: Container[str],
    *,
    snapshot: ClusterSnapshot,
    early: dict[str, list[Reason]],
    running: list[Workload],
    outbid: str,
) -> tuple[list[Unplaced], dict[str, tuple[str, ...]]]:
    """Why each workload not in `placed` was not started (found before solving, per
    node, or outbid), and the running preemptible lower-priority workloads that
    could make room for it (only for those that have some)."""
    unplaced: list[Unplaced] = []
    candidates: dict[str, tuple[str, ...]] = {}
    for w in workloads:
        if w.name in placed:
            continue
        reasons = list(early.get(w.name, [])) or node_reasons(snapshot, w.pod)
        if not reasons:
            reasons = [Reason(code="OutbidInWindow", message=outbid)]
        unplaced.append(Unplaced(name=w.name, reasons=tuple(reasons)))
        victims = tuple(v.name for v in running if v.preemptible and v.priority < w.priority)
        if victims:
            candidates[w.name] = victims
    return unplaced, candidates


def _greedy_within_gap(
    snapshot: ClusterSnapshot,
    *,
    workloads: list[Workload],
    running: list[Workload],
    settings: BatchSettings,
    alts: list[_Alt],
    picks: dict[str, GreedyPick],
    early: dict[str, list[Reason]],
    force: bool = False,
) -> Plan | None:
    """The greedy plan when its utility is optimal (or `force`); else None.

    When the greedy pass started every workload at its best alternative (any
    slot), no plan has more utility; what is left to gain is only in the small
    fragmentation and PACK/SPREAD terms (0.05 and 0.01 of a workload's
    utility), which did not pay for the solver's time on openb (docs/solver.md).
    `force` returns it anyway: the fallback when CP-SAT finds no solution in
    its time limit, so a hard cycle still starts what fits.
    """
    best: dict[str, int] = {}
    value_now: dict[tuple[str, str], int] = {}
    for a in alts:
        best[a.workload.name] = max(best.get(a.workload.name, 0), a.value)
        if a.slot == 0:
            value_now[a.workload.name, a.alt.gpu_model] = a.value
    if not force and set(best) != set(picks):
        return None
    upper = float(sum(best.values()))
    got = 0.0
    terms: dict[str, float] = defaultdict(float)
    placements: list[Placement] = []
    opened: set[tuple[int, int]] = set()
    by_name = {w.name: w for w in workloads}
    for name, pick in picks.items():
        w = by_name[name]
        got += value_now[name, pick.gpu_model]
        nodes = {idx for idx, _ in pick.members.values()}
        if w.strategy is PlacementStrategy.PACK:
            terms["pack"] += settings.pack_weight * len(nodes)
        elif w.strategy not in (PlacementStrategy.STRICT_PACK, PlacementStrategy.STRICT_SPREAD):
            terms["spread"] -= settings.spread_weight * len(nodes)
        for member, (idx, gpus) in pick.members.items():
            node = snapshot.nodes[idx]
            if w.pod.is_share and node.gpus[gpus[0]].free_milli == MILLI:
                opened.add((idx, gpus[0]))
            placements.append(
                Placement(
                    pod=member,
                    node=node.name,
                    gpu_indices=tuple(node.gpus[g].index for g in gpus),
                    gpu_milli=w.pod.gpu_milli,
                    start_s=snapshot.time_s,
                )
            )
    terms["fragmentation"] = settings.frag_weight * len(opened)
    if not force and got < upper:
        return None
    terms["utility"] = got / SCALE
    unplaced, candidates = _not_placed(
        workloads,
        picks,
        snapshot=snapshot,
        early=early,
        running=running,
        outbid="room exists, but the greedy fallback gave it to other workloads",
    )
    return Plan(
        placements=tuple(placements),
        chosen={name: pick.gpu_model for name, pick in picks.items()},
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
    on_vars: dict[tuple[str, str], Any],
    gpu_vars: dict[tuple[str, str, int], Any],
    used_vars: dict[tuple[str, str], Any],
    opened_vars: dict[tuple[str, int], Any],
    later: set[int],
) -> None:
    """Hint the greedy placement and deferrals (a complete feasible solution) to CP-SAT."""
    on_hint: set[tuple[str, str]] = set()
    gpu_hint: set[tuple[str, str, int]] = set()
    used_hint: set[tuple[str, str]] = set()
    opened_hint: set[tuple[str, int]] = set()
    shares = {a.workload.name for a in alts if a.workload.pod.is_share}
    for name, pick in picks.items():
        for member, (idx, gpus) in pick.members.items():
            node = snapshot.nodes[idx]
            key = member + "|" + pick.gpu_model
            on_hint.add((key, node.name))
            used_hint.add((f"{name}|{pick.gpu_model}", node.name))
            free = {g.index: g.free_milli for g in node.gpus}
            for g in gpus:
                gpu_hint.add((key, node.name, g))
                if name in shares and free[g] == MILLI:
                    opened_hint.add((node.name, g))
    chosen = {name: pick.gpu_model for name, pick in picks.items()}
    for a in alts:
        now = a.slot == 0 and chosen.get(a.workload.name) == a.alt.gpu_model
        m.add_hint(a.var, int(now or id(a) in later))
    for key2, var in on_vars.items():
        m.add_hint(var, int(key2 in on_hint))
    for key3, var in gpu_vars.items():
        m.add_hint(var, int(key3 in gpu_hint))
    for key2, var in used_vars.items():
        m.add_hint(var, int(key2 in used_hint))
    for key4, var in opened_vars.items():
        m.add_hint(var, int(key4 in opened_hint))


def _apply_hint(m: Any, hint: Plan, alts: list[_Alt], on_vars: dict[tuple[str, str], Any]) -> None:
    deferred = {(d.workload, d.gpu_model) for d in hint.deferred}
    for a in alts:
        chosen = hint.chosen.get(a.workload.name) == a.alt.gpu_model and a.slot == 0
        later = (a.workload.name, a.alt.gpu_model) in deferred and a.slot == 0
        m.add_hint(a.var, 1 if (chosen or later) else 0)
    placed = {(p.pod, p.node) for p in hint.placements}
    for (key, node), var in on_vars.items():
        member = key.rsplit("|", 1)[0]
        m.add_hint(var, 1 if (member, node) in placed else 0)


def _extract(
    snapshot: ClusterSnapshot,
    *,
    workloads: list[Workload],
    running: list[Workload],
    settings: BatchSettings,
    solver: Any,
    alts: list[_Alt],
    on_vars: dict[tuple[str, str], Any],
    gpu_vars: dict[tuple[str, str, int], Any],
    gpu_use: dict[tuple[str, int], list[tuple[int, int, Any]]],
    penalties: list[tuple[float, Any, str]],
    early: dict[str, list[Reason]],
    status_name: str,
) -> Plan:
    val = solver.value
    placements: list[Placement] = []
    chosen: dict[str, str] = {}
    deferred: list[Deferred] = []
    started: set[str] = set()
    pool: dict[str, list[int]] = {}
    utility = 0.0
    for a in alts:
        if not val(a.var):
            continue
        w = a.workload
        utility += a.value / SCALE
        started.add(w.name)
        if a.slot > 0:
            deferred.append(
                Deferred(
                    workload=w.name,
                    gpu_model=a.alt.gpu_model,
                    start_s=snapshot.time_s + a.slot * settings.slot_s,
                )
            )
            continue
        chosen[w.name] = a.alt.gpu_model
        for member in w.member_names():
            key = member + "|" + a.alt.gpu_model
            node = next(n for n in a.nodes if val(on_vars[key, n.name]))
            if _counted(w):
                if node.name not in pool:
                    pool[node.name] = [
                        g.index
                        for g in node.gpus
                        if g.free_milli == MILLI
                        and not any(val(z) for _, _, z in gpu_use.get((node.name, g.index), []))
                    ]
                gpus = tuple(pool[node.name][: w.pod.num_gpus])
                del pool[node.name][: w.pod.num_gpus]
            else:
                gpus = tuple(
                    g.index
                    for g in node.gpus
                    if (key, node.name, g.index) in gpu_vars
                    and val(gpu_vars[key, node.name, g.index])
                )
            placements.append(
                Placement(
                    pod=member,
                    node=node.name,
                    gpu_indices=gpus,
                    gpu_milli=w.pod.gpu_milli,
                    start_s=snapshot.time_s,
                )
            )
    terms: dict[str, float] = defaultdict(float)
    for wt, v, label in penalties:
        terms[label.split("[")[0]] += wt * val(v)
    terms["utility"] = utility
    unplaced, candidates = _not_placed(
        workloads,
        started,
        snapshot=snapshot,
        early=early,
        running=running,
        outbid="room exists, but higher-utility workloads took it in this window",
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
