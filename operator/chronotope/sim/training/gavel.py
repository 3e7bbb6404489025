"""Gavel-style heterogeneity-aware max-min fairness (Narayanan et al., OSDI'20).

The LP (Gavel's `max_min_fairness` policy, with throughputs normalised by each
job's throughput on an equal share of every GPU type)::

    maximise  t
    s.t.      sum_g X[j][g] * speed[j][g] / eq[j] >= t      for every job j
              sum_g X[j][g] <= 1                              for every job j
              sum_j num_gpus[j] * X[j][g] <= capacity[g]      for every type g
              X >= 0

is solved with GLOP when the set of active jobs has changed, at most once per
round (jobs that arrive mid-round get a small provisional share until then). Each round, job
and type pairs are served in decreasing `X[j][g] / share of time j has had on
g`, Gavel's round-robin mechanism; leftover GPUs go to any job that fits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ortools.linear_solver import pywraplp

from chronotope.workloads.training_policy import JobState

__all__ = ["GavelPolicy", "max_min_fairness"]

_PROVISIONAL = 1e-3  # share of a job not yet in the LP solution


def max_min_fairness(
    active: Sequence[JobState], capacity: Mapping[str, int]
) -> dict[int, dict[str, float]]:
    """X[job_id][gpu_type]: the time fraction each job should get on each type."""
    solver = pywraplp.Solver.CreateSolver("GLOP")
    total = sum(capacity.values())
    t = solver.NumVar(0.0, solver.infinity(), "t")
    x: dict[int, dict[str, Any]] = {}
    per_type: dict[str, list[tuple[int, Any]]] = {g: [] for g in capacity}
    for js in active:
        j = js.job
        eq = sum(j.speed[g] * capacity[g] / total for g in capacity)
        row = {g: solver.NumVar(0.0, 1.0, f"x_{j.job_id}_{g}") for g in capacity}
        x[j.job_id] = row
        solver.Add(sum(row[g] * (j.speed[g] / eq) for g in capacity) >= t)
        solver.Add(sum(row.values()) <= 1)
        for g in capacity:
            per_type[g].append((j.num_gpus, row[g]))
    for g, terms in per_type.items():
        if terms:
            solver.Add(sum(n * v for n, v in terms) <= capacity[g])
    solver.Maximize(t)
    solver.Solve()
    return {jid: {g: float(v.solution_value()) for g, v in row.items()} for jid, row in x.items()}


class GavelPolicy:
    """Gavel: max-min fair time fractions from the LP, served round-robin each round."""

    name = "gavel"
    preemptive = True

    def __init__(self, round_s: float) -> None:
        """Build the policy; the LP is solved again at most once per round of `round_s` seconds."""
        self.round_s = round_s
        self._key: frozenset[int] = frozenset()
        self._x: dict[int, dict[str, float]] = {}
        self._solved_round = -1

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        """Serve job and type pairs by how far each job lags behind its LP share; job_id -> type.

        The LP is solved again when the set of active jobs has changed, at most once
        per round; jobs not in the current solution get a small provisional share.
        """
        key = frozenset(js.job.job_id for js in active)
        round_no = int(now // self.round_s)
        if key != self._key and (round_no > self._solved_round or not self._x):
            self._x = max_min_fairness(active, capacity) if active else {}
            self._key = key
            self._solved_round = round_no
        pairs: list[tuple[float, float, int, str, JobState]] = []
        for js in active:
            age = max(now - js.job.arrival_s, 1e-9)
            for g in capacity:
                want = self._x.get(js.job.job_id, {}).get(g, _PROVISIONAL)
                share = js.received_s.get(g, 0.0) / age
                prio = want / share if share > 0 else (1e9 * want)
                pairs.append((-prio, -js.job.speed[g], js.job.job_id, g, js))
        pairs.sort(key=lambda p: p[:4])
        free = dict(capacity)
        alloc: dict[int, str] = {}
        for _, _, jid, g, js in pairs:
            if jid not in alloc and free[g] >= js.job.num_gpus:
                alloc[jid] = g
                free[g] -= js.job.num_gpus
        return alloc
