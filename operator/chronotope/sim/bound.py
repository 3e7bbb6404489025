"""Upper bounds on GPU allocation for a given arrival sequence (LP relaxations).

The first two relax the *offline* problem over the same arrived pods: any
placement of them, online or offline, allocates at most this much. They do
not model the online protocol's "a pod that fits must be placed", which is
what actually limits the online policies (docs/solver.md), so they say where
the offline limit is. The third adds what that rule forces on every policy.

`allocation_upper_bound` (pooled LP): forget node boundaries inside a group of
identical nodes and pool its GPU share, CPU and memory; pods are taken
fractionally. It ignores that shares must fit on one GPU, so it reaches
100 % whenever enough share demand arrives.

`pattern_upper_bound` (per-GPU configuration LP): nodes are grouped into
classes (GPU model, GPUs per node, CPU, memory); GPU shares are packed into
per-GPU *patterns* (maximal multisets of the arrived share sizes that sum to
at most 1,000 milli), and a class's GPUs are split between patterns and
whole-GPU pods; CPU and memory are pooled per class; a pod of n whole GPUs
fits at most floor(G/n) times on a node of G GPUs. Every integral placement
gives a feasible point of this LP, so its optimum (GLOP) is a valid bound,
and a tighter one than the pooled LP.

`protocol_upper_bound`: the per-GPU LP plus the failure chains of the online
protocol (see its docstring); it bounds every online policy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from chronotope.solver.model import MILLI, ClusterSnapshot, PodRequest, is_share

__all__ = [
    "allocation_upper_bound",
    "dominates",
    "maximal_patterns",
    "pattern_upper_bound",
    "protocol_upper_bound",
]


def _solver() -> Any:
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with ortools
        raise RuntimeError("GLOP is not available")
    return solver


def allocation_upper_bound(cluster: ClusterSnapshot, arrived: Sequence[PodRequest]) -> float:
    """Pooled LP bound on allocated GPU share, in % of cluster GPU capacity."""
    groups: dict[tuple[str, int], list[int]] = {}
    for node in cluster.nodes:
        key = (node.gpu_model, len(node.gpus))
        pool = groups.setdefault(key, [0, 0, 0])
        pool[0] += len(node.gpus) * MILLI
        pool[1] += node.cpu_milli
        pool[2] += node.memory_mib
    classes = Counter(
        (p.cpu_milli, p.memory_mib, p.num_gpus, p.gpu_milli, p.gpu_models) for p in arrived
    )
    solver = _solver()
    use: dict[tuple[int, tuple[str, int]], Any] = {}
    objective = solver.Objective()
    for ci, (cls, count) in enumerate(classes.items()):
        _cpu, _mem, num, milli, models = cls
        own = []
        for key in groups:
            model, width = key
            if num > 0 and (width < num or (models and model not in models)):
                continue
            var = solver.NumVar(0, count, f"take[{ci}|{model}x{width}]")
            use[ci, key] = var
            own.append(var)
            objective.SetCoefficient(var, num * milli)
        if own:
            solver.Add(sum(own) <= count)
    cls_list = list(classes)
    for key, (gpu, cpu_cap, mem_cap) in groups.items():
        terms = [(cls_list[ci], v) for (ci, k), v in use.items() if k == key]
        solver.Add(sum(c[2] * c[3] * v for c, v in terms) <= gpu)
        solver.Add(sum(c[0] * v for c, v in terms) <= cpu_cap)
        solver.Add(sum(c[1] * v for c, v in terms) <= mem_cap)
    objective.SetMaximization()
    solver.Solve()
    total = sum(g[0] for g in groups.values())
    return 100.0 * objective.Value() / total if total else 0.0


def maximal_patterns(sizes: Sequence[int], capacity: int = MILLI) -> list[Counter[int]]:
    """Multisets of `sizes` summing to at most `capacity` to which no size can be added."""
    ordered = sorted(set(sizes))
    out: list[Counter[int]] = []

    def rec(i: int, left: int, cur: Counter[int]) -> None:
        if i == len(ordered):
            if ordered and all(s > left for s in ordered):
                out.append(Counter(cur))
            return
        s = ordered[i]
        k = 0
        while k * s <= left:
            if k:
                cur[s] = k
            rec(i + 1, left - k * s, cur)
            k += 1
        cur.pop(s, None)

    rec(0, capacity, Counter())
    return out


PodClass = tuple[int, int, int, int, tuple[str, ...]]
"""(cpu milli, memory MiB, GPUs, milli per GPU, allowed models) of a pod."""


def _pod_class(p: PodRequest) -> PodClass:
    return (p.cpu_milli, p.memory_mib, p.num_gpus, p.gpu_milli, p.gpu_models)


def _pattern_lp(
    cluster: ClusterSnapshot, pod_cls: Sequence[PodClass]
) -> tuple[Any, Any, dict[int, list[Any]]]:
    """The per-GPU configuration LP without the per-class limits: (solver, objective, take)."""
    node_cls: Counter[tuple[str, int, int, int]] = Counter(
        (n.gpu_model, len(n.gpus), n.cpu_milli, n.memory_mib) for n in cluster.nodes
    )
    sizes = sorted({milli for _c, _m, num, milli, _s in pod_cls if is_share(num, milli)})
    patterns = maximal_patterns(sizes) if sizes else []
    solver = _solver()
    objective = solver.Objective()
    take: dict[int, list[Any]] = {}
    for ki, (model, width, cpu, mem) in enumerate(node_cls):
        nodes = node_cls[model, width, cpu, mem]
        gpu_terms: list[Any] = []
        cpu_terms: list[Any] = []
        mem_terms: list[Any] = []
        by_size: dict[int, list[Any]] = {}
        by_num: dict[int, list[Any]] = {}
        for ci, (pcpu, pmem, num, milli, models) in enumerate(pod_cls):
            if width < num or (models and model not in models):
                continue
            var = solver.NumVar(0, solver.infinity(), f"take[{ci}|{ki}]")
            take.setdefault(ci, []).append(var)
            objective.SetCoefficient(var, num * milli)
            cpu_terms.append(pcpu * var)
            mem_terms.append(pmem * var)
            if num == 0:
                continue
            if is_share(num, milli):
                by_size.setdefault(milli, []).append(var)
            else:
                gpu_terms.append(num * var)
                by_num.setdefault(num, []).append(var)
        if by_size:
            pat_vars = [
                solver.NumVar(0, nodes * width, f"pattern[{ki}|{j}]") for j in range(len(patterns))
            ]
            gpu_terms += pat_vars
            for size, vars_ in by_size.items():
                slots = [
                    pat[size] * v for pat, v in zip(patterns, pat_vars, strict=True) if pat[size]
                ]
                solver.Add(sum(vars_) <= sum(slots))
        if gpu_terms:
            solver.Add(sum(gpu_terms) <= nodes * width)
        if cpu_terms:
            solver.Add(sum(cpu_terms) <= nodes * cpu)
            solver.Add(sum(mem_terms) <= nodes * mem)
        for num, vars_ in by_num.items():
            solver.Add(sum(vars_) <= nodes * (width // num))
    objective.SetMaximization()
    return solver, objective, take


def _solve_pct(cluster: ClusterSnapshot, solver: Any, objective: Any) -> float:
    solver.Solve()
    total = cluster.total_gpus * MILLI
    return 100.0 * objective.Value() / total if total else 0.0


def pattern_upper_bound(cluster: ClusterSnapshot, arrived: Sequence[PodRequest]) -> float:
    """Per-GPU configuration LP bound on allocated GPU share, in % of GPU capacity."""
    counts = Counter(_pod_class(p) for p in arrived if p.num_gpus)
    pod_cls = list(counts)
    solver, objective, take = _pattern_lp(cluster, pod_cls)
    for ci, vars_ in take.items():
        solver.Add(sum(vars_) <= counts[pod_cls[ci]])
    return _solve_pct(cluster, solver, objective)


def dominates(d: PodClass, c: PodClass) -> bool:
    """Whether a pod of class d can never fit where a pod of class c does not."""
    d_cpu, d_mem, d_num, d_milli, d_models = d
    c_cpu, c_mem, c_num, c_milli, c_models = c
    if c_models and (not d_models or not set(d_models) <= set(c_models)):
        return False
    return d_cpu >= c_cpu and d_mem >= c_mem and d_num >= c_num and d_milli >= c_milli


def _cover_edges(pod_cls: Sequence[PodClass]) -> list[tuple[int, int]]:
    """(d, c) pairs where d dominates c with no third class between them."""
    n = len(pod_cls)
    dom = np.array(
        [[i != j and dominates(pod_cls[i], pod_cls[j]) for j in range(n)] for i in range(n)],
        dtype=np.int64,
    ).reshape(n, n)
    cover = (dom > 0) & ((dom @ dom) == 0)
    return [(int(d), int(c)) for d, c in zip(*np.nonzero(cover), strict=True)]


def protocol_upper_bound(
    cluster: ClusterSnapshot, arrived: Sequence[PodRequest], bucket_pct: float = 5.0
) -> float:
    """The per-GPU LP plus what the online protocol forces, in % of GPU capacity.

    Arrivals (in order) are cut into buckets of `bucket_pct` % of GPU capacity
    each; a[c, b] is the fraction of class c's pods in bucket b that is placed,
    and z[c, b] relaxes "no pod of class c, nor of a class c dominates, has
    failed before bucket b". Nothing departs, so free resources only shrink:
    once a pod fails, every later pod of a class that dominates its class
    (needs at least as much of every resource, on a subset of its GPU models)
    fails too. Hence a[c, b] <= z[c, b], z[c, b + 1] <= z[c, b],
    z[c, b + 1] <= a[c, b] where bucket b holds class c, and z[d, b] <= z[c, b]
    when d dominates c (imposed along the covering pairs; the rest follows).
    Every run of the protocol satisfies these, whatever the policy, so the
    LP's optimum bounds every online policy. Unlike the offline LPs it cannot
    drop the 810m shares (whose GPUs keep 190m that almost nothing fills)
    without dropping the whole-GPU pods that arrive after them, nor CPU-only
    pods (which it may place on any node class) without dropping the pods
    needing as much CPU and memory after them.
    """
    total = cluster.total_gpus * MILLI
    width = bucket_pct / 100.0 * total
    per_bucket: list[Counter[PodClass]] = []
    acc = 0
    for p in arrived:
        acc += p.total_gpu_milli
        b = int(acc / width)
        while len(per_bucket) <= b:
            per_bucket.append(Counter())
        per_bucket[b][_pod_class(p)] += 1
    pod_cls = list(Counter(_pod_class(p) for p in arrived))
    solver, objective, take = _pattern_lp(cluster, pod_cls)
    nb = len(per_bucket)
    alive = [
        [solver.NumVar(0, 1, f"z[{ci}|{b}]") for b in range(nb + 1)] for ci in range(len(pod_cls))
    ]
    for ci, cls in enumerate(pod_cls):
        z = alive[ci]
        terms = []
        for b, bucket in enumerate(per_bucket):
            solver.Add(z[b + 1] <= z[b])
            if bucket[cls]:
                frac = solver.NumVar(0, 1, f"a[{ci}|{b}]")
                terms.append(bucket[cls] * frac)
                solver.Add(frac <= z[b])
                solver.Add(z[b + 1] <= frac)
        solver.Add(sum(take.get(ci, [])) == sum(terms))
    for d, c in _cover_edges(pod_cls):
        for b in range(nb + 1):
            solver.Add(alive[d][b] <= alive[c][b])
    return _solve_pct(cluster, solver, objective)
