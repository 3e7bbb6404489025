"""Chronotope's training policy: deadline-aware shortest-remaining-work on the right GPUs.

The same code decides in the operator (`workloads.fleet`, over the waiting and
running TrainingJobs) and in the training simulator (`sim.training`, over a
trace); `Job`, `JobState` and the `TrainingPolicy` protocol are what both hand it.

Each decision (arrival, completion, lease round):

1. Order. Jobs whose deadline is still reachable on their fastest type but
   whose laxity (time to deadline minus best remaining run time) has fallen
   below `urgency` times that run time (or two rounds) go first, earliest
   deadline first. Everyone else follows by remaining GPU-time on their best
   type (`num_gpus * remaining / best speed`, shortest first). With estimated
   durations a deadline job's laxity cannot be known, so every deadline job not
   yet late is urgent (EDF, as the EDF baseline), but one that still has laxity
   on its optimistic estimate lets much smaller work through first: the jobs
   whose key is below `yield_below` times its own, as long as their keys add up
   to at most `yield_budget` times its own (so it waits behind a bounded amount
   of short work per decision, and goes first again once even the optimistic
   estimate leaves no laxity). A job already
   holding GPUs may get a `lease_discount` on its key (none by default: the
   plan's `switch_s` below already keeps near-ties from preempting, and a
   discount on top only delays short jobs behind long ones). Jobs that can no longer make
   their deadline are treated as ordinary jobs, so they cannot starve others.
2. Plan. The ordered jobs are list-scheduled ahead of time on each type's
   GPUs (a TetriSched-style plan): each job, in order, takes the type and the
   earliest slot there that minimise its finish time (restart included), so it
   may wait for a faster type, and jobs behind it see that slot as taken (they
   queue behind it, not all for the same first release). When some job has to
   queue, a second pass adds a congestion cost to each choice: a run of
   `num_gpus * run` GPU-seconds on type g delays each later job a first pass
   put on g by about that over `capacity[g]` (the marginal cost to the sum of
   completion times), so jobs that gain little from a contended type leave it
   to those that gain more (a third pass repeats this on the second's plan).
   Urgent jobs only take a slot that starts now and ignore that cost. A job
   holding GPUs pays `switch_s` (one round by default) on top of the restart
   for any choice that gives its lease up (moving type, or yielding and
   resuming later): hysteresis, so plans that shift a little each decision do
   not bounce jobs between types and the queue, each bounce costing a restart.
   Jobs planned to start now get their GPUs.
3. Backfill. GPUs still idle go to jobs waiting for a planned later slot,
   those that run best on that type relative to their fastest type first (the
   type a job holds counts `1 / backfill_keep` times as good: lease renewal): a
   waiting job makes progress until its slot comes, then moves (one restart,
   which starting there would cost anyway). No GPU idles while a waiting job
   fits on it.

Durations are estimates: the TrainingJob's `spec.estimate` (with its
`completedFraction` applied), or in the simulator the trace's duration, exact or
made noisy (`--estimate-error`). The policy never reads a job's true remaining
work: it plans with `JobState.estimated_remaining_s`, which corrects the
estimate online from observed progress (work done so far): a job that runs past
its estimate is assumed to need as much again as it has done (the doubling rule
of schedulers without oracles), so a badly underestimated job cannot keep
jumping the queue. Deadlines need more than a point estimate: the policy also
learns how wrong estimates are from the jobs that finished (the ratio of the
work they really did to their estimate, whose spread it keeps). A deadline job
reserves time for a pessimistic estimate (the `pessimism` quantile of that
ratio) when it picks a type, and it lets smaller work through only while it has
laxity on an optimistic one (the `1 - pessimism` quantile of the ratios that
would still have it running). With exact estimates both are the point estimate.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["LEASE_S", "ChronotopePolicy", "Job", "JobState", "TrainingPolicy"]

LEASE_S = 360.0
"""The lease round: the simulator's default `round_s` and the operator's (`workloads.fleet`)."""

MIN_ERRORS = 5
"""Finished estimated jobs needed before their estimate errors are trusted as a spread."""


@dataclass(frozen=True)
class Job:
    """A simulated job. `speed[g]` is its progress rate on type g relative to a V100."""

    job_id: int
    arrival_s: float
    num_gpus: int
    work_s: float  # run time on the reference type
    job_type: str
    speed: Mapping[str, float]
    deadline_s: float | None = None
    estimate_s: float | None = None  # the owner's estimate of work_s (None: exact)

    def estimated_work_s(self) -> float:
        """The run time on the reference type that the owner declared (`work_s` if exact)."""
        return self.work_s if self.estimate_s is None else self.estimate_s

    def best_runtime_s(self) -> float:
        """Run time alone on the job's fastest GPU type."""
        return self.work_s / max(self.speed.values())


@dataclass
class JobState:
    """Mutable progress of one job during a run."""

    job: Job
    remaining_s: float  # work left, in reference (V100) seconds
    attained_gpu_s: float = 0.0
    gpu_type: str | None = None
    overhead_left_s: float = 0.0
    finish_s: float | None = None
    received_s: dict[str, float] = field(default_factory=dict)

    def done_s(self) -> float:
        """Work done so far, in reference seconds (observable: time run times speed)."""
        return max(0.0, self.job.work_s - self.remaining_s)

    def estimated_remaining_s(self) -> float:
        """What the policy believes is left, in reference seconds (see the module docstring).

        The estimate minus the work done; once the job has run past its estimate, as
        much again as it has done. Exact (`remaining_s`) when the job has no estimate.
        """
        if self.job.estimate_s is None:
            return self.remaining_s
        done = self.done_s()
        left = self.job.estimate_s - done
        return left if left > 0 else max(done, 1.0)

    def best_remaining_s(self) -> float:
        """Estimated remaining run time on the job's fastest GPU type."""
        return self.estimated_remaining_s() / max(self.job.speed.values())


class TrainingPolicy(Protocol):
    """A training policy: given the active jobs, which GPU type each should hold from now on.

    `preemptive` policies are asked again at every lease round, not only on arrivals
    and completions.
    """

    name: str
    preemptive: bool

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        """job_id -> GPU type for every job that should hold GPUs from now on."""
        ...


class ChronotopePolicy:
    """Deadline-aware shortest-remaining-work on the right GPUs; see the module docstring."""

    name = "chronotope"
    preemptive = True

    def __init__(
        self,
        round_s: float,
        *,
        urgency: float = 0.5,
        lease_discount: float = 1.0,
        backfill_keep: float = 0.8,
        restart_s: float = 30.0,
        congestion: float = 1.0,
        passes: int = 2,
        switch_s: float | None = None,
        pessimism: float = 0.8,
        yield_below: float = 0.2,
        yield_budget: float = 4.0,
        errors: Iterable[float] = (),
    ) -> None:
        """Set the lease round `round_s` and the knobs the module docstring names.

        `passes` is how many congestion-cost passes follow the first plan; `switch_s`
        (default: one round) is the cost of giving a held lease up. `errors` are the
        (true / estimated) work ratios of jobs that finished before this policy saw any
        (the operator makes a policy per decision and hands it its finished jobs' ratios;
        the simulator's one policy learns them as jobs finish).
        """
        self.round_s = round_s
        self.urgency = urgency
        self.lease_discount = lease_discount
        self.backfill_keep = backfill_keep
        self.restart_s = restart_s
        self.congestion = congestion
        self.passes = passes
        # A held lease is given up (moved or yielded) only for a gain above one round.
        self.switch_s = round_s if switch_s is None else switch_s
        self.pessimism = pessimism
        self.yield_below = yield_below
        self.yield_budget = yield_budget
        # log(work done / estimate) of finished estimated jobs, sorted; and the jobs last seen
        self._log_errors: list[float] = sorted(math.log(r) for r in errors if r > 0)
        self._seen: dict[int, JobState] = {}
        self._suffix: list[float] = [0.0]

    def _learn(self, active: Sequence[JobState]) -> None:
        """Record how wrong the estimates of jobs that finished since the last decision were.

        A job that left the active set finished; its work done is then its true work,
        which the operator observes too (its run time on known speeds).
        """
        now_ids = {js.job.job_id for js in active}
        for jid, js in self._seen.items():
            est = js.job.estimate_s
            if jid not in now_ids and est is not None and est > 0:
                bisect.insort(self._log_errors, math.log(js.job.work_s / est))
        self._seen = {js.job.job_id: js for js in active}

    def _error_factor(self, q: float) -> float:
        """The q-quantile of finished jobs' (true / estimated) work; 1 until a few finished."""
        n = len(self._log_errors)
        if n < MIN_ERRORS:
            return 1.0
        return math.exp(self._log_errors[min(n - 1, int(q * n))])

    def _pessimistic_remaining_s(self, js: JobState) -> float:
        """Remaining reference work if the estimate is off by the `pessimism` quantile."""
        est = js.job.estimate_s
        if est is None:
            return js.remaining_s
        hi = est * self._error_factor(self.pessimism) - js.done_s()
        return max(hi, js.estimated_remaining_s())

    def _planned_work_s(self, js: JobState) -> float:
        """Remaining reference work the plan reserves: pessimistic for a job with a deadline.

        So a deadline job whose estimate may be too low picks a type fast enough for
        the work it may really have left; others plan with the point estimate.
        """
        if js.job.deadline_s is None:
            return self._expected_remaining_s(js)
        return self._pessimistic_remaining_s(js)

    def _surviving(self, js: JobState) -> tuple[float, float, int] | None:
        """(estimate, work done, first index of the learned ratios that leave it running).

        The job's total is its estimate times a ratio drawn from the finished jobs' (true /
        estimated) ratios; given that it has run `done` without finishing, only ratios that
        put the total above `done` remain possible: a suffix of the sorted ratios. None
        without an estimate, with too few finished jobs, or with none that would still run.
        """
        est = js.job.estimate_s
        if est is None or len(self._log_errors) < MIN_ERRORS:
            return None
        done = js.done_s()
        cut = bisect.bisect_right(self._log_errors, math.log(max(done, 1e-9) / est))
        return None if cut == len(self._log_errors) else (est, done, cut)

    def _expected_remaining_s(self, js: JobState) -> float:
        """Expected remaining reference work given the work done, under the learned errors.

        The mean over the ratios that would still have the job running (`_surviving`);
        otherwise `estimated_remaining_s`.
        """
        surviving = self._surviving(js)
        if surviving is None:
            return js.estimated_remaining_s()
        est, done, cut = surviving
        return est * self._ratio_suffix()[cut] / (len(self._log_errors) - cut) - done

    def _optimistic_remaining_s(self, js: JobState) -> float:
        """Remaining reference work if the estimate is off by the `1 - pessimism` quantile.

        The quantile of the ratios that would still have the job running (`_surviving`), so
        a job past its optimistic total is not believed done; otherwise
        `estimated_remaining_s`.
        """
        surviving = self._surviving(js)
        if surviving is None:
            return js.estimated_remaining_s()
        est, done, cut = surviving
        alive = len(self._log_errors) - cut
        q = self._log_errors[cut + min(alive - 1, int((1 - self.pessimism) * alive))]
        return est * math.exp(q) - done

    def _ratio_suffix(self) -> list[float]:
        """Suffix sums of the sorted (true / estimated) ratios, rebuilt when one was added."""
        if len(self._suffix) != len(self._log_errors) + 1:
            self._suffix = [0.0] * (len(self._log_errors) + 1)
            for i in range(len(self._log_errors) - 1, -1, -1):
                self._suffix[i] = self._suffix[i + 1] + math.exp(self._log_errors[i])
        return self._suffix

    def _urgent(self, now: float, js: JobState) -> bool:
        d = js.job.deadline_s
        if d is None:
            return False
        if js.job.estimate_s is not None:
            # its laxity is unknowable: every deadline job not yet late goes first (EDF)
            return d > now
        best = js.best_remaining_s()
        laxity = d - now - best
        return 0 <= laxity <= max(self.urgency * best, 2 * self.round_s)

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        """Order, plan and backfill the active jobs (see the module docstring); job_id -> type."""
        self._learn(active)
        urgent = sorted(
            (js for js in active if self._urgent(now, js)),
            key=lambda s: (s.job.deadline_s, s.job.job_id),
        )
        urgent_ids = {js.job.job_id for js in urgent}

        def key(s: JobState) -> tuple[float, int]:
            k = s.job.num_gpus * self._expected_remaining_s(s) / max(s.job.speed.values())
            if s.gpu_type is not None:
                k *= self.lease_discount
            return (k, s.job.job_id)

        rest = sorted((js for js in active if js.job.job_id not in urgent_ids), key=key)
        order = self._order(now, urgent, rest, key)
        plan = self._plan(order, urgent_ids, capacity, None)
        for _ in range(self.passes):
            plan = self._plan(order, urgent_ids, capacity, self._behind(order, plan, capacity))
        alloc = {jid: g for jid, (start, g) in plan.items() if start == 0}
        self._backfill(order, capacity, alloc)
        return alloc

    def _order(
        self,
        now: float,
        urgent: Sequence[JobState],
        rest: Sequence[JobState],
        key: Callable[[JobState], tuple[float, int]],
    ) -> list[JobState]:
        """Urgent jobs (earliest deadline first) merged into `rest` (sorted by `key`).

        An urgent job with an estimated duration that still has laxity on its
        optimistic estimate goes after the jobs of `rest` whose key is below
        `yield_below` times its own, as long as their keys add up to at most
        `yield_budget` times its own; the others go first. Among the urgent jobs
        that let work through, earliest deadline first still holds.
        """
        first: list[JobState] = []
        yielding: list[tuple[JobState, int]] = []
        keys = [key(s)[0] for s in rest]
        sums = [0.0, *itertools.accumulate(keys)]  # sums[i]: the keys of rest[:i]
        for js in urgent:
            deadline = js.job.deadline_s
            best = self._optimistic_remaining_s(js) / max(js.job.speed.values())
            if js.job.estimate_s is None or deadline is None or deadline - now - best <= 0:
                first.append(js)
                continue
            own = key(js)[0]
            smaller = bisect.bisect_left(keys, self.yield_below * own)
            within = bisect.bisect_right(sums, self.yield_budget * own) - 1
            yielding.append((js, min(smaller, within)))
        # an earlier deadline never goes behind a later one: positions rise along EDF
        for i in range(len(yielding) - 2, -1, -1):
            yielding[i] = (yielding[i][0], min(yielding[i][1], yielding[i + 1][1]))
        order = first
        taken = 0
        for js, pos in yielding:
            order.extend(rest[taken:pos])
            taken = max(taken, pos)
            order.append(js)
        order.extend(rest[taken:])
        return order

    @staticmethod
    def _behind(
        order: Sequence[JobState],
        plan: Mapping[int, tuple[float, str]],
        capacity: Mapping[str, int],
    ) -> list[dict[str, int]]:
        """For each position in `order`, later jobs `plan` puts on each type.

        All zero when nobody queues in `plan`: then no job delays another.
        """
        if not any(start > 0 for start, _ in plan.values()):
            return [dict.fromkeys(capacity, 0) for _ in order]
        behind: list[dict[str, int]] = []
        counts = dict.fromkeys(capacity, 0)
        for js in reversed(order):
            behind.append(dict(counts))
            if js.job.job_id in plan:
                counts[plan[js.job.job_id][1]] += 1
        behind.reverse()
        return behind

    def _plan(
        self,
        order: Sequence[JobState],
        urgent_ids: set[int],
        capacity: Mapping[str, int],
        behind: Sequence[Mapping[str, int]] | None,
    ) -> dict[int, tuple[float, str]]:
        """List-schedule `order` ahead of time: job_id -> (planned start, type).

        Each job takes the type minimising its own finish (restart included) plus,
        given `behind` (how many later jobs a first pass put on each type), the
        delay its run imposes on them: `congestion * n * run * later / capacity`.
        Urgent deadline jobs only consider starting now and ignore that cost. A
        job holding GPUs adds `switch_s` to every choice that gives its lease up.
        """
        pools: dict[str, list[tuple[float, int]]] = {g: [(0.0, c)] for g, c in capacity.items()}
        out: dict[int, tuple[float, str]] = {}
        for i, js in enumerate(order):
            n = js.job.num_gpus
            urgent_job = js.job.job_id in urgent_ids
            best: tuple[float, float, float, str] | None = None
            for g in capacity:
                if g not in js.job.speed:  # a type the job cannot use (the operator's jobs)
                    continue
                start = _earliest(pools[g], n)
                if start is None or (urgent_job and start > 0):
                    continue
                restart = 0.0 if (js.gpu_type == g and start == 0) else self.restart_s
                run = restart + self._planned_work_s(js) / js.job.speed[g]
                cost = start + run
                if js.gpu_type is not None and restart > 0:
                    cost += self.switch_s  # leaving a held lease: hysteresis
                if behind is not None and not urgent_job:
                    cost += self.congestion * n * run * behind[i][g] / capacity[g]
                if best is None or cost < best[0]:
                    best = (cost, start, run, g)
            if best is None:
                continue
            _, start, run, g = best
            _reserve(pools[g], n, start, start + run)
            out[js.job.job_id] = (start, g)
        return out

    def _backfill(
        self, order: Sequence[JobState], capacity: Mapping[str, int], alloc: dict[int, str]
    ) -> None:
        """Give GPUs nobody planned to use now to jobs waiting for a faster type.

        A waiting job makes progress on an idle slower type until its planned slot
        comes, then moves (one restart, which starting there would cost anyway).
        Idle GPUs go first to the jobs that run best on them relative to their
        fastest type, then in priority order; a job keeps its current type on a tie.
        """
        free = dict(capacity)
        by_id = {js.job.job_id: js for js in order}
        for jid, g in alloc.items():
            free[g] -= by_id[jid].job.num_gpus
        cands: list[tuple[float, int, int, str]] = []
        for rank, js in enumerate(order):
            if js.job.job_id in alloc:
                continue
            best = max(js.job.speed.values())
            for g in capacity:
                if g not in js.job.speed:
                    continue
                eff = js.job.speed[g] / best
                if js.gpu_type == g:
                    eff /= self.backfill_keep
                cands.append((-eff, rank, js.job.job_id, g))
        cands.sort()
        for _, _, jid, g in cands:
            n = by_id[jid].job.num_gpus
            if jid not in alloc and free[g] >= n:
                alloc[jid] = g
                free[g] -= n


def _earliest(pool: list[tuple[float, int]], n: int) -> float | None:
    """When `n` GPUs of a pool are free at once, given (free-at, count) entries."""
    avail = 0
    for t, k in sorted(pool):
        avail += k
        if avail >= n:
            return t
    return None


def _reserve(pool: list[tuple[float, int]], n: int, start: float, end: float) -> None:
    """Take `n` GPUs free by `start` (earliest first) until `end`."""
    pool.sort()
    need = n
    while need > 0:
        t, k = pool[0]
        assert t <= start
        if k <= need:
            pool.pop(0)
            need -= k
        else:
            pool[0] = (t, k - need)
            need = 0
    pool.append((end, n))
