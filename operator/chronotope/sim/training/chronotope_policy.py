"""Chronotope's training policy: deadline-aware shortest-remaining-work on the right GPUs.

Each decision (arrival, completion, lease round):

1. Order. Jobs whose deadline is still reachable on their fastest type but
   whose laxity (time to deadline minus best remaining run time) has fallen
   below `urgency` times that run time (or two rounds) go first, earliest
   deadline first. Everyone else follows by remaining GPU-time on their best
   type (`num_gpus * remaining / best speed`, shortest first). A job already
   holding GPUs gets a `lease_discount` on its key so that near-ties do not
   preempt (lease renewal, no restart cost). Jobs that can no longer make
   their deadline are treated as ordinary jobs, so they cannot starve others.
2. Place. Each job, in order, takes the type with room where it would finish
   soonest, counting the restart overhead; if a faster type frees up (from
   jobs placed this round) soon enough that waiting beats running on a slower
   type now, the job waits (the TetriSched "wait for better GPUs" choice),
   unless it is urgent.

Durations are taken from the job (the TrainingJob's duration estimate; in the
simulator the trace's duration), as SRTF-style schedulers assume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from chronotope.sim.training.engine import JobState

__all__ = ["ChronotopePolicy"]


class ChronotopePolicy:
    name = "chronotope"
    preemptive = True

    def __init__(
        self,
        round_s: float,
        urgency: float = 0.5,
        lease_discount: float = 0.8,
        restart_s: float = 30.0,
    ) -> None:
        self.round_s = round_s
        self.urgency = urgency
        self.lease_discount = lease_discount
        self.restart_s = restart_s

    def _urgent(self, now: float, js: JobState) -> bool:
        d = js.job.deadline_s
        if d is None:
            return False
        best = js.best_remaining_s()
        laxity = d - now - best
        return 0 <= laxity <= max(self.urgency * best, 2 * self.round_s)

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        urgent = sorted(
            (js for js in active if self._urgent(now, js)),
            key=lambda s: (s.job.deadline_s, s.job.job_id),
        )
        urgent_ids = {js.job.job_id for js in urgent}

        def key(s: JobState) -> tuple[float, int]:
            k = s.job.num_gpus * s.best_remaining_s()
            if s.gpu_type is not None:
                k *= self.lease_discount
            return (k, s.job.job_id)

        rest = sorted((js for js in active if js.job.job_id not in urgent_ids), key=key)
        free = dict(capacity)
        releases: dict[str, list[tuple[float, int]]] = {g: [] for g in capacity}
        alloc: dict[int, str] = {}
        for js in [*urgent, *rest]:
            n = js.job.num_gpus
            best_g: str | None = None
            best_t = float("inf")
            for g in capacity:
                if free[g] < n:
                    continue
                restart = 0.0 if js.gpu_type == g else self.restart_s
                t = restart + js.remaining_s / js.job.speed[g]
                if t < best_t:
                    best_g, best_t = g, t
            if best_g is None:
                continue
            if js.job.job_id not in urgent_ids and self._better_to_wait(js, free, releases, best_t):
                continue
            alloc[js.job.job_id] = best_g
            free[best_g] -= n
            restart = 0.0 if js.gpu_type == best_g else self.restart_s
            releases[best_g].append((restart + js.remaining_s / js.job.speed[best_g], n))
        return alloc

    def _better_to_wait(
        self,
        js: JobState,
        free: Mapping[str, int],
        releases: Mapping[str, list[tuple[float, int]]],
        run_now_t: float,
    ) -> bool:
        """Would waiting for a faster type (freed by jobs placed this round) finish sooner?"""
        n = js.job.num_gpus
        for g, rel in releases.items():
            if free[g] >= n:
                continue
            avail, wait = free[g], None
            for t_free, k in sorted(rel):
                avail += k
                if avail >= n:
                    wait = t_free
                    break
            if wait is None:
                continue
            if wait + self.restart_s + js.remaining_s / js.job.speed[g] < run_now_t:
                return True
        return False
