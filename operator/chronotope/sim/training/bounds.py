"""A lower bound on any policy's average JCT that counts queueing (an LP relaxation).

`report.mean_best_runtime_h` (each job alone on its fastest type) ignores that
jobs share the cluster, so on overloaded windows it is far below what any
policy can reach, and "2x over FIFO wherever the bound allows" cannot be told
from "not met". This bound keeps the capacity per GPU type:

A time-indexed LP over slots of `slot_s` seconds (after `fine_h` hours,
`coarse_s`; past `end_h` one open-ended slot), with `x[j, t, k]` the GPU-seconds
job j gets on type t in slot k:

- job j's work is done: sum over t, k of `x[j, t, k] * e[j, t]` = `w_j`, where
  `e[j, t]` = speed on t / speed on its fastest type and `w_j` = gang x run time
  alone on its fastest type, `p_j` (its work in GPU-seconds on its best type);
- a type's GPUs in a slot: sum over j of `x[j, t, k]` <= GPUs x slot length;
- a job's gang in a slot: sum over t of `x[j, t, k]` <= gang x the part of the
  slot after its arrival (no job runs faster than alone on its best type);
- its completion `C_j` >= arrival + `p_j`, and `C_j` >= `M_j` + `p_j` / 2, where
  `M_j` is the mean time at which its work is done, each slot's work counted
  at the slot's start (or the arrival, if later) so that `M_j` is never
  overestimated. A job whose progress rate is at most `w_j / p_j` and which
  ends at `C_j` has `M_j` <= `C_j - p_j / 2` (its work at full rate just
  before `C_j` is the latest it can be), so every real schedule is a point of
  the LP and the LP's minimum of the sum of `C_j` is at most the best
  policy's.

What it relaxes: a gang may split over types and slots (no gang or placement
constraint), no restarts, no lease rounds, work may move between slots
freely. So it is a bound, not a schedule; it is tight only as far as these
are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ortools.linear_solver import pywraplp

from chronotope.workloads.training_policy import Job

__all__ = ["BoundSettings", "queueing_bound_h"]


@dataclass(frozen=True)
class BoundSettings:
    """The LP's slot grid: `slot_s` slots for `fine_h` hours, `coarse_s` ones until `end_h`.

    After `end_h` one slot never ends. Shorter slots give a tighter bound (a
    slot's work is counted at its start) and a larger LP.
    """

    slot_s: float = 300.0
    fine_h: float = 24.0
    coarse_s: float = 3600.0
    end_h: float = 150.0

    def __post_init__(self) -> None:
        """Refuse a grid that cannot cover time."""
        if self.slot_s <= 0 or self.coarse_s <= 0 or self.fine_h < 0 or self.end_h < self.fine_h:
            raise ValueError("slot lengths must be positive and end_h >= fine_h >= 0")

    def starts(self, t0: float) -> list[float]:
        """Slot starts from `t0`; the last one opens the slot that never ends."""
        out: list[float] = []
        t = t0
        while t < t0 + self.fine_h * 3600:
            out.append(t)
            t += self.slot_s
        while t < t0 + self.end_h * 3600:
            out.append(t)
            t += self.coarse_s
        out.append(t)
        return out


def queueing_bound_h(
    jobs: Sequence[Job], capacity: Mapping[str, int], settings: BoundSettings | None = None
) -> float:
    """The LP's lower bound on the average JCT (hours) of any policy; see the module docstring."""
    if not jobs:
        return 0.0
    grid = (settings or BoundSettings()).starts(min(j.arrival_s for j in jobs))
    last = len(grid) - 1
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with ortools
        raise RuntimeError("the GLOP LP solver is not available")
    inf = solver.infinity()
    gpus = {
        (t, k): solver.Constraint(0, n * (grid[k + 1] - grid[k]))
        for t, n in capacity.items()
        for k in range(last)
    }
    objective = solver.Objective()
    for j in jobs:
        best = max(j.speed.values())
        p = j.work_s / best
        w = j.num_gpus * p
        done = solver.Constraint(w, w)
        finish = solver.NumVar(j.arrival_s + p, inf, "")
        objective.SetCoefficient(finish, 1)
        busy = solver.Constraint(p / 2, inf)  # C_j - M_j >= p_j / 2
        busy.SetCoefficient(finish, 1)
        for k, start in enumerate(grid):
            end = grid[k + 1] if k < last else inf
            if end <= j.arrival_s:
                continue
            at = max(start, j.arrival_s)
            gang = solver.Constraint(0, j.num_gpus * (end - at)) if k < last else None
            for t in capacity:
                e = j.speed.get(t, 0.0) / best
                if e <= 0:
                    continue
                x = solver.NumVar(0, inf, "")
                done.SetCoefficient(x, e)
                busy.SetCoefficient(x, -e * at / w)
                if gang is not None:
                    gang.SetCoefficient(x, 1)
                    gpus[t, k].SetCoefficient(x, 1)
    objective.SetMinimization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise RuntimeError("the queueing-bound LP found no optimum")
    total = float(objective.Value()) - sum(j.arrival_s for j in jobs)
    return total / len(jobs) / 3600
