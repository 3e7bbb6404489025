"""The TrainingJob control loop: reconcile a job when something it depends on changes.

No busy timers (issue 18, part 7). A job is reconciled when:

- the job itself changes (created, its spec or annotations, deleted), or one
  of its worker pods changes;
- its verdict in a new scheduling pass differs from the previous pass's (a
  waiting job). The run loop makes a new pass (`schedule`,
  `workloads.training_pass`: every waiting job at once) once something the
  latest pass did not predict has changed: a pod is bound, ends or goes away,
  a node changes, a Queue or LocalQueue changes, another job is created,
  deleted or edited (a job's own write of its verdict changes nothing);
- a node changes (every live job: lost workers, cordons);
- its own reconcile asks to look again later (`requeue_after`: a gang that
  is starting is checked for being stuck, a gang being stopped for its
  restart), or the reconcile failed (retried after `RETRY_S`);
- the slow resync (`resync_s`: a new pass, then every job once), which covers
  anything time-driven that no event announces; and a new pass every
  `recheck_s` while a job waits for its model profile ConfigMap (not watched).

Keys go through `WorkQueue` (client-go's workqueue: a key is queued at most
once, never reconciled by two workers at once, and a key added while it is
being reconciled is reconciled again after; unlike it, a pass's starts and a
started gang's pod events go ahead of the waiting jobs' status writes); a key
reconciled less than `min_gap_s` ago waits out the gap, so a burst of pod events costs each job
one reconcile, not one per event. Passes are spaced by at least their own
duration, so the workers enacting one get at least as long as the pass
took (a new pass waits for the starts being enacted), and a new pass is not
made while starts of the latest remain to be enacted (up to `hold_s`): like a
scheduling cycle of KAI's, a pass commits its decisions before the next
snapshot, so the starts are not enacted a few between passes. While
TrainingJobs keep being created (one less than `min_gap_s` ago), the next pass
waits for the burst to end, up to `BURST_S` (`settle_left`; Volcano likewise
decides in 1 s sessions): a burst of submissions is decided by one pass that
sees all of it, as the simulator decides jobs that arrive together, not by a
first pass that starts the jobs seen so far and a second that gives their
leases to the shorter ones that came after. Decisions stay in
`controllers.trainingjob.reconcile` and the pass; this module only decides
*when*.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from chronotope.controllers.metrics import OperatorMetrics
from chronotope.controllers.trainingjob import (
    STUCK_AFTER_S,
    ClusterOps,
    Outcome,
    PassCache,
    merged_status,
    reconcile,
)
from chronotope.sharing.labels import PLANNED_FOR_ANNOTATION
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.node_fit import claim_class
from chronotope.workloads.training import Action
from chronotope.workloads.training_status import QUOTA_RESERVED, condition

__all__ = [
    "BURST_S",
    "NODE_MARK_FIELDS",
    "RETRY_S",
    "JobLoopOps",
    "TrainingJobLoop",
    "Wake",
    "WorkQueue",
    "invalid_outcome",
    "mark_of",
    "plain",
    "requeue_after",
    "settle_left",
    "wake_for",
]

log = logging.getLogger(__name__)

RETRY_S = 5.0
"""A reconcile that raised is tried again after this long."""

BURST_S = 3.0
"""The longest a pass waits for a burst of TrainingJob creations to end (`settle_left`)."""

_OPEN = (None, "", "Waiting", "Pending", "Resizing")
"""Phases of a job that has not started: capacity changes concern it."""
_DONE = ("Succeeded", "Failed")


class JobLoopOps(ClusterOps, Protocol):
    """`ClusterOps` plus what the loop reads and writes for one job."""

    def training_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job as the cache has it, or None once deleted."""
        ...

    def write(
        self,
        job: Mapping[str, Any],
        status: Mapping[str, Any],
        annotations: Mapping[str, str],
        events: Sequence[tuple[str, str, str]],
    ) -> None:
        """Patch the job's annotations and status, then post its events."""
        ...


def _merge(a: tuple[float, bool], b: tuple[float, bool]) -> tuple[float, bool]:
    """Two queuings of one key: the earlier due time, first if either was."""
    return min(a[0], b[0]), a[1] or b[1]


class WorkQueue:
    """Keys to reconcile, each queued at most once, each due no earlier than its time.

    A key added `first` goes ahead of every due key that was not: a scheduling pass's
    starts and the pod events of started gangs are enacted before the pass's waiting
    jobs have their status written (client-go's workqueue has no classes; KAI commits
    a cycle's allocations before anything else). Within a class, earliest due first.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """An empty queue on `clock` (seconds)."""
        self._clock = clock
        self._cond = threading.Condition()
        self._heaps: dict[bool, list[tuple[float, int, str]]] = {True: [], False: []}
        self._due: dict[str, tuple[float, bool]] = {}
        self._processing: set[str] = set()
        self._again: dict[str, tuple[float, bool]] = {}
        self._seq = itertools.count()
        self._closed = False

    def add(self, key: str, delay: float = 0.0, *, first: bool = False) -> None:
        """Queue `key` to be due in `delay` seconds.

        An earlier due time already queued wins, and so does `first` once given.
        """
        due = self._clock() + delay
        with self._cond:
            if key in self._processing:
                was = self._again.get(key)
                self._again[key] = (due, first) if was is None else _merge(was, (due, first))
                return
            was = self._due.get(key)
            now = (due, first) if was is None else _merge(was, (due, first))
            if now == was:
                return
            self._due[key] = now
            heapq.heappush(self._heaps[now[1]], (now[0], next(self._seq), key))
            self._cond.notify()

    def add_all(self, keys: Iterable[str], delay: float = 0.0) -> None:
        """`add` each of `keys`."""
        for key in keys:
            self.add(key, delay)

    def get(self, timeout: float | None = None) -> str | None:
        """The next due key (now being processed), or None on timeout or close."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while not self._closed:
                heads = [self._head(first) for first in (True, False)]
                now = self._clock()
                for first, head in zip((True, False), heads, strict=True):
                    if head is not None and head <= now:
                        _, _, key = heapq.heappop(self._heaps[first])
                        del self._due[key]
                        self._processing.add(key)
                        return key
                wait = min((h - now for h in heads if h is not None), default=None)
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)
            return None

    def _head(self, first: bool) -> float | None:
        """The due time of the class's next key, dropping entries superseded since."""
        heap = self._heaps[first]
        while heap and self._due.get(heap[0][2]) != (heap[0][0], first):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def done(self, key: str, requeue_in: float | None = None) -> None:
        """`key` is processed; queue it again if it was added meanwhile or `requeue_in` is set."""
        with self._cond:
            self._processing.discard(key)
            again = self._again.pop(key, None)
        if again is not None:
            self.add(key, max(0.0, again[0] - self._clock()), first=again[1])
        if requeue_in is not None:
            self.add(key, requeue_in)

    def close(self) -> None:
        """Wake every `get` with None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        """Keys queued (not counting those being processed)."""
        with self._cond:
            return len(self._due)


@dataclass(frozen=True)
class Wake:
    """Whom one watch event wakes: named jobs, whether every open (or every) job, nodes.

    `nodes`: nodes that changed; they wake the started jobs they concern
    (`concerned_by_nodes`) and make the next scheduling pass. `freed`: a pod gave
    its node's resources back (deleted, being deleted, or done); that wakes the
    started gangs below their wanted size, which may grow onto them.
    """

    keys: tuple[str, ...] = ()
    open_jobs: bool = False
    all_jobs: bool = False
    nodes: tuple[str, ...] = ()
    freed: bool = False


_Seen = tuple[Any, ...]


NODE_MARK_FIELDS = ("labels", "unschedulable", "taints", "allocatable", "Ready")
"""What `mark_of` keeps of a node, in its tuple's order."""


_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    # when and where it provisions
    "storageclasses": (("volumeBindingMode",), ("allowedTopologies",)),
    # whether its driver reports capacity
    "csidrivers": (("spec", "storageCapacity"),),
    # where its class may provision, and how much
    "csistoragecapacities": (
        ("storageClassName",),
        ("nodeTopology",),
        ("capacity",),
        ("maximumVolumeSize",),
    ),
    # how many CSI volumes a node may attach (node_fit.volume_limits)
    "csinodes": (("spec", "drivers"),),
    # a CSI volume attached to a node, whose pod may be gone
    "volumeattachments": (("spec",), ("metadata", "deletionTimestamp")),
    # what it adds to its pods (node_fit.runtime_rules)
    "runtimeclasses": (("scheduling",), ("overhead",)),
}
"""The fields of each kind `mark_of` reads as they are (`node_fit`'s volume and runtime rules)."""


def _at(obj: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The value at `path` in `obj` (None where it is missing)."""
    out: Any = obj
    for key in path:
        out = out.get(key) if isinstance(out, Mapping) else None
    return out


def mark_of(kind: str, obj: Mapping[str, Any]) -> _Seen:
    """What of an object the loop cares about; an event that leaves it unchanged wakes nobody.

    A node's heartbeat, a pod's or a Queue's status write, a job's own status
    write without a phase change: none of these can change a decision.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if kind == "trainingjobs":
        return (
            meta.get("generation"),
            tuple(sorted((meta.get("annotations") or {}).items())),
            meta.get("deletionTimestamp"),
            status.get("phase"),
        )
    if kind == "pods":
        scheduled = next(
            (
                (c.get("status"), c.get("message"))
                for c in status.get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            None,
        )
        return (spec.get("nodeName"), status.get("phase"), meta.get("deletionTimestamp"), scheduled)
    if kind == "nodes":
        ready = next(
            (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
            None,
        )
        return (
            tuple(sorted((meta.get("labels") or {}).items())),
            spec.get("unschedulable"),
            repr(spec.get("taints")),
            tuple(sorted((status.get("allocatable") or {}).items())),
            ready,
        )
    if kind == "namespaces":  # its labels: what a namespaceSelector reads (Queues, pod affinity)
        return (tuple(sorted((meta.get("labels") or {}).items())), meta.get("deletionTimestamp"))
    if kind == "persistentvolumeclaims":  # its volume or class (node_fit.volume_rules)
        return (spec.get("volumeName"), claim_class(obj), meta.get("deletionTimestamp"))
    if kind == "persistentvolumes":  # where it may be used, and which claim it may take
        ref = spec.get("claimRef") or {}
        return (
            repr(spec.get("nodeAffinity")),
            tuple(sorted((meta.get("labels") or {}).items())),
            (ref.get("namespace"), ref.get("name")),
            repr((spec.get("storageClassName"), spec.get("capacity"), spec.get("accessModes"))),
            (spec.get("volumeMode"), meta.get("deletionTimestamp")),
        )
    fields = _FIELDS.get(kind)
    if fields is not None:
        return tuple(repr(_at(obj, path)) for path in fields)
    return (meta.get("generation"), meta.get("deletionTimestamp"))


def wake_for(kind: str, event: str, obj: Mapping[str, Any], seen: _Seen | None) -> Wake:
    """Whom an event of resource `kind` wakes; `seen` is the object's `mark_of` last time.

    A job's own status write (no phase change) wakes nobody, nor does a node
    heartbeat: that is what keeps the loop quiet once every job's status is
    current.
    """
    if event == "SYNC":  # a relist: anything may have changed
        return Wake(all_jobs=True)
    mark = mark_of(kind, obj)
    if event == "MODIFIED" and seen == mark:
        return Wake()
    meta = obj.get("metadata") or {}
    if kind == "trainingjobs":
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if event in ("ADDED", "DELETED") or seen is None or mark[:3] != seen[:3]:
            return Wake((key,), open_jobs=True)
        return Wake(open_jobs=mark[3] != seen[3])
    if kind == "pods":
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        keys = (f"{meta.get('namespace')}/{job}",) if job else ()
        node, phase, deleting = mark[0], mark[1], mark[2]
        if event == "DELETED":
            return Wake(keys, open_jobs=bool(node), freed=bool(node))
        before = seen or (None, None, None, None)
        done, was_done = phase in _DONE, before[1] in _DONE
        holds_changed = node != before[0] or done != was_done or bool(deleting) != bool(before[2])
        freed = bool(node) and ((done and not was_done) or (bool(deleting) and not before[2]))
        return Wake(keys, open_jobs=bool(node) and holds_changed, freed=freed)
    if kind == "nodes":
        return Wake(nodes=(str(meta.get("name")),))
    if kind in ("queues", "localqueues", "namespaces", "runtimeclasses", *VOLUME_KINDS):
        return Wake(open_jobs=True)
    return Wake()


def concerned_by_nodes(
    changed: Iterable[str],
    jobs: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> set[str]:
    """The started jobs (Starting, Running) that a change of the `changed` nodes concerns.

    A running gang's reconcile reads the nodes for three things only: a worker
    whose node is gone, a worker on a cordoned node, and a gang below its wanted
    size that may grow or move onto GPUs that freed up (`trainingjob._running`).
    So a node change concerns the jobs with a worker on one of the nodes, and
    every started gang below its size; the others' reconciles would change
    nothing. Waiting jobs are woken by the scheduling pass the change makes.
    With no nodes named: the started gangs below their size (a pod freed GPUs).
    """
    names = set(changed)
    keys = {
        f"{(p.get('metadata') or {}).get('namespace')}/{job}"
        for p in pods
        if ((p.get("spec") or {}).get("nodeName") or "") in names
        and (job := ((p.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL))
    }
    started: set[str] = set()
    for job in jobs:
        meta = job.get("metadata") or {}
        status = job.get("status") or {}
        if status.get("phase") in _DONE or status.get("phase") in _OPEN:
            continue
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        started.add(key)
        workers = int((status.get("plan") or {}).get("workers") or 0)
        if workers < int((job.get("spec") or {}).get("replicas") or 1):
            keys.add(key)
    return keys & started


def requeue_after(status: Mapping[str, Any]) -> float | None:
    """When a job in `status` must be looked at again though nothing changes, or None."""
    phase = status.get("phase")
    if phase == "Starting":
        return STUCK_AFTER_S + 1.0  # a gang that never gets placed is re-planned
    if phase == "Resizing":
        return 2.0  # the stopped gang's restart
    return None


def invalid_outcome(job: Mapping[str, Any], exc: ValueError, now: datetime) -> Outcome:
    """A job whose spec the models reject: Pending with an InvalidSpec condition, one event.

    The gates skip specs that do not validate, so the job holds no queue back; a
    corrected spec is decided normally.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    message = "invalid spec: " + "; ".join(lines[:3])[:900]
    old = job.get("status") or {}
    generation = (job.get("metadata") or {}).get("generation")
    out = Outcome(
        status={
            "phase": "Pending",
            "whyWaiting": message,
            "conditions": [
                condition(kind, False, "InvalidSpec", message, now=now, generation=generation)
                # the quota accounting counts a job whose spec does not validate nowhere
                for kind in ("Schedulable", QUOTA_RESERVED)
            ],
        }
    )
    if old.get("whyWaiting") != message:
        out.events.append(("Warning", "InvalidSpec", message))
    return out


VOLUME_KINDS = (
    "persistentvolumeclaims",
    "persistentvolumes",
    "storageclasses",
    "csidrivers",
    "csistoragecapacities",
    "csinodes",
    "volumeattachments",
)
"""Where a job's volumes may be used (`node_fit.volume_rules`): a change wakes waiting jobs
(not seeded: the first event of each after a start makes a pass; they change seldom)."""
SEEDED = ("trainingjobs", "pods", "nodes", "queues", "localqueues", "namespaces")
"""The kinds whose objects the loop marks (`mark_of`) from the cache, not only from events."""


def _ident(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{kind}:{meta.get('namespace') or ''}/{meta.get('name')}"


def settle_left(now: float, woke: float, arrived: float, gap: float, burst: float) -> float:
    """Seconds the run loop still waits before a pass, having been poked at `woke`.

    At least `gap` after the poke (a burst of events settles into one wake), and
    while TrainingJobs keep arriving (the latest at `arrived`) until one `gap`
    after the latest, but never past `burst` after the poke.
    """
    return max(0.0, min(max(woke, arrived) + gap, woke + burst) - now)


class TrainingJobLoop:
    """Workers that reconcile TrainingJobs as `WorkQueue` hands out their keys."""

    def __init__(
        self,
        ops: JobLoopOps,
        jobs: Callable[[], list[dict[str, Any]]],
        metrics: OperatorMetrics,
        *,
        resync_s: float = 300.0,
        recheck_s: float = 10.0,
        min_gap_s: float = 0.5,
        workers: int = 16,
        hold_s: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Reconcile through `ops`; `jobs` lists every job (for waking all or the open ones)."""
        self.ops = ops
        self.jobs = jobs
        self.metrics = metrics
        self.resync_s = resync_s
        self.recheck_s = recheck_s
        """How often a pass is made again while a job waits for its model profile ConfigMap."""
        self.min_gap_s = min_gap_s
        self.workers = workers
        self.hold_s = hold_s
        """The longest the next pass waits for the latest pass's starts to be enacted."""
        self.clock = clock
        self.queue = WorkQueue(clock)
        self._seen: dict[str, _Seen] = {}
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._poke = threading.Event()
        self._scope_all = False
        self._nodes_changed: set[str] = set()
        self._freed = False
        self._arrived = -math.inf
        """When the latest TrainingJob was created (`time.monotonic`: waits are in real time)."""
        self.passes = PassCache(clock=clock, on_pass=metrics.observe_pass)

    # -- waking -------------------------------------------------------------------------

    def seed(self, kinds: Iterable[str] = SEEDED) -> None:
        """Record what the loop cares about of every object of `kinds` the cache holds now.

        So the first watch event of an object after the loop starts, or after a
        relist, is compared with what it was; without a mark every such event
        (a node's first status re-report, say) would look like a change and make
        a pass. A relist itself wakes everyone (`wake_for`), so nothing is missed.
        """
        sources: dict[str, Callable[[], Iterable[Mapping[str, Any]]]] = {
            "trainingjobs": self.jobs,
            "pods": self.ops.pods,
            "nodes": self.ops.nodes,
            "queues": self.ops.queues,
            "localqueues": self.ops.local_queues,
            "namespaces": self.ops.namespaces,
        }
        for kind in kinds:
            marks = {_ident(kind, obj): mark_of(kind, obj) for obj in sources[kind]()}
            with self._lock:
                for ident in [i for i in self._seen if i.startswith(f"{kind}:")]:
                    if ident not in marks:
                        del self._seen[ident]
                self._seen.update(marks)

    def on_change(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """A cache listener: queue the jobs this event concerns."""
        meta = obj.get("metadata") or {}
        ident = _ident(kind, obj)
        if event == "SYNC" and kind in SEEDED:
            self.seed((kind,))  # the store holds the relisted objects now
        with self._lock:
            seen = self._seen.get(ident)
            if event == "DELETED":
                self._seen.pop(ident, None)
            elif event != "SYNC":
                self._seen[ident] = mark_of(kind, obj)
        if kind == "trainingjobs" and event == "ADDED":
            with self._lock:
                self._arrived = time.monotonic()
        if kind == "trainingjobs" and event == "DELETED":
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            with self._lock:
                self._last.pop(key, None)
            self.metrics.forget_job(key)
        wake = wake_for(kind, event, obj, seen)
        if wake.open_jobs and self._predicted(kind, event, obj, seen):
            wake = replace(wake, open_jobs=False)
        for key in wake.keys:  # a started gang's pod goes first: it may come up or be lost
            self._add(key, first=kind == "pods")
        if wake.all_jobs or wake.open_jobs or wake.nodes or wake.freed:
            # coalesced: the run loop wakes them in a moment and makes the next pass
            self.passes.invalidate()
            self.metrics.pass_invalidations.labels(kind, event).inc()
            with self._lock:
                self._scope_all = self._scope_all or wake.all_jobs
                self._nodes_changed.update(wake.nodes)
                self._freed = self._freed or wake.freed
            self._poke.set()

    def _predicted(self, kind: str, event: str, obj: Mapping[str, Any], seen: _Seen | None) -> bool:
        """The event is one the current pass already counted: its verdicts still hold.

        A waiting job's status moving to the phase of its verdict, a started
        job's status (and, under an older CRD, its planned-for annotation), or a started job
        going from Starting to Running. A worker's bind is not, even on the GPUs
        the pass planned for it: other decisions wait for the pass it triggers
        (an elastic gang started below its size grows once a pass shows the GPUs
        the old gang left; docs/trainingjob.md, "Scale").
        """
        if kind != "trainingjobs" or event != "MODIFIED" or seen is None:
            return False
        meta = obj.get("metadata") or {}
        mark = mark_of(kind, obj)
        if (mark[0], mark[2]) != (seen[0], seen[2]):
            return False
        changed = dict(set(mark[1]) ^ set(seen[1]))
        if (seen[3], mark[3]) == ("Starting", "Running") and not changed:
            return True  # its gang came up where it was counted since it started
        expected = self.passes.phase_of(f"{meta.get('namespace')}/{meta.get('name')}")
        if expected is None:
            return False
        if expected == "Starting":
            return set(changed) <= {PLANNED_FOR_ANNOTATION} and mark[3] in (seen[3], expected)
        return not changed and mark[3] == expected

    def _wake_scope(self) -> None:
        """Wake the started jobs that a relist, node changes or freed GPUs concern.

        A relist wakes all of them, node changes those `concerned_by_nodes`, and a
        pod freeing GPUs the gangs below their size (which may grow onto them).
        Waiting jobs are woken by `schedule` instead, when their verdict changes.
        """
        with self._lock:
            everyone, self._scope_all = self._scope_all, False
            changed, self._nodes_changed = self._nodes_changed, set()
            freed, self._freed = self._freed, False
            self._poke.clear()
        if everyone:
            for job in self.jobs():
                phase = (job.get("status") or {}).get("phase")
                if phase not in _DONE and phase not in _OPEN:
                    meta = job.get("metadata") or {}
                    self._add(f"{meta.get('namespace')}/{meta.get('name')}")
        elif changed or freed:
            for key in sorted(concerned_by_nodes(changed, self.jobs(), self.ops.pods())):
                self._add(key)

    def schedule(self) -> None:
        """Make the next scheduling pass if the latest is stale; wake jobs whose verdict changed.

        A job new in the pass, or whose action or reason differs from the
        previous pass, is reconciled to enact it; the others already show theirs.
        So is a running job whose lease the pass newly gives up (`SchedulingPass.stops`).
        """
        with self.ops.decide_lock:
            before = self.passes.latest
            made = self.passes.refresh(self.ops, datetime.now(UTC))
        if made is None:
            return
        old = before.verdicts if before is not None else {}

        def starts(key: str) -> bool:
            verdict = made.verdicts.get(key)
            return verdict is not None and verdict.decision.action is Action.START

        # the starts are enacted first: the next pass waits for them (`_hold`), and a
        # waiting job's status can be written after
        for key in self.passes.deferred():  # jobs that deferred while the pass was made
            self._add(key, first=starts(key))
        for key, verdict in made.verdicts.items():
            was = old.get(key)
            if was is None or (was.decision.action, was.decision.reason) != (
                verdict.decision.action,
                verdict.decision.reason,
            ):
                self._add(key, first=starts(key))
        stopped = before.stops if before is not None else {}
        for key, why in made.stops.items():  # running jobs whose lease the policy gives up
            if stopped.get(key) != why:
                self._add(key, first=True)

    def _add(self, key: str, delay: float = 0.0, *, first: bool = False) -> None:
        with self._lock:
            last = self._last.get(key)
        if last is not None:
            delay = max(delay, last + self.min_gap_s - self.clock())
        self.queue.add(key, delay, first=first)

    # -- running ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Reconcile until `stop` is set: every job once now, then on events and resyncs."""
        self.seed()
        threads = [
            threading.Thread(target=self._work, args=(stop,), name=f"trainingjob-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in threads:
            thread.start()
        next_resync = self.clock()
        try:
            while not stop.is_set():
                if self.clock() >= next_resync:
                    self._resync()
                    next_resync = self.clock() + self.resync_s
                if self.passes.due(self.recheck_s):  # a job waits for its profile ConfigMap
                    self.passes.invalidate()
                    self.schedule()
                if self._poke.wait(timeout=max(0.0, min(next_resync - self.clock(), 1.0))):
                    self._settle(stop)
                    self._wake_scope()
                    self.schedule()
                    # leave the workers enacting it at least as long before the next,
                    # and until they have enacted its starts
                    stop.wait(self.passes.last_seconds)
                    self._hold(stop)
        finally:
            self.queue.close()
            for thread in threads:
                thread.join(timeout=30)

    def _settle(self, stop: threading.Event) -> None:
        """Wait for a burst of events, and of TrainingJob creations, to end (`settle_left`)."""
        woke = time.monotonic()
        while not stop.is_set():
            with self._lock:
                arrived = self._arrived
            left = settle_left(time.monotonic(), woke, arrived, self.min_gap_s, BURST_S)
            if left <= 0:
                return
            stop.wait(left)

    def _hold(self, stop: threading.Event) -> None:
        """Wait until every start of the latest pass is enacted, or `hold_s` at most."""
        until = self.clock() + self.hold_s
        while self.passes.starts_left() and self.clock() < until and not stop.is_set():
            stop.wait(0.1)

    def _resync(self) -> None:
        self.passes.invalidate()
        self.schedule()
        for job in self.jobs():
            meta = job.get("metadata") or {}
            self.queue.add(f"{meta.get('namespace')}/{meta.get('name')}")

    def _work(self, stop: threading.Event) -> None:
        while not stop.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            again: float | None = None
            try:
                again = self.reconcile_key(key)
            except Exception:
                log.exception("reconciling TrainingJob %s failed; retrying in %.0fs", key, RETRY_S)
                again = RETRY_S
                self.passes.settled(key)  # its retry need not hold the next pass back
            finally:
                with self._lock:
                    self._last[key] = self.clock()
                self.queue.done(key, again)

    def reconcile_key(self, key: str) -> float | None:
        """Reconcile one job now and write what changed; returns when to look again (or None)."""
        namespace, name = key.split("/", 1)
        job = self.ops.training_job(namespace, name)
        if job is None or (job.get("metadata") or {}).get("deletionTimestamp"):
            self.passes.settled(key)
            return None
        job = plain(job)
        now = datetime.now(UTC)
        started = time.perf_counter()
        try:
            outcome = reconcile(job, self.ops, now, self.passes)
            result = "ok"
        except ValueError as exc:  # a spec the models reject: this job only, never the queue
            outcome = invalid_outcome(job, exc, now)
            result = "error"
        if outcome.deferred:  # decided nothing: not a reconcile the histogram times
            # `schedule` wakes it once the pass is made; this is the fallback when a
            # reconcile (`PassCache.ensure`), not the loop, made that pass
            return max(self.passes.last_seconds, 0.5)
        self.metrics.reconcile_seconds.labels(result).observe(time.perf_counter() - started)
        self.metrics.observe_job(job, outcome.status)
        old: Mapping[str, Any] = job.get("status") or {}
        new = merged_status(old, outcome.status)
        changed = {k: v for k, v in new.items() if old.get(k) != v}
        if changed or outcome.annotations or outcome.events:
            self.ops.write(job, changed, outcome.annotations, outcome.events)
        if outcome.preempted is not None:
            self.metrics.preemptions.labels(*outcome.preempted).inc()
        if outcome.admitted is not None:
            queue, waited = outcome.admitted
            self.metrics.admission_wait.labels(queue).observe(waited)
        for _kind, reason, message in outcome.events:
            self.metrics.events.labels(reason).inc()
            log.info("%s %s: %s", key, reason, message)
        self.passes.settled(key)  # enacted and written: the next pass sees it
        return requeue_after({**old, **new})


def plain(value: Any) -> Any:
    """A deep copy in plain dicts and lists, for the pure layer.

    The cache's objects are shared and read-only, and a kopf body is a read-only view.
    """
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
