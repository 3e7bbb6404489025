"""Queue quota accounting: admit, borrow by fair share, wait with a reason, reclaim (pure).

Why: a Queue (`api.v1alpha1.queue`) gives a team a nominal quota per GPU type
and lets the queues of a cohort lend each other what they do not use. This
module holds every rule of that accounting, on plain typed values, so the
TrainingJob controller (and later the other workload controllers) only feeds
it the Queues, LocalQueues and admitted workloads it reads, and writes back
what it returns. The rules (docs/queues.md):

- a pending workload is admitted against the Queue its LocalQueue names,
  with one of its GPU-type alternatives; within its queue's nominal quota
  first (pass 1, in the caller's order);
- a workload within its nominal quota whose quota is lent out reclaims it
  (pass 2, before anyone borrows more): under `PreemptBorrowed`, from the
  queues that borrowed most for their weight, lowest priority and newest
  workload first, only as many as needed; under `Never` it waits for the
  borrowers to finish;
- then by borrowing the cohort's unused lendable quota (its nominal quota,
  less what lending limits keep back as each queue's guaranteed part), up to
  the queue's borrowing limit; when several queues want to borrow, the one whose
  dominant borrowed share (borrowed / cohort lendable, over GPU types),
  divided by its weight, would be lowest after admission goes first (DRF,
  pass 3);
- under `withinQueue: LowerPriority`, a workload that still neither fits nor
  may borrow preempts preemptible workloads of its own queue with a lower
  priority, lowest priority and newest first, only as many as needed (pass 4,
  Kueue's `withinClusterQueue: LowerPriority`);
- under `reclaim.fairShare: Preempt`, a workload that would borrow but finds
  nothing left to lend stops borrowed work of the cohort's queues above their
  fair share, the highest weighted dominant share first (pass 5, Kueue's
  fair-sharing preemption, `fair_share_victims`);
- everything else waits with a message naming the queue, the GPU type and
  the quota that blocks.

Within a queue, a workload that does not fit does not hold back later ones
(Kueue's BestEffortFIFO), unless the queue is `StrictFIFO`: then each pass
considers only its first workload not yet admitted, so a waiting head holds
back every later workload of its queue (`_eligible`). With no Queue at all,
quotas are off and every workload is admitted (clusters that never create a
Queue work as before).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from copy import copy as shallow_copy
from dataclasses import dataclass, field, replace
from enum import StrEnum

from chronotope.api.v1alpha1.localqueue import LocalQueueSpec
from chronotope.api.v1alpha1.queue import (
    MILLI_PER_GPU,
    FairSharePolicy,
    GpuTypeUsage,
    LabelSelector,
    QueueingStrategy,
    QueueSpec,
    QueueStatus,
    ReclaimPolicy,
    StopPolicy,
    WhenCanBorrow,
    WhenCanPreempt,
    WithinQueuePolicy,
)
from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.node_fit import NamespaceLabels

__all__ = [
    "Admission",
    "AdmittedWorkload",
    "Demand",
    "PendingWorkload",
    "QueueQuota",
    "QuotaBook",
    "Resource",
    "StopCause",
    "Unit",
    "Verdict",
    "WaitReason",
    "admit",
    "demands_of",
    "fair_share_victims",
    "fits_now",
    "forecast_starts",
    "policy_first",
    "queue_statuses",
    "reclaim_to_fit",
    "reclaim_victims",
    "room_once_released",
    "stopped",
    "within_queue_victims",
]


class Unit(StrEnum):
    """The two quota pools of a GPU type: whole GPUs, and shares in thousandths of a GPU."""

    GPUS = "gpus"
    SHARE_MILLI = "shareMilli"


Resource = tuple[str, Unit]
"""One quota pool: (GPU type, unit)."""


@dataclass(frozen=True)
class QueueQuota:
    """One Queue's quota, as the accounting reads it."""

    name: str
    nominal: Mapping[Resource, int]
    borrowing_limit: Mapping[Resource, int]  # a pool absent here may borrow without limit
    cohort: str | None = None
    lending_limit: Mapping[Resource, int] = field(default_factory=dict)
    """Most of each pool's nominal quota lent to the cohort; a pool absent here lends all."""
    weight: float = 1.0
    reclaim: ReclaimPolicy = ReclaimPolicy.NEVER
    grace_seconds: int = 30
    within_queue: WithinQueuePolicy = WithinQueuePolicy.NEVER
    fair_share: bool = False
    """`reclaim.fairShare: Preempt`: a borrower may stop borrowed work of queues above their
    fair share (`fair_share_victims`)."""
    stop: StopPolicy = StopPolicy.NONE
    strict: bool = False
    """`queueingStrategy: StrictFIFO`: its first waiting workload holds back the later ones."""
    borrow_first: bool = True
    """`flavorFungibility.whenCanBorrow: Borrow`: the first alternative that fits by borrowing
    wins over a later one within nominal quota (False: `TryNextFlavor`)."""
    reclaim_first: bool = False
    """`flavorFungibility.whenCanPreempt: Preempt`: the first alternative that fits by
    preempting (reclaiming borrowed quota, or its own lower-priority work under
    `within_queue`), with enough work to stop, wins over later ones (False: `TryNextFlavor`,
    it is taken only when nothing fits otherwise)."""
    namespaces: LabelSelector | None = None
    """`namespaceSelector`: the namespaces whose workloads it admits (None: all)."""
    types: frozenset[str] = field(init=False, repr=False, compare=False)
    """The GPU types `nominal` names (admission asks this of every alternative)."""
    group: str = field(init=False, repr=False, compare=False)
    """What shares quota with it: `cohort:NAME`, or `queue:NAME` for a queue without one."""

    def __post_init__(self) -> None:
        """Index the GPU types and name the sharing group once."""
        object.__setattr__(self, "types", frozenset(t for t, _ in self.nominal))
        group = f"cohort:{self.cohort}" if self.cohort is not None else f"queue:{self.name}"
        object.__setattr__(self, "group", group)

    @classmethod
    def from_spec(cls, name: str, spec: QueueSpec) -> QueueQuota:
        """The accounting view of a Queue's spec."""
        nominal: dict[Resource, int] = {}
        limit: dict[Resource, int] = {}
        lend: dict[Resource, int] = {}
        for q in spec.quotas:
            nominal[(q.gpu_type, Unit.GPUS)] = q.gpus
            nominal[(q.gpu_type, Unit.SHARE_MILLI)] = q.share_milli
            if q.borrowing_limit is not None:
                limit[(q.gpu_type, Unit.GPUS)] = q.borrowing_limit
                limit[(q.gpu_type, Unit.SHARE_MILLI)] = q.borrowing_limit * MILLI_PER_GPU
            if q.lending_limit is not None:
                lend[(q.gpu_type, Unit.GPUS)] = q.lending_limit
                lend[(q.gpu_type, Unit.SHARE_MILLI)] = q.lending_limit * MILLI_PER_GPU
        return cls(
            name=name,
            nominal=nominal,
            borrowing_limit=limit,
            lending_limit=lend,
            cohort=spec.cohort,
            weight=spec.weight,
            reclaim=spec.reclaim.policy,
            grace_seconds=spec.reclaim.grace_period_seconds,
            within_queue=spec.reclaim.within_queue,
            fair_share=spec.reclaim.fair_share is FairSharePolicy.PREEMPT,
            stop=spec.stop_policy,
            strict=spec.queueing_strategy is QueueingStrategy.STRICT_FIFO,
            borrow_first=spec.flavor_fungibility.when_can_borrow is WhenCanBorrow.BORROW,
            reclaim_first=spec.flavor_fungibility.when_can_preempt is WhenCanPreempt.PREEMPT,
            namespaces=spec.namespace_selector,
        )

    def gpu_types(self) -> list[str]:
        """The GPU types the queue lists, sorted."""
        return sorted(self.types)

    def lendable(self, pool: Resource) -> int:
        """The part of its nominal quota of `pool` the queue lends while it does not use it."""
        nominal = self.nominal.get(pool, 0)
        limit = self.lending_limit.get(pool)
        return nominal if limit is None else min(nominal, limit)

    def guaranteed(self, pool: Resource) -> int:
        """The part of its nominal quota of `pool` that is its own alone (never lent)."""
        return self.nominal.get(pool, 0) - self.lendable(pool)

    def over_guaranteed(self, pool: Resource, used: int) -> int:
        """What using `used` of `pool` takes of its cohort's lendable pool (above guaranteed)."""
        return max(0, used - self.guaranteed(pool))


@dataclass(frozen=True)
class Demand:
    """What a workload holds on one alternative: one GPU type, or several at once (`also`)."""

    gpu_type: str
    gpus: int = 0
    share_milli: int = 0
    also: tuple[Demand, ...] = ()
    """What it holds on other GPU types at the same time (a serving workload whose stages
    run on several types): admitted all together or not at all (`Demand.together`)."""

    @classmethod
    def together(cls, parts: Sequence[Demand]) -> Demand:
        """One demand for all of `parts` (one per GPU type) at once; the first names it."""
        first, *rest = parts
        return replace(first, also=(*first.also, *rest))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """Every GPU type it takes quota of, its own first."""
        return (self.gpu_type, *(t for d in self.also for t in d.gpu_types))

    @property
    def label(self) -> str:
        """Its GPU types for messages: `A100` or `A100 + L4`."""
        return " + ".join(self.gpu_types)

    def pools(self) -> dict[Resource, int]:
        """The quota pools this demand takes, with amounts (zero amounts left out)."""
        if not self.also:  # the common case, on every fit check: no Counter
            own = {(self.gpu_type, Unit.GPUS): self.gpus}
            own[(self.gpu_type, Unit.SHARE_MILLI)] = self.share_milli
            return {r: n for r, n in own.items() if n > 0}
        found: Counter[Resource] = Counter(
            {
                (self.gpu_type, Unit.GPUS): self.gpus,
                (self.gpu_type, Unit.SHARE_MILLI): self.share_milli,
            }
        )
        for part in self.also:
            found.update(part.pools())
        return {r: n for r, n in found.items() if n > 0}


def demands_of(spec: TrainingJobSpec, workers: int | None = None) -> tuple[Demand, ...]:
    """A TrainingJob's alternatives, in its gpuTypes order, for `workers` (default: replicas)."""
    n = spec.replicas if workers is None else workers
    if spec.gpu.shared is not None:
        milli = spec.gpu.shared.compute_percent * MILLI_PER_GPU // 100
        return tuple(Demand(t.name, share_milli=milli * n) for t in spec.gpu_types)
    return tuple(Demand(t.name, gpus=(spec.gpu.count or 1) * n) for t in spec.gpu_types)


@dataclass(frozen=True)
class AdmittedWorkload:
    """A workload that holds quota: its Queue, its usage, and when it was admitted."""

    key: str
    queue: str
    usage: Mapping[Resource, int]
    admitted_at: float = 0.0  # any monotone clock; larger is newer
    reclaimable: bool = True
    """False for serving workloads (InferencePipeline stages, serving groups): they hold
    quota, but reclaiming never stops them."""
    priority: int = 0
    preemptible: bool = False
    """Whether a higher-priority workload of its own queue may stop it (`withinQueue`)."""


@dataclass(frozen=True)
class PendingWorkload:
    """A workload waiting for quota: its namespace, LocalQueue name and alternatives."""

    key: str
    namespace: str
    local_queue: str
    alternatives: tuple[Demand, ...]
    priority: int = 0
    preempts_within_queue: bool = True
    """False: it may stop borrowers (passes 2 and 5) but never its own queue's work (pass 4):
    a serving workload in the TrainingJob admission cycle, whose controller never does."""


class StopCause(StrEnum):
    """Whose work a RECLAIM verdict stops (the victims' preemption cause in metrics)."""

    RECLAIM = "Reclaim"  # borrowers of the quota its queue lent (pass 2)
    FAIR_SHARE = "FairShare"  # borrowers above their fair share (pass 5)
    WITHIN_QUEUE = "WithinQueue"  # its own queue's lower-priority work (pass 4)
    LEASE = "Lease"  # its own queue's work whose lease the cluster policy gives it (pass 6)


class Verdict(StrEnum):
    """What a pending workload may do now."""

    ADMIT = "Admit"  # within its queue's nominal quota
    BORROW = "Borrow"  # above nominal, on quota the cohort lends
    RECLAIM = "Reclaim"  # admitted once the `victims` have stopped (borrowers, or see below)
    WAIT = "Wait"


class WaitReason(StrEnum):
    """Why a workload waits (the condition reason the controller writes)."""

    LOCAL_QUEUE_MISSING = "LocalQueueMissing"
    QUEUE_MISSING = "QueueMissing"
    NO_QUOTA_FOR_TYPE = "NoQuotaForGpuType"
    QUOTA_EXCEEDED = "QuotaExceeded"
    QUEUE_STOPPED = "QueueStopped"
    NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"


@dataclass(frozen=True)
class Admission:
    """The decision for one pending workload."""

    key: str
    verdict: Verdict
    queue: str | None = None
    demand: Demand | None = None  # the alternative chosen (None while waiting)
    borrowed: Mapping[Resource, int] = field(default_factory=dict)
    victims: tuple[str, ...] = ()  # RECLAIM: stop these (with grace_seconds) first
    cause: StopCause = StopCause.RECLAIM
    """RECLAIM: whose work the victims are."""
    grace_seconds: int | None = None
    reason: WaitReason | None = None
    message: str = ""
    quota_frees_at: float | None = None
    """WAIT (quota exceeded): when the plan-ahead expects the quota to free up for it."""
    preferred: tuple[str, float, str] | None = None
    """ADMIT or BORROW on another type than the one its decision preferred: (that type,
    when its quota frees up for it, whose end frees it), for the plan-ahead to weigh."""


class QuotaBook:
    """Queues, LocalQueues and what admitted workloads use: one cycle's mutable ledger."""

    def __init__(
        self,
        queues: Mapping[str, QueueSpec],
        local_queues: Mapping[tuple[str, str], LocalQueueSpec],
        admitted: Iterable[AdmittedWorkload] = (),
        namespaces: NamespaceLabels | None = None,
    ) -> None:
        """Build the ledger from the Queues and LocalQueues ((namespace, name) keys).

        `namespaces`: each namespace's labels, for Queues with a `namespaceSelector`
        (None: not known, and such a Queue admits nothing: it fails closed).
        """
        self.queues = {name: QueueQuota.from_spec(name, spec) for name, spec in queues.items()}
        self.namespace_labels = namespaces
        self.local_queues = {key: spec.queue for key, spec in local_queues.items()}
        self.usage: dict[str, Counter[Resource]] = {name: Counter() for name in self.queues}
        self.workloads: dict[str, AdmittedWorkload] = {}
        self._members: dict[str, list[QueueQuota]] = {}
        self._pool_lendable: Counter[tuple[str, Resource]] = Counter()
        """Per (cohort, or the lone queue's own name) and pool: the members' lendable quota."""
        self._pool_over: Counter[tuple[str, Resource]] = Counter()
        """Per (cohort, or the lone queue's own name) and pool: what the members use above
        their guaranteed (never lent) quota, which is what they take of the lendable pool."""
        for q in self.queues.values():
            members = (
                [q]
                if q.cohort is None
                else [m for m in self.queues.values() if m.cohort == q.cohort]
            )
            self._members[q.name] = members
            for pool in q.nominal:
                self._pool_lendable[(q.group, pool)] += q.lendable(pool)
        for workload in admitted:
            self.add(workload)

    def add(self, workload: AdmittedWorkload) -> None:
        """Count a workload's usage (a workload of a deleted Queue counts nowhere)."""
        if workload.queue in self.usage:
            self.workloads[workload.key] = workload
            self._count(workload, 1)

    def copy(self) -> QuotaBook:
        """A ledger to change without changing this one (the Queues are shared, not copied)."""
        other = shallow_copy(self)
        other.usage = {name: Counter(used) for name, used in self.usage.items()}
        other.workloads = dict(self.workloads)
        other._pool_over = Counter(self._pool_over)
        return other

    def remove(self, key: str) -> None:
        """Stop counting an admitted workload (it is being preempted or has ended)."""
        self._count(self.workloads.pop(key), -1)

    def _count(self, workload: AdmittedWorkload, sign: int) -> None:
        queue = self.queues[workload.queue]
        used = self.usage[queue.name]
        group = queue.group
        for pool, n in workload.usage.items():
            before = queue.over_guaranteed(pool, used[pool])
            used[pool] += sign * n
            self._pool_over[(group, pool)] += queue.over_guaranteed(pool, used[pool]) - before

    def refuses(self, queue: QueueQuota, namespace: str) -> str | None:
        """Why `queue` admits no workload of `namespace` (its `namespaceSelector`), or None."""
        if queue.namespaces is None:
            return None
        if self.namespace_labels is None:
            return f"Queue {queue.name} has a namespaceSelector and namespace labels are unknown"
        if queue.namespaces.matches(self.namespace_labels.get(namespace) or {}):
            return None
        return f"Queue {queue.name}'s namespaceSelector does not select namespace {namespace}"

    def members(self, queue: QueueQuota) -> list[QueueQuota]:
        """The queues that share quota with `queue` (itself alone without a cohort)."""
        return self._members.get(queue.name) or [queue]

    def ceiling(self, queue: QueueQuota, pool: Resource) -> int:
        """The most of `pool` the queue could ever hold: its nominal quota and what it may borrow.

        0 for a pool its Queue does not list (work may use only the listed types).
        It may borrow up to its borrowing limit of what the other queues of its cohort
        lend (their nominal quota, or their lending limit where they set one).
        """
        if pool not in queue.nominal:
            return 0
        own = queue.nominal[pool]
        if queue.cohort is None:
            return own
        others = self._pool_lendable[(queue.group, pool)] - queue.lendable(pool)
        limit = queue.borrowing_limit.get(pool)
        return own + (others if limit is None else min(limit, others))

    def used(self, queue: str, pool: Resource) -> int:
        """What the queue's admitted workloads hold of `pool`."""
        return self.usage[queue][pool]

    def borrowed(self, queue: QueueQuota, pool: Resource) -> int:
        """What the queue uses of `pool` above its nominal quota."""
        return max(0, self.used(queue.name, pool) - queue.nominal.get(pool, 0))

    def cohort_free(self, queue: QueueQuota, pool: Resource) -> int:
        """What `queue` could take of `pool` now without anyone giving quota back.

        Its own guaranteed quota that it does not use, plus the lendable quota of
        its cohort (its own lendable part included) that nobody uses. Without
        lending limits: the cohort's (or the lone queue's) unused nominal quota.
        """
        used = self.used(queue.name, pool) if queue.name in self.usage else 0
        own = max(0, queue.guaranteed(pool) - used)
        if queue.name not in self._members:  # not one of the book's queues
            return own + max(0, queue.lendable(pool) - queue.over_guaranteed(pool, used))
        key = (queue.group, pool)
        return own + max(0, self._pool_lendable[key] - self._pool_over[key])

    def room_now(self, queue: QueueQuota, pool: Resource) -> int:
        """The most of `pool` one more workload of `queue` may take now without reclaiming.

        What `_fit` admits within nominal quota or by borrowing: no more than
        `cohort_free`, and no more than its nominal quota left without a cohort,
        or its nominal quota plus borrowing limit left with one. 0 for a type its
        Queue does not list. A stopped queue is the caller's to refuse.
        """
        if pool[0] not in queue.types:
            return 0
        used = self.used(queue.name, pool) if queue.name in self.usage else 0
        nominal = queue.nominal.get(pool, 0)
        free = self.cohort_free(queue, pool)
        if queue.cohort is None:
            return max(0, min(free, nominal - used))
        limit = queue.borrowing_limit.get(pool)
        return max(0, free if limit is None else min(free, nominal + limit - used))

    def dominant_share(
        self, queue: QueueQuota, extra: Mapping[Resource, int] | None = None
    ) -> float:
        """Largest borrowed / cohort-lendable over pools (with `extra` added), over weight."""
        extra = extra or {}
        share = 0.0
        for pool in set(queue.nominal) | set(extra):
            total = self._pool_lendable[(queue.group, pool)]
            over = self.used(queue.name, pool) + extra.get(pool, 0) - queue.nominal.get(pool, 0)
            if total > 0 and over > 0:
                share = max(share, over / total)
        return share / queue.weight


@dataclass(frozen=True)
class _Fit:
    verdict: Verdict
    borrowed: dict[Resource, int]
    blocked: str = ""  # WAIT: what blocks, for the message
    reason: WaitReason = WaitReason.QUOTA_EXCEEDED


def _label(pool: Resource) -> str:
    return pool[0] if pool[1] is Unit.GPUS else f"{pool[0]} shares (milli)"


def _fit(book: QuotaBook, queue: QueueQuota, demand: Demand) -> _Fit:
    """Whether `demand` fits `queue` now: within nominal, by borrowing, by reclaiming, or not."""
    missing = (
        [t for t in demand.gpu_types if t not in queue.types]
        if demand.also
        else [demand.gpu_type] * (demand.gpu_type not in queue.types)
    )
    if missing:
        types = ", ".join(queue.gpu_types())
        text = f"queue {queue.name} has no quota for {', '.join(missing)} (its types: {types})"
        return _Fit(Verdict.WAIT, {}, text, WaitReason.NO_QUOTA_FOR_TYPE)
    verdicts: list[Verdict] = []
    borrowed: dict[Resource, int] = {}
    for pool, amount in demand.pools().items():
        nominal, used = queue.nominal.get(pool, 0), book.used(queue.name, pool)
        head = f"queue {queue.name}: {_label(pool)} {used}/{nominal} in use"
        free = book.cohort_free(queue, pool)
        over = used + amount - nominal
        if over <= 0:
            if free >= amount:
                verdicts.append(Verdict.ADMIT)
            elif queue.reclaim is ReclaimPolicy.PREEMPT_BORROWED:
                verdicts.append(Verdict.RECLAIM)
            else:
                lent = amount - free
                text = f"{head}, {lent} lent in cohort {queue.cohort}; reclaim policy Never waits"
                return _Fit(Verdict.WAIT, {}, text + " for the borrowers to finish")
            continue
        if queue.cohort is None:
            return _Fit(Verdict.WAIT, {}, f"{head}, no cohort to borrow from")
        limit = queue.borrowing_limit.get(pool)
        if limit is not None and over > limit:
            return _Fit(Verdict.WAIT, {}, f"{head}, borrowing limit {limit}")
        if free < amount:
            return _Fit(Verdict.WAIT, {}, f"{head}, cohort {queue.cohort} has {free} to lend")
        verdicts.append(Verdict.BORROW)
        borrowed[pool] = over - book.borrowed(queue, pool)
    if Verdict.RECLAIM in verdicts and Verdict.BORROW in verdicts:
        text = f"queue {queue.name}: {demand.label} needs both borrowed and reclaimed quota"
        return _Fit(Verdict.WAIT, {}, text)
    worst = max(verdicts, key=_ORDER.index, default=Verdict.ADMIT)
    return _Fit(worst, borrowed)


_ORDER = (Verdict.ADMIT, Verdict.BORROW, Verdict.RECLAIM, Verdict.WAIT)


def _best(
    book: QuotaBook, queue: QueueQuota, pending: PendingWorkload, spare: Collection[str] = ()
) -> tuple[Demand, _Fit]:
    """The alternative admission takes (Kueue's flavor fungibility).

    In order, the first alternative that fits within nominal quota, or by
    borrowing under `borrow_first`, or, under `reclaim_first`, by preempting
    when enough work can be stopped (Kueue tries the next flavor when
    preemption would find no targets): reclaiming borrowed quota (pass 2), or
    the queue's own lower-priority work (pass 4, whose WAIT verdict keeps the
    passes before it from admitting a later alternative). When none does, the
    one with the best verdict (ADMIT, BORROW, RECLAIM, WAIT; earlier
    alternatives win ties). The workloads of `spare` (admitted in this cycle) are
    never victims, as Kueue preempts only what was admitted before its cycle.
    """
    fits = [(demand, _fit(book, queue, demand)) for demand in pending.alternatives]
    if queue.borrow_first or queue.reclaim_first:
        for demand, fit in fits:
            if fit.verdict is Verdict.ADMIT or (
                fit.verdict is Verdict.BORROW and queue.borrow_first
            ):
                return demand, fit
            if not queue.reclaim_first:
                continue
            if (
                fit.verdict is Verdict.RECLAIM
                and reclaim_victims(book, queue, demand, spare) is not None
            ):
                return demand, fit
            if (
                fit.verdict is Verdict.WAIT
                and queue.within_queue is WithinQueuePolicy.LOWER_PRIORITY
                and within_queue_victims(book, queue, pending.priority, demand, spare)
            ):
                return demand, fit
    return min(fits, key=lambda pair: _ORDER.index(pair[1].verdict))


def _resolve(book: QuotaBook, pending: PendingWorkload) -> QueueQuota | Admission:
    """The workload's Queue, or a WAIT naming the missing LocalQueue or Queue."""
    name = book.local_queues.get((pending.namespace, pending.local_queue))
    if name is None:
        text = f"no LocalQueue {pending.local_queue} in namespace {pending.namespace}"
        return Admission(
            pending.key, Verdict.WAIT, None, reason=WaitReason.LOCAL_QUEUE_MISSING, message=text
        )
    queue = book.queues.get(name)
    if queue is None:
        where = f"{pending.namespace}/{pending.local_queue}"
        text = f"LocalQueue {where} names Queue {name}, which does not exist"
        return Admission(
            pending.key, Verdict.WAIT, name, reason=WaitReason.QUEUE_MISSING, message=text
        )
    refused = book.refuses(queue, pending.namespace)
    if refused is not None:
        why = WaitReason.NAMESPACE_NOT_ALLOWED
        return Admission(pending.key, Verdict.WAIT, name, reason=why, message=refused)
    if queue.stop is not StopPolicy.NONE:
        return Admission(
            pending.key, Verdict.WAIT, name, reason=WaitReason.QUEUE_STOPPED, message=stopped(queue)
        )
    return queue


def stopped(queue: QueueQuota) -> str:
    """Why a stopped queue admits nothing (its waiting workloads' message)."""
    return (
        f"queue {queue.name} is stopped (stopPolicy {queue.stop.value}): it admits nothing "
        "until its stopPolicy is None"
    )


def fits_now(book: QuotaBook, queue: QueueQuota, key: str, demands: Sequence[Demand]) -> str | None:
    """Whether a workload that needs all of `demands` at once fits `queue` now, or why not.

    Within nominal quota or by borrowing in the cohort; a demand that would need
    reclaiming lent quota does not fit (`reclaim_to_fit` says what reclaiming
    would stop). The book counts what fits, so the next demand is checked on top of it.
    """
    if queue.stop is not StopPolicy.NONE:
        return stopped(queue)
    for demand in demands:
        fit = _fit(book, queue, demand)
        if fit.verdict is Verdict.RECLAIM:
            return (
                f"queue {queue.name}: {demand.label} fits its nominal quota only once "
                f"borrowers in cohort {queue.cohort} give it back"
            )
        if fit.verdict is Verdict.WAIT:
            asks = ", ".join(f"{n} {_label(p)}" for p, n in demand.pools().items())
            return f"{fit.blocked}; it asks for {asks}"
        _apply(book, key, queue, demand, 0.0)
    return None


def reclaim_to_fit(
    book: QuotaBook, queue: QueueQuota, key: str, demands: Sequence[Demand]
) -> dict[str, StopCause] | None:
    """The borrowed workloads to stop so that all of `demands` fit `queue`; None if none do.

    Each demand fits within nominal quota, by borrowing, or within nominal quota
    once borrowers of the cohort give back what it lent (`reclaim_victims`: only
    under `reclaim.policy: PreemptBorrowed`, serving borrowers never stopped), or,
    under `reclaim.fairShare: Preempt`, by borrowing once borrowers above their
    fair share stop (`fair_share_victims`). Victim -> why it stops (in order);
    empty: everything fits without stopping anyone. The book counts the demands
    and no longer the victims, so the next demand is checked on top of them.
    """
    if queue.stop is not StopPolicy.NONE:
        return None
    victims: dict[str, StopCause] = {}
    for demand in demands:
        fit = _fit(book, queue, demand)
        stop: tuple[str, ...] | None = ()
        cause = StopCause.RECLAIM
        if fit.verdict is Verdict.RECLAIM:
            stop = reclaim_victims(book, queue, demand)
        elif fit.verdict is Verdict.WAIT:
            stop = fair_share_victims(book, queue, demand) if queue.fair_share else None
            cause = StopCause.FAIR_SHARE
        if not stop and fit.verdict is not Verdict.ADMIT and fit.verdict is not Verdict.BORROW:
            return None
        for victim in stop or ():
            book.remove(victim)
            victims[victim] = cause
        _apply(book, key, queue, demand, 0.0)
    return victims


def room_once_released(
    book: QuotaBook, asks: Mapping[str, Sequence[Demand]]
) -> dict[str, list[Demand]]:
    """Admitted workload -> those of its `asks` that fit its queue once it gives its own hold up.

    Each alone, within nominal quota or by borrowing (nothing reclaimed or
    preempted; a stopped queue has room for nothing); `book` is left as it was.
    A key the book does not count (its Queue is gone) is left out.
    """
    order = list(book.workloads)
    out: dict[str, list[Demand]] = {}
    for key, demands in asks.items():
        held = book.workloads.get(key)
        if held is None:
            continue
        queue = book.queues[held.queue]
        book.remove(key)
        try:
            out[key] = [
                d
                for d in demands
                if queue.stop is StopPolicy.NONE
                and _fit(book, queue, d).verdict in (Verdict.ADMIT, Verdict.BORROW)
            ]
        finally:
            book.add(held)
    _put_back(book, [], order)
    return out


def reclaim_victims(
    book: QuotaBook, queue: QueueQuota, demand: Demand, spare: Collection[str] = ()
) -> tuple[str, ...] | None:
    """Borrowed workloads to stop so `demand` fits `queue`'s nominal quota; None if too few.

    Only workloads of other cohort queues that borrow a needed pool are
    candidates; the queue that borrowed most for its weight goes first, its
    lowest-priority workload first, the newest among equals; a queue stops
    being a candidate once it no longer borrows; victims not needed in the end
    are spared. A victim frees what the
    book counts it to take from the cohort: the part of it within its own
    queue's guaranteed quota (a lending limit's) stays that queue's, not the
    cohort's. The workloads of `spare` (admitted in this cycle) are never
    victims. `book` is left as it was.
    """
    need = [p for p, a in demand.pools().items() if book.cohort_free(queue, p) < a]
    others = [q for q in book.members(queue) if q.name != queue.name]

    def fits() -> bool:
        return _fit(book, queue, demand).verdict is Verdict.ADMIT

    def borrowing(q: QueueQuota) -> float:
        return max((book.borrowed(q, p) / q.weight for p in need), default=0)

    order = list(book.workloads)
    chosen: list[AdmittedWorkload] = []
    try:
        while not fits():
            lenders = [q for q in others if borrowing(q) > 0]
            if not lenders:
                return None
            top = max(sorted(lenders, key=lambda q: q.name), key=borrowing)  # ties: by name
            mine = _stoppable(book, top, need, spare)
            if not mine:  # what it borrows is held by serving work or this cycle's: kept
                others = [q for q in others if q is not top]
                continue
            victim = _first_victim(mine)
            book.remove(victim.key)
            chosen.append(victim)
        return _spared(book, chosen, fits)
    finally:
        _put_back(book, chosen, order)


def _stoppable(
    book: QuotaBook, queue: QueueQuota, need: Sequence[Resource], spare: Collection[str]
) -> list[AdmittedWorkload]:
    """`queue`'s workloads a borrower may stop: never serving ones nor `spare`, holding a `need`."""
    return [
        w
        for w in book.workloads.values()
        if w.queue == queue.name
        and w.reclaimable
        and w.key not in spare
        and any(w.usage.get(p) for p in need)
    ]


def _first_victim(candidates: Sequence[AdmittedWorkload]) -> AdmittedWorkload:
    """Kueue's candidate order: the lowest priority first, then the most recently admitted."""
    return max(candidates, key=lambda w: (-w.priority, w.admitted_at, w.key))


def _spared(
    book: QuotaBook, chosen: list[AdmittedWorkload], fits: Callable[[], bool]
) -> tuple[str, ...]:
    """The victims still needed, sparing (last chosen first) each that the others cover.

    Every one of `chosen` is out of `book`; a spared one is counted again and
    leaves `chosen`.
    """
    for victim in reversed(list(chosen)):
        book.add(victim)
        if fits():
            chosen.remove(victim)
        else:
            book.remove(victim.key)
    return tuple(w.key for w in chosen)


def _put_back(book: QuotaBook, chosen: list[AdmittedWorkload], order: list[str]) -> None:
    """Count the victims `chosen` again, and the workloads in their `order` as before."""
    for victim in chosen:
        book.add(victim)
    book.workloads = {key: book.workloads[key] for key in order}


def within_queue_victims(
    book: QuotaBook,
    queue: QueueQuota,
    priority: int,
    demand: Demand,
    spare: Collection[str] = (),
    *,
    only: Collection[str] | None = None,
    nominal: bool = False,
) -> tuple[str, ...] | None:
    """`queue`'s own lower-priority work to stop so `demand` fits now; None if not enough.

    Candidates are the queue's preemptible workloads (never serving ones) with a
    priority below `priority` that hold a pool `demand` needs: the lowest priority
    first, the newest first among equals, until `demand` fits within nominal quota
    or by borrowing; victims the others cover are spared, and so are the workloads
    of `spare` (admitted in this cycle). With `only`, the candidates are those of its
    workloads, whatever their priority (the cluster policy's lease). `nominal`: until
    `demand` fits within nominal quota (borrowing does not count). `book` is left as
    it was.
    """
    pools = demand.pools()
    candidates = sorted(
        (
            w
            for w in book.workloads.values()
            if w.queue == queue.name
            and w.reclaimable
            and w.preemptible
            and w.key not in spare
            and (w.priority < priority if only is None else w.key in only)
            and any(w.usage.get(p) for p in pools)
        ),
        key=lambda w: (w.priority, -w.admitted_at, w.key),
    )

    fitting = (Verdict.ADMIT,) if nominal else (Verdict.ADMIT, Verdict.BORROW)

    def fits() -> bool:
        return _fit(book, queue, demand).verdict in fitting

    order = list(book.workloads)
    chosen: list[AdmittedWorkload] = []
    try:
        for victim in candidates:
            book.remove(victim.key)
            chosen.append(victim)
            if fits():
                break
        else:
            return None
        return _spared(book, chosen, fits)
    finally:
        _put_back(book, chosen, order)


FORECAST_DEPTH = 10
"""Waiting workloads per Queue whose start `forecast_starts` forecasts (the first in order)."""


def forecast_starts(
    book: QuotaBook,
    waiting: Sequence[PendingWorkload],
    ends: Iterable[tuple[float, str]],
    runs_for: Mapping[str, float],
    *,
    depth: int = FORECAST_DEPTH,
    until: str | None = None,
) -> dict[str, tuple[float, str]]:
    """When each waiting workload's turn on its quota comes: key -> (time, whose end).

    The plan-ahead on quota (TetriSched's, conservative): `ends` are the
    predicted ends (time, key) of admitted workloads; they end in time order,
    and after each end one admission cycle (`admit`, the cycle the operator
    runs now) goes over the workloads still waiting, in their order. A workload
    it admits holds its quota from then for `runs_for[key]` seconds (to the end
    of the forecast if absent), so those behind it wait for it as they will.
    Only the first `depth` waiting workloads of each Queue take part (each cycle
    costs the waiting count): one further back that would fit first under
    BestEffortFIFO is not seen. A workload past the depth, of a missing Queue,
    or that the predicted ends never let in, is absent. A waiting workload the
    book counts as admitted (asked about as if it waited) holds nothing here.
    `book` is left as it was.

    With `until` (a waiting key) only its cohort is forecast, and only until
    its turn comes: what the others get after it is not worked out.
    """
    ahead = book.copy()
    groups: dict[str, list[_Queued]] = {}
    taken: Counter[str] = Counter()
    for p in waiting:
        if p.key in ahead.workloads:
            ahead.remove(p.key)
        queue = _resolve(ahead, p)
        if isinstance(queue, Admission) or taken[queue.name] >= depth:
            continue
        taken[queue.name] += 1
        groups.setdefault(queue.group, []).append((p, queue))
    timeline: dict[str, list[tuple[float, str]]] = {}
    for when, key in ends:
        held = ahead.workloads.get(key)
        if held is not None:
            timeline.setdefault(ahead.queues[held.queue].group, []).append((when, key))
    out: dict[str, tuple[float, str]] = {}
    for group, members in groups.items():
        if until is None or any(p.key == until for p, _ in members):
            out.update(_turns(ahead, members, timeline.get(group, []), runs_for, until))
    return out


def _turns(
    book: QuotaBook,
    waiting: Sequence[_Queued],
    ends: list[tuple[float, str]],
    runs_for: Mapping[str, float],
    until: str | None = None,
) -> dict[str, tuple[float, str]]:
    """`forecast_starts` for the waiting workloads of one cohort (or lone Queue); changes `book`."""
    out: dict[str, tuple[float, str]] = {}
    left = list(waiting)
    asks = {p.key: {pool for d in p.alternatives for pool in d.pools()} for p, _ in waiting}
    heapq.heapify(ends)
    while ends and left and until not in out:
        when = ends[0][0]
        freed: list[str] = []
        pools: set[Resource] = set()
        while ends and ends[0][0] == when:
            _, key = heapq.heappop(ends)
            if key in book.workloads:
                pools.update(book.workloads[key].usage)
                book.remove(key)
                freed.append(key)
        moves = (_may_move(book, p, queue, pools, asks[p.key]) for p, queue in left)
        if not freed or not any(moves):
            continue  # an admission cycle now would admit nothing: skip it
        decisions = admit(book, [p for p, _ in left], when)
        for p, _ in left:
            if decisions[p.key].verdict is not Verdict.WAIT:
                out[p.key] = (when, freed[0])
                if p.key in runs_for:
                    heapq.heappush(ends, (when + runs_for[p.key], p.key))
        left = [(p, queue) for p, queue in left if p.key not in out]
    return out


def _may_move(
    book: QuotaBook,
    p: PendingWorkload,
    queue: QueueQuota,
    pools: set[Resource],
    asks: set[Resource],
) -> bool:
    """Whether an admission cycle might admit `p` now that `pools` have freed up.

    After a cycle every workload left waits, and a fit changes only with the
    pools it takes (`asks`): one asking none of `pools` still waits. Any other is
    tried as every pass starts (`_best`), or may preempt its queue's lower-priority work.
    """
    if pools.isdisjoint(asks):
        return False
    if queue.within_queue is WithinQueuePolicy.LOWER_PRIORITY:
        return True
    return _best(book, queue, p)[1].verdict is not Verdict.WAIT


def _apply(book: QuotaBook, key: str, queue: QueueQuota, demand: Demand, now: float) -> None:
    book.add(AdmittedWorkload(key, queue.name, demand.pools(), now))


_Queued = tuple[PendingWorkload, QueueQuota]
Resolved = list[_Queued]


def admit(
    book: QuotaBook,
    pending: Sequence[PendingWorkload],
    now: float = 0.0,
    *,
    leases: Mapping[str, Collection[str]] | None = None,
) -> dict[str, Admission]:
    """One admission cycle over `pending` (in queue order); updates `book` as it admits.

    Returns a decision per workload key. A RECLAIM decision already counts the
    workload and no longer counts its victims, so later decisions in the same
    cycle neither reuse that quota nor pick the same victims. `leases`: pending
    workload -> the running workloads whose lease the cluster policy gives it
    (pass 6: within its own queue, it stops those it needs to fit). A lease that
    lets its workload fit within nominal quota is given right after pass 1, before
    anyone borrows: the simulator's queues count the quota of the jobs the policy's
    wish drops as free, so the wished job is admitted within nominal quota and the
    cohort's idle quota stays for the borrowers; pass 6 gives the rest (borrowing).
    """
    decisions: dict[str, Admission] = {}
    if not book.queues:
        off = "no Queue exists: quotas are off"
        return {
            p.key: Admission(p.key, Verdict.ADMIT, demand=p.alternatives[0], message=off)
            for p in pending
        }
    resolved: Resolved = []
    for p in pending:
        found = _resolve(book, p)
        if isinstance(found, Admission):
            decisions[p.key] = found
        else:
            resolved.append((p, found))
    if leases:
        # the policy's lease first within nominal quota, before anyone borrows: the
        # simulator's queues count the quota of the jobs the wish drops as free
        _within_nominal(book, resolved, decisions, now)
        _preempt(book, resolved, decisions, now, StopCause.LEASE, leases=leases, nominal=True)
    _admit_passes(book, resolved, decisions, now)
    for cause in (StopCause.WITHIN_QUEUE, StopCause.FAIR_SHARE, StopCause.LEASE):
        if _preempt(book, resolved, decisions, now, cause, leases=leases or {}):
            # its victims may free more than it needed: the passes admit what now fits
            _admit_passes(book, resolved, decisions, now)
    heads: dict[str, str] = {}
    for p, queue in resolved:
        if p.key in decisions:
            continue
        head = heads.setdefault(queue.name, p.key) if queue.strict else p.key
        if head == p.key:
            decisions[p.key] = _wait(book, queue, p)
            continue
        text = (
            f"queue {queue.name} admits in order (queueingStrategy StrictFIFO): {head} "
            "ahead of it does not fit yet"
        )
        decisions[p.key] = Admission(
            p.key, Verdict.WAIT, queue.name, reason=WaitReason.QUOTA_EXCEEDED, message=text
        )
    return decisions


def policy_first(
    book: QuotaBook,
    pending: Sequence[PendingWorkload],
    wished: Mapping[str, int],
    *,
    fixed: Collection[str] = (),
) -> list[PendingWorkload]:
    """`pending` with the workloads the cluster policy would run now first, in its order.

    One rule for the scheduling pass's admission cycle and the training simulator's
    queues (`sim.training.queues.QuotaPolicy`): the places `pending` (in queue order)
    gives its workloads are dealt out again, within each priority, to the `wished` ones
    first (key -> place in the policy's order: deadlines at risk, then shortest
    remaining work), then to the others in their order. So quota that frees up goes
    where the policy would put it, not to the oldest workload of the queue. A workload
    of a `StrictFIFO` queue (whose users ask for age order, so that no job is starved by
    smaller ones) and those in `fixed` keep their places.
    """

    def keeps(p: PendingWorkload) -> bool:
        if p.key in fixed:
            return True
        found = _resolve(book, p)
        return not isinstance(found, Admission) and found.strict

    slots = [i for i, p in enumerate(pending) if not keeps(p)]
    dealt = sorted(
        slots,
        key=lambda i: (
            -pending[i].priority,
            pending[i].key not in wished,
            wished.get(pending[i].key, 0),
            i,
        ),
    )
    out = list(pending)
    for slot, i in zip(slots, dealt, strict=True):
        out[slot] = pending[i]
    return out


def _within_nominal(
    book: QuotaBook, resolved: Resolved, decisions: dict[str, Admission], now: float
) -> None:
    """Pass 1: admit, in order, what fits its queue's nominal quota with nothing to reclaim."""
    for p, queue in _eligible(resolved, decisions):
        demand, fit = _best(book, queue, p, decisions.keys())
        if fit.verdict is Verdict.ADMIT:
            _apply(book, p.key, queue, demand, now)
            decisions[p.key] = Admission(p.key, Verdict.ADMIT, queue.name, demand)


def _borrow_by_fair_share(
    book: QuotaBook, resolved: Resolved, decisions: dict[str, Admission], now: float
) -> None:
    """Pass 3: admit borrowers one at a time, the lowest weighted dominant share (after) first.

    A workload that fits within nominal quota again (under `whenCanBorrow: Borrow` it
    came here to borrow its first alternative, and others have borrowed that since)
    is admitted on it first, as pass 1 would.
    """
    while True:
        offers = []
        for order, (p, queue) in enumerate(_eligible(resolved, decisions)):
            demand, fit = _best(book, queue, p, decisions.keys())
            if fit.verdict is Verdict.ADMIT:
                _apply(book, p.key, queue, demand, now)
                decisions[p.key] = Admission(p.key, Verdict.ADMIT, queue.name, demand)
                break
            if fit.verdict is Verdict.BORROW:
                share = book.dominant_share(queue, demand.pools())
                offers.append((share, order, p, queue, demand, fit))
        else:
            if not offers:
                return
            _, _, p, queue, demand, fit = min(offers, key=lambda o: (o[0], o[1]))
            _apply(book, p.key, queue, demand, now)
            decisions[p.key] = Admission(p.key, Verdict.BORROW, queue.name, demand, fit.borrowed)


def _eligible(resolved: Resolved, decisions: Mapping[str, Admission]) -> Iterator[_Queued]:
    """The undecided workloads a pass may admit, in order.

    All of them, except that a `StrictFIFO` queue offers only its first undecided
    workload: once a yielded workload is still undecided when the pass resumes
    (it did not fit), the rest of its queue is skipped. A head the pass admits
    lets the next workload of its queue through in the same walk.
    """
    held: set[str] = set()
    for p, queue in resolved:
        if p.key in decisions or queue.name in held:
            continue
        yield p, queue
        if queue.strict and p.key not in decisions:
            held.add(queue.name)


def _admit_passes(
    book: QuotaBook, resolved: Resolved, decisions: dict[str, Admission], now: float
) -> None:
    """Passes 1-3: within nominal quota, reclaim, borrow by fair share.

    Passes 1 and 2 repeat while a reclaim stops anything: a victim may free more
    than its reclaimer needed, or leave its own queue below its nominal quota, so
    what now fits a nominal quota (waiting since pass 1, or until now over its
    queue's quota) is admitted or reclaims before anyone borrows.

    With a `StrictFIFO` queue, all three repeat while pass 3 admits anything: a
    head admitted by borrowing lets its queue's next workload in, which passes 1
    and 2 have not seen yet (it may fit its nominal quota, or reclaim for it).
    """
    strict = any(queue.strict for _, queue in resolved)
    while True:
        _within_nominal(book, resolved, decisions, now)
        while _reclaim(book, resolved, decisions, now):
            _within_nominal(book, resolved, decisions, now)
        decided = len(decisions)
        _borrow_by_fair_share(book, resolved, decisions, now)
        if not strict or len(decisions) == decided:
            return


def _preempt(
    book: QuotaBook,
    resolved: Resolved,
    decisions: dict[str, Admission],
    now: float,
    cause: StopCause,
    *,
    leases: Mapping[str, Collection[str]],
    nominal: bool = False,
) -> bool:
    """Pass 4, 5 or 6: stop others' work so a workload that still waits fits now.

    Pass 4 (`cause` WITHIN_QUEUE), under `withinQueue: LowerPriority`: the queue's
    own lower-priority work (`within_queue_victims`). Pass 5 (FAIR_SHARE), under
    `fairShare: Preempt`: borrowers above their fair share (`fair_share_victims`).
    Pass 4 leaves out a workload that does not preempt within its queue
    (`PendingWorkload.preempts_within_queue`). Pass 6 (LEASE): the queue's own work
    whose lease the cluster policy gives the workload (`leases`), as the policy
    gives leases up without queues; what it does not need keeps running (`nominal`:
    only leases that let it fit within nominal quota, `admit`'s first step).
    True if it stopped anything.
    """
    preempted = False
    for p, queue in _eligible(resolved, decisions):
        if cause is StopCause.WITHIN_QUEUE:
            on = queue.within_queue is WithinQueuePolicy.LOWER_PRIORITY and p.preempts_within_queue
        elif cause is StopCause.LEASE:
            on = bool(leases.get(p.key))
        else:
            on = queue.fair_share
        if not on:
            continue
        for demand in p.alternatives:
            if cause is StopCause.WITHIN_QUEUE:
                victims = within_queue_victims(book, queue, p.priority, demand, decisions.keys())
                text = (
                    f"queue {queue.name}: {demand.label} quota is held by its own "
                    f"lower-priority work; priority {p.priority} preempts it"
                )
            elif cause is StopCause.LEASE:
                victims = within_queue_victims(
                    book,
                    queue,
                    p.priority,
                    demand,
                    decisions.keys(),
                    only=leases[p.key],
                    nominal=nominal,
                )
                text = (
                    f"queue {queue.name}: {demand.label} quota is held by its own work; the "
                    "cluster policy runs this job in its place"
                )
            else:
                victims = fair_share_victims(book, queue, demand, spare=decisions.keys())
                text = (
                    f"queue {queue.name} borrows {demand.label} for its fair share of cohort "
                    f"{queue.cohort}"
                )
            if not victims:
                continue
            for key in victims:
                book.remove(key)
            fit = _fit(book, queue, demand)
            _apply(book, p.key, queue, demand, now)
            decisions[p.key] = Admission(
                p.key,
                Verdict.RECLAIM,
                queue.name,
                demand,
                fit.borrowed,
                victims=victims,
                cause=cause,
                grace_seconds=queue.grace_seconds,
                message=text,
            )
            preempted = True
            break
    return preempted


def fair_share_victims(
    book: QuotaBook, queue: QueueQuota, demand: Demand, spare: Collection[str] = ()
) -> tuple[str, ...] | None:
    """Borrowed work to stop so that `queue` may borrow `demand`; None if not fair or too little.

    Only for a demand above the queue's nominal quota (within it, reclaiming is
    pass 2's) that its borrowing limit allows, in a cohort that lends too little
    now. Candidates are the workloads (never serving ones) of the cohort's other
    queues that hold a pool the demand lacks while their queue borrows: the queue
    with the highest weighted dominant share (`QuotaBook.dominant_share`) first,
    re-ranked after each victim, its lowest-priority and newest workload first.
    Kueue's two fair-sharing strategies, in its default order: a candidate is
    stopped only if the queue's share with `demand` is at most its queue's share
    without it (LessThanOrEqualToFinalShare); when that frees too little, the
    rest are tried again, stopped if the queue's share with `demand` is below
    theirs before the stop (LessThanInitialShare). A queue whose candidate fails
    is passed over. Either way the stopped queue, asking for the same work back,
    would have a share above the borrower's, so it cannot stop the borrower in
    turn. Victims the others cover are spared, and so are the workloads of `spare`
    (those admitted in this cycle). `book` is left as it was.
    """
    need = _lacking_to_borrow(book, queue, demand)
    if not need:
        return None
    mine = book.dominant_share(queue, demand.pools())  # others' use does not move it
    others = [q for q in book.members(queue) if q.name != queue.name]

    def fits() -> bool:
        return _fit(book, queue, demand).verdict in (Verdict.ADMIT, Verdict.BORROW)

    order = list(book.workloads)
    chosen: list[AdmittedWorkload] = []
    try:
        for initial in (False, True):
            passed: set[str] = set()
            while not fits():
                ranked = sorted(
                    (q for q in others if q.name not in passed and book.dominant_share(q) > 0),
                    key=lambda q: (-book.dominant_share(q), q.name),
                )
                if not ranked:
                    break
                top = ranked[0]
                mine_there = _stoppable(book, top, need, spare)
                if not mine_there:
                    passed.add(top.name)
                    continue
                victim = _first_victim(mine_there)
                before = book.dominant_share(top)
                book.remove(victim.key)
                fair = mine < before if initial else mine <= book.dominant_share(top)
                if fair:
                    chosen.append(victim)
                else:
                    book.add(victim)
                    passed.add(top.name)
            if fits():
                return _spared(book, chosen, fits)
        return None
    finally:
        _put_back(book, chosen, order)


def _lacking_to_borrow(book: QuotaBook, queue: QueueQuota, demand: Demand) -> list[Resource]:
    """The pools the cohort lends too little of for `demand`, a borrow its limits allow.

    Empty when the demand is within the queue's nominal quota, its queue has no
    cohort or no quota for one of its types, a borrowing limit holds it back
    (stopping others frees nothing for it), or it fits as it is.
    """
    pools = demand.pools()
    if queue.cohort is None or any(t not in queue.types for t in demand.gpu_types):
        return []
    over = {p: book.used(queue.name, p) + n - queue.nominal.get(p, 0) for p, n in pools.items()}
    if all(n <= 0 for n in over.values()):
        return []
    for p, n in over.items():
        limit = queue.borrowing_limit.get(p)
        if limit is not None and n > limit:
            return []
    return [p for p, n in pools.items() if book.cohort_free(queue, p) < n]


def _reclaim(
    book: QuotaBook, resolved: Resolved, decisions: dict[str, Admission], now: float
) -> bool:
    """Pass 2: reclaim lent quota for what fits its nominal quota, before anyone borrows.

    True if it stopped any workload.
    """
    stopped_any = False
    for p, queue in _eligible(resolved, decisions):
        demand, fit = _best(book, queue, p, decisions.keys())
        if fit.verdict not in (Verdict.RECLAIM, Verdict.ADMIT):
            continue
        victims = (
            reclaim_victims(book, queue, demand, decisions.keys())
            if fit.verdict is Verdict.RECLAIM
            else ()
        )
        if victims is None:
            continue
        for key in victims:  # a victim may free more than needed: later ones may fit now
            book.remove(key)
        stopped_any = stopped_any or bool(victims)
        _apply(book, p.key, queue, demand, now)
        text = f"queue {queue.name} reclaims {demand.label} lent in cohort {queue.cohort}"
        decisions[p.key] = Admission(
            p.key,
            fit.verdict,
            queue.name,
            demand,
            fit.borrowed,
            victims=victims,
            grace_seconds=queue.grace_seconds if victims else None,
            message=text if victims else "",
        )
    return stopped_any


def _wait(book: QuotaBook, queue: QueueQuota, pending: PendingWorkload) -> Admission:
    fits = [_fit(book, queue, demand) for demand in pending.alternatives]
    texts = [
        f.blocked or f"queue {queue.name}: too few borrowed workloads to reclaim" for f in fits
    ]
    reasons = {f.reason for f in fits}
    reason = reasons.pop() if len(reasons) == 1 else WaitReason.QUOTA_EXCEEDED
    message = "; ".join(dict.fromkeys(texts))
    return Admission(pending.key, Verdict.WAIT, queue.name, reason=reason, message=message)


def _lent(book: QuotaBook, cohort: list[QueueQuota], pool: Resource) -> dict[str, int]:
    """The cohort's borrowed amount split over its lenders, in proportion to their idle quota.

    A lender never lends more than its lendable quota minus what it uses of it
    (`QueueQuota.lendable`); the split rounds by largest remainder (ties by name),
    so the parts add up.
    """
    idle = {
        q.name: max(0, q.lendable(pool) - q.over_guaranteed(pool, book.used(q.name, pool)))
        for q in cohort
    }
    borrowed = sum(book.borrowed(q, pool) for q in cohort)
    total_idle = sum(idle.values())
    out = min(borrowed, total_idle)
    if out == 0:
        return {}
    exact = {name: out * n / total_idle for name, n in idle.items()}
    lent = {name: int(x) for name, x in exact.items()}
    rest = out - sum(lent.values())
    for name in sorted(exact, key=lambda n: (-(exact[n] - lent[n]), n))[:rest]:
        lent[name] += 1
    return lent


def queue_statuses(
    book: QuotaBook, decisions: Mapping[str, Admission] | None = None
) -> dict[str, QueueStatus]:
    """Every Queue's status numbers: per GPU type used, borrowed, lent; workload counts.

    `decisions` (from `admit` on the same book) gives the pending counts; a
    workload admitted by RECLAIM still waits for its victims, so it counts as
    pending, not admitted.
    """
    decisions = decisions or {}
    waiting = {k for k, d in decisions.items() if d.verdict in (Verdict.RECLAIM, Verdict.WAIT)}
    lent: dict[tuple[str, Resource], int] = {}
    seen: set[str | None] = set()
    for queue in book.queues.values():
        if queue.cohort in seen and queue.cohort is not None:
            continue
        seen.add(queue.cohort)
        cohort = book.members(queue)
        for pool in {p for q in cohort for p in q.nominal}:
            for name, n in _lent(book, cohort, pool).items():
                lent[(name, pool)] = n
    statuses = {}
    for queue in book.queues.values():
        rows = []
        for gpu_type in queue.gpu_types():
            gpus, milli = (gpu_type, Unit.GPUS), (gpu_type, Unit.SHARE_MILLI)
            rows.append(
                GpuTypeUsage(
                    gpu_type=gpu_type,
                    used=book.used(queue.name, gpus),
                    borrowed=book.borrowed(queue, gpus),
                    lent=lent.get((queue.name, gpus), 0),
                    used_share_milli=book.used(queue.name, milli),
                    borrowed_share_milli=book.borrowed(queue, milli),
                    lent_share_milli=lent.get((queue.name, milli), 0),
                )
            )
        admitted = sum(
            1 for w in book.workloads.values() if w.queue == queue.name and w.key not in waiting
        )
        pending = sum(1 for k in waiting if decisions[k].queue == queue.name)
        statuses[queue.name] = QueueStatus(
            gpus=rows, admitted_workloads=admitted, pending_workloads=pending
        )
    return statuses
