"""The scheduling policies compared by the training simulator.

Each policy returns the full allocation at every decision point. Placement puts
a job's whole gang on one GPU type.

- `fifo`: arrival order, non-preemptive, strict (the queue head blocks), and
  heterogeneity-agnostic (first type, in cluster-spec order, with room).
- `las`: Tiresias-style least attained service (GPU-seconds), preemptive by
  rounds, heterogeneity-agnostic placement, backfills jobs that fit.
- `edf`: earliest deadline first (jobs without one after, by arrival),
  preemptive, each job on the fastest type with room: a deadline reference.
- `gavel`: heterogeneity-aware max-min fairness (Gavel, OSDI'20): the
  `max_min_fairness` LP on normalised throughputs gives time fractions X[j][g];
  each round jobs are served in order of X[j][g] / share of time received.
- `chronotope`: ours, `workloads/training_policy.py` (the operator runs the same code).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from chronotope.sim.training.gavel import GavelPolicy
from chronotope.workloads.training_policy import ChronotopePolicy, JobState, TrainingPolicy

__all__ = ["TRAINING_POLICY_NAMES", "EdfPolicy", "FifoPolicy", "LasPolicy", "make_training_policy"]


def _agnostic(js: JobState, free: dict[str, int]) -> str | None:
    for g, n in free.items():
        if n >= js.job.num_gpus:
            return g
    return None


def _fastest(js: JobState, free: dict[str, int]) -> str | None:
    fits = [g for g, n in free.items() if n >= js.job.num_gpus]
    return max(fits, key=lambda g: js.job.speed[g]) if fits else None


def _greedy(
    order: Sequence[JobState],
    capacity: Mapping[str, int],
    choose: Callable[[JobState, dict[str, int]], str | None],
) -> dict[int, str]:
    """Jobs in `order` each take the type `choose` picks among what is still free."""
    free = dict(capacity)
    alloc: dict[int, str] = {}
    for js in order:
        g = choose(js, free)
        if g is not None:
            alloc[js.job.job_id] = g
            free[g] -= js.job.num_gpus
    return alloc


class FifoPolicy:
    """First in, first out: non-preemptive, and the queue head blocks everyone behind it."""

    name = "fifo"
    preemptive = False

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        """Keep running jobs; start the rest in arrival order, each on the first type with room."""
        free = dict(capacity)
        alloc: dict[int, str] = {}
        for js in active:
            if js.gpu_type is not None:
                alloc[js.job.job_id] = js.gpu_type
                free[js.gpu_type] -= js.job.num_gpus
        for js in sorted(active, key=lambda s: (s.job.arrival_s, s.job.job_id)):
            if js.job.job_id in alloc:
                continue
            g = _agnostic(js, free)
            if g is None:
                break
            alloc[js.job.job_id] = g
            free[g] -= js.job.num_gpus
        return alloc


class LasPolicy:
    """Least attained service (Tiresias-style): preemptive by rounds, heterogeneity-agnostic."""

    name = "las"
    preemptive = True

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        """Serve jobs by fewest GPU-seconds received; a job keeps its type while it has room."""

        def keep_or_any(js: JobState, free: dict[str, int]) -> str | None:
            # keep the current type when it still has room (lease renewal)
            if js.gpu_type and free[js.gpu_type] >= js.job.num_gpus:
                return js.gpu_type
            return _agnostic(js, free)

        order = sorted(active, key=lambda s: (s.attained_gpu_s, s.job.arrival_s, s.job.job_id))
        return _greedy(order, capacity, keep_or_any)


class EdfPolicy:
    """Earliest deadline first, each job on the fastest type with room (a deadline reference)."""

    name = "edf"
    preemptive = True

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        """Serve by deadline, then jobs without one by arrival; each on its fastest free type."""

        def key(s: JobState) -> tuple[float, float, int]:
            d = s.job.deadline_s
            return (d if d is not None else float("inf"), s.job.arrival_s, s.job.job_id)

        return _greedy(sorted(active, key=key), capacity, _fastest)


TRAINING_POLICY_NAMES = ("fifo", "las", "edf", "gavel", "chronotope")


def make_training_policy(name: str, round_s: float, restart_s: float = 30.0) -> TrainingPolicy:
    """A fresh policy instance (policies may keep state across decisions)."""
    if name == "fifo":
        return FifoPolicy()
    if name == "las":
        return LasPolicy()
    if name == "edf":
        return EdfPolicy()
    if name == "gavel":
        return GavelPolicy(round_s=round_s)
    if name == "chronotope":
        return ChronotopePolicy(round_s=round_s, restart_s=restart_s)
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(TRAINING_POLICY_NAMES)})")
