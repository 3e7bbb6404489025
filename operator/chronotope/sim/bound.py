"""An upper bound on GPU allocation for a given arrival sequence.

Relaxation of the offline problem: forget node boundaries inside a group of
identical nodes (same GPU model and GPU count) and pool each group's GPU
share, CPU and memory; let every arrived pod be taken fractionally, into any
group whose model it allows and whose nodes have enough GPUs. The linear
program "maximise placed GPU share" over these pools (GLOP) bounds what any
placement of the same arrivals, online or offline, can allocate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from chronotope.solver.model import MILLI, ClusterSnapshot, PodRequest

__all__ = ["allocation_upper_bound"]


def allocation_upper_bound(cluster: ClusterSnapshot, arrived: Sequence[PodRequest]) -> float:
    """Upper bound on allocated GPU share, in % of cluster GPU capacity."""
    from ortools.linear_solver import pywraplp

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
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with ortools
        raise RuntimeError("GLOP is not available")
    use: dict[tuple[int, tuple[str, int]], pywraplp.Variable] = {}
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
