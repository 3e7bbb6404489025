"""Queues in the training simulator: quota-aware wrapper around any training policy.

Why: `workloads.quota` holds the operator's Queue accounting (admit within
nominal quota, reclaim borrowed quota, borrow by weighted DRF). This module
runs that same accounting at every simulator decision so any policy (FIFO,
LAS, EDF, Gavel, ours) can be measured under team quotas, without changing
the policies. The rule, per decision (docs/training-sim.md, "Queues"):

1. The wrapped policy allocates over *all* active jobs and the whole cluster
   (its wish: it keeps its ordering and type choices).
2. `quota.admit` decides who holds GPUs: jobs that hold a GPU type now and
   that the wish keeps there count as admitted usage; every other active job
   is pending: first the jobs the wish starts or moves (in the wish's order,
   the wished type first), then the rest by arrival (`quota.policy_first`, as
   the operator's scheduling pass admits; a StrictFIFO Queue's jobs keep their
   arrival order). The accounting's own
   passes apply: within nominal quota (so a queue's own jobs come before any
   borrower, whether the policy wished them or not), reclaim (under
   `PreemptBorrowed` the victims are simply not allocated; the engine charges
   their restart when they resume), then borrowing idle cohort quota by
   weighted DRF.
3. The allocation is what the accounting admitted, on the type it chose;
   `check_quotas` re-checks it (no queue above nominal + borrowing limit, no
   cohort above its nominal total) and raises on a breach; the engine still
   checks capacity.

Queue files are the Queue YAML a user applies; GPU types name the cluster
pools' GPU models (mapped to Gavel's k80/p100/v100 like `capacity_from_spec`).
Pure and deterministic for a seed.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml
from pydantic import ValidationError

from chronotope.api.v1alpha1.localqueue import LocalQueueSpec
from chronotope.api.v1alpha1.queue import Queue, QueueSpec, StopPolicy
from chronotope.sim.training.workload import capacity_from_spec
from chronotope.workloads.quota import (
    AdmittedWorkload,
    Demand,
    PendingWorkload,
    QueueQuota,
    QuotaBook,
    Unit,
    Verdict,
    admit,
    policy_first,
)
from chronotope.workloads.training_policy import Job, JobState, TrainingPolicy

__all__ = [
    "JOB_SHARE_ANNOTATION",
    "QueueSetup",
    "QuotaPolicy",
    "Snapshot",
    "assign_queues",
    "check_fit",
    "check_quotas",
    "load_queues",
]

JOB_SHARE_ANNOTATION = "sim.chronotope.dev/job-share"
"""Optional Queue annotation: the queue's relative share of the trace's jobs (a number > 0)."""

LOCAL_QUEUE = "default"  # each queue is reached from a namespace of its own name


@dataclass(frozen=True)
class QueueSetup:
    """The Queues of a file, keyed by name, with quotas on simulator GPU types."""

    specs: dict[str, QueueSpec]
    job_share: dict[str, float]  # relative share of the jobs each queue gets

    def nominal_gpus(self, name: str) -> int:
        """The queue's nominal whole GPUs over all types."""
        return sum(q.gpus for q in self.specs[name].quotas)

    @cached_property
    def limits(self) -> QuotaBook:
        """The Queues with nothing admitted, built once: their ceilings and lendable parts.

        Read only (`ceiling`, `QueueQuota.lendable`, `guaranteed`); never counted into.
        """
        return QuotaBook(self.specs, {})


def _sim_type(gpu_type: str) -> str:
    return next(iter(capacity_from_spec([(gpu_type, 1)])))


def _unsimulated(spec: QueueSpec) -> str | None:
    """Why the simulator cannot run a Queue with this spec, or None."""
    if spec.stop_policy is not StopPolicy.NONE:  # its jobs would never run
        return "a stopPolicy is not simulated (use None)"
    if spec.namespace_selector is not None:  # the trace has no namespaces
        return "a namespaceSelector is not simulated"
    return None


def _read_queue(
    where: str, doc: object, capacity: Mapping[str, int]
) -> tuple[str, QueueSpec, float | None]:
    """One Queue document: its name, its spec on simulator types, its job share if given."""
    if not isinstance(doc, dict) or doc.get("kind") != "Queue":
        raise ValueError(f"{where} is not a Queue (kind: Queue)")
    try:
        queue = Queue.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {loc}: {first['msg']}") from exc
    name = queue.metadata.name
    if not name:
        raise ValueError(f"{where}: Queue without metadata.name")
    unsimulated = _unsimulated(queue.spec)
    if unsimulated:
        raise ValueError(f"{where}: Queue {name}: {unsimulated}")
    quotas = []
    for q in queue.spec.quotas:
        try:
            sim = _sim_type(q.gpu_type)
        except ValueError as exc:
            raise ValueError(f"{where}: Queue {name}: {exc}") from exc
        if sim not in capacity:
            raise ValueError(f"{where}: Queue {name}: the cluster has no {sim} ({q.gpu_type})")
        quotas.append(q.model_copy(update={"gpu_type": sim}))
    if len({q.gpu_type for q in quotas}) != len(quotas):
        raise ValueError(f"{where}: Queue {name}: two quotas map to the same GPU type")
    text = queue.metadata.annotations.get(JOB_SHARE_ANNOTATION)
    share = None
    if text is not None:
        try:
            share = float(text)
        except ValueError:
            share = -1.0
        if not share > 0:
            raise ValueError(f"{where}: Queue {name}: {JOB_SHARE_ANNOTATION} must be > 0")
    return name, queue.spec.model_copy(update={"quotas": quotas}), share


def load_queues(path: Path, capacity: Mapping[str, int]) -> QueueSetup:
    """Read Queue objects from a YAML file; ValueError (one line, naming the object) if bad.

    Each Queue's gpuTypes are mapped to simulator types by name; every type must be in
    `capacity`, and the queues' nominal quotas of a type may not add up to more than it.
    Jobs are shared by the `JOB_SHARE_ANNOTATION` of every queue, else by nominal GPUs.
    """
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML ({exc})".replace("\n", " ")) from exc
    specs: dict[str, QueueSpec] = {}
    shares: dict[str, float] = {}
    for i, doc in enumerate(docs):
        where = f"{path}: document {i + 1}"
        name, spec, share = _read_queue(where, doc, capacity)
        if name in specs:
            raise ValueError(f"{where}: Queue {name} repeated")
        specs[name] = spec
        if share is not None:
            shares[name] = share
    if not specs:
        raise ValueError(f"{path}: no Queue")
    for g, cap in capacity.items():
        total = sum(q.gpus for s in specs.values() for q in s.quotas if q.gpu_type == g)
        if total > cap:
            raise ValueError(f"{path}: nominal {g} quotas add up to {total} > {cap} in the cluster")
    if shares and set(shares) != set(specs):
        raise ValueError(f"{path}: give {JOB_SHARE_ANNOTATION} on every Queue or on none")
    setup = QueueSetup(specs, shares)
    if not shares:
        setup = QueueSetup(specs, {n: float(setup.nominal_gpus(n)) for n in specs})
    if not sum(setup.job_share.values()) > 0:
        raise ValueError(f"{path}: every Queue has zero nominal GPUs: give {JOB_SHARE_ANNOTATION}")
    return setup


def assign_queues(jobs: Sequence[Job], setup: QueueSetup, seed: int) -> dict[int, str]:
    """Each job's queue, drawn with probability proportional to the queue's job share.

    Seeded by `seed` through a generator of its own, so job types and deadlines are the
    same with and without queues. Jobs are drawn in job id order (deterministic).
    """
    rng = random.Random(f"queues-{seed}")
    names = sorted(setup.specs)
    weights = [setup.job_share[n] for n in names]
    return {j.job_id: rng.choices(names, weights)[0] for j in sorted(jobs, key=lambda j: j.job_id)}


def max_gpus(setup: QueueSetup, queue: str) -> dict[str, int]:
    """The most GPUs of each type the queue may ever hold (`QuotaBook.ceiling`).

    Its nominal quota plus what it may borrow: up to its borrowing limit of what the
    other queues of its cohort lend (their nominal quota, or their lending limit).
    """
    book = setup.limits
    quota = book.queues[queue]
    return {t: book.ceiling(quota, (t, Unit.GPUS)) for t in quota.gpu_types()}


def check_fit(jobs: Sequence[Job], job_queue: Mapping[int, str], setup: QueueSetup) -> None:
    """ValueError if a job's gang can never be admitted by its queue (on any one type)."""
    for j in jobs:
        q = job_queue[j.job_id]
        most = max(max_gpus(setup, q).values(), default=0)
        if j.num_gpus > most:
            raise ValueError(
                f"job {j.job_id} needs {j.num_gpus} GPUs of one type; queue {q} may hold "
                f"at most {most} of any type"
            )


def check_quotas(
    alloc: Mapping[int, str],
    jobs: Mapping[int, Job],
    job_queue: Mapping[int, str],
    setup: QueueSetup,
) -> None:
    """Raise RuntimeError if a queue or a cohort holds more than its quota allows.

    A queue may hold nominal + borrowable (`max_gpus`); a cohort, its nominal total;
    and the members of a cohort together hold no more above their guaranteed quota
    (nominal less what a lending limit keeps from the cohort) than they lend.
    A breach is a bug in the wrapper or the accounting: a real fault.
    """
    used: Counter[tuple[str, str]] = Counter()
    for jid, g in alloc.items():
        used[(job_queue[jid], g)] += jobs[jid].num_gpus
    cohorts: Counter[tuple[str, str]] = Counter()
    for name, spec in setup.specs.items():
        ceiling = max_gpus(setup, name)
        for (q, g), n in used.items():
            if q == name and n > ceiling.get(g, 0):
                raise RuntimeError(
                    f"queue {q} holds {n} {g} > nominal + borrowable {ceiling.get(g, 0)}"
                )
            if q == name and spec.cohort:
                cohorts[(spec.cohort, g)] += n
    for (cohort, g), n in cohorts.items():
        total = sum(
            x.gpus
            for s in setup.specs.values()
            if s.cohort == cohort
            for x in s.quotas
            if x.gpu_type == g
        )
        if n > total:
            raise RuntimeError(f"cohort {cohort} holds {n} {g} > its nominal {total}")
    _check_lending(used, setup)


def _check_lending(used: Mapping[tuple[str, str], int], setup: QueueSetup) -> None:
    """Raise RuntimeError if a cohort holds more above its guaranteed quota than it lends."""
    over: Counter[tuple[str, str]] = Counter()
    lendable: Counter[tuple[str, str]] = Counter()
    for quota in setup.limits.queues.values():
        if quota.cohort is None:
            continue
        for g in quota.gpu_types():
            pool = (g, Unit.GPUS)
            over[(quota.cohort, g)] += quota.over_guaranteed(pool, used[(quota.name, g)])
            lendable[(quota.cohort, g)] += quota.lendable(pool)
    for (cohort, g), n in over.items():
        if n > lendable[(cohort, g)]:
            raise RuntimeError(
                f"cohort {cohort} holds {n} {g} above its queues' guaranteed quota > the "
                f"{lendable[(cohort, g)]} they lend"
            )


@dataclass(frozen=True)
class Snapshot:
    """One decision: when, GPUs held per (queue, type) from then on, GPUs each queue wants."""

    at_s: float
    used: dict[tuple[str, str], int]
    demand: dict[str, int]


@dataclass
class QuotaPolicy:
    """Any training policy, admitted against Queues by `workloads.quota` (module docstring)."""

    inner: TrainingPolicy
    setup: QueueSetup
    job_queue: Mapping[int, str]
    trace: list[Snapshot] = field(default_factory=list)
    _since: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Name the run after the wrapped policy; the local queues map one to one."""
        self.name = f"{self.inner.name}+queues"
        self.preemptive = self.inner.preemptive
        self._local = {(n, LOCAL_QUEUE): LocalQueueSpec(queue=n) for n in self.setup.specs}
        self._types = {
            n: QueueQuota.from_spec(n, s).gpu_types() for n, s in self.setup.specs.items()
        }

    def _alternatives(self, js: JobState, first: Sequence[str | None]) -> tuple[Demand, ...]:
        types = self._types[self.job_queue[js.job.job_id]]
        by_speed = sorted(types, key=lambda g: (-js.job.speed[g], g != js.gpu_type, g))
        order = dict.fromkeys([g for g in first if g in types] + by_speed)
        return tuple(Demand(g, gpus=js.job.num_gpus) for g in order)

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        """The wrapped policy's wish, admitted against the queues; job_id -> GPU type."""
        wish = self.inner.allocate(now, active, capacity)
        by_id = {js.job.job_id: js for js in active}
        kept = [
            js
            for js in active
            if js.gpu_type is not None and wish.get(js.job.job_id) == js.gpu_type
        ]
        book = QuotaBook(
            self.setup.specs,
            self._local,
            [
                AdmittedWorkload(
                    str(js.job.job_id),
                    self.job_queue[js.job.job_id],
                    {(js.gpu_type, Unit.GPUS): js.job.num_gpus},  # type: ignore[dict-item]
                    self._since.get(js.job.job_id, 0.0),
                )
                for js in kept
            ],
        )
        kept_ids = {js.job.job_id for js in kept}
        moved = [jid for jid in wish if jid not in kept_ids]
        by_age = sorted(
            (js for js in active if js.job.job_id not in kept_ids),
            key=lambda s: (s.job.arrival_s, s.job.job_id),
        )
        pending = [
            PendingWorkload(
                str(js.job.job_id),
                self.job_queue[js.job.job_id],
                LOCAL_QUEUE,
                self._alternatives(js, (wish.get(js.job.job_id),)),
            )
            for js in by_age
        ]
        # the wish first, in the policy's order, as the operator's pass admits
        pending = policy_first(book, pending, {str(jid): r for r, jid in enumerate(moved)})
        alloc = {js.job.job_id: js.gpu_type for js in kept if js.gpu_type is not None}
        for key, decision in admit(book, pending, now).items():
            for victim in decision.victims:
                alloc.pop(int(victim), None)
            if decision.verdict is not Verdict.WAIT and decision.demand is not None:
                alloc[int(key)] = decision.demand.gpu_type
        check_quotas(alloc, {jid: js.job for jid, js in by_id.items()}, self.job_queue, self.setup)
        for jid, g in alloc.items():
            if by_id[jid].gpu_type != g:
                self._since[jid] = now
        self._record(now, active, alloc)
        return alloc

    def _record(self, now: float, active: Sequence[JobState], alloc: Mapping[int, str]) -> None:
        used: Counter[tuple[str, str]] = Counter()
        demand: Counter[str] = Counter()
        for js in active:
            q = self.job_queue[js.job.job_id]
            demand[q] += js.job.num_gpus
            g = alloc.get(js.job.job_id)
            if g is not None:
                used[(q, g)] += js.job.num_gpus
        self.trace.append(Snapshot(now, dict(used), dict(demand)))
