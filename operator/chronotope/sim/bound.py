"""Upper bounds on GPU allocation for a given arrival sequence (offline relaxations).

Both bounds relax the *offline* problem over the same arrived pods: any
placement of them, online or offline, allocates at most this much. Neither
models the online protocol's "a pod that fits must be placed", which is
what actually limits the online policies (docs/solver.md), so both are far
from what an online policy can reach; they say where the offline limit is.

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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from chronotope.solver.model import MILLI, ClusterSnapshot, PodRequest

__all__ = ["allocation_upper_bound", "maximal_patterns", "pattern_upper_bound"]


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


def pattern_upper_bound(cluster: ClusterSnapshot, arrived: Sequence[PodRequest]) -> float:
    """Per-GPU configuration LP bound on allocated GPU share, in % of GPU capacity."""
    node_cls: Counter[tuple[str, int, int, int]] = Counter(
        (n.gpu_model, len(n.gpus), n.cpu_milli, n.memory_mib) for n in cluster.nodes if n.gpus
    )
    gpu_pods = [p for p in arrived if p.num_gpus]
    pod_cls = Counter(
        (p.cpu_milli, p.memory_mib, p.num_gpus, p.gpu_milli, p.gpu_models) for p in gpu_pods
    )
    sizes = sorted({p.gpu_milli for p in gpu_pods if p.is_share})
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
            var = solver.NumVar(0, pod_cls[pcpu, pmem, num, milli, models], f"take[{ci}|{ki}]")
            take.setdefault(ci, []).append(var)
            objective.SetCoefficient(var, num * milli)
            cpu_terms.append(pcpu * var)
            mem_terms.append(pmem * var)
            if num == 1 and milli < MILLI:
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
        solver.Add(sum(gpu_terms) <= nodes * width)
        solver.Add(sum(cpu_terms) <= nodes * cpu)
        solver.Add(sum(mem_terms) <= nodes * mem)
        for num, vars_ in by_num.items():
            solver.Add(sum(vars_) <= nodes * (width // num))
    for ci, vars_ in take.items():
        solver.Add(sum(vars_) <= list(pod_cls.values())[ci])
    objective.SetMaximization()
    solver.Solve()
    total = cluster.total_gpus * MILLI
    return 100.0 * objective.Value() / total if total else 0.0
