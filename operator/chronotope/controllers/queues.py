"""Queue and LocalQueue status; the drain of stopped queues and the reclaim for serving pods.

Status: usage, borrowed and lent GPUs, admitted and pending workloads (TrainingJobs, and
serving workloads that wait for quota with nothing running).

The accounting is `workloads.training_quota.queue_report` (the same reading of
TrainingJobs the start decision uses); this edge only reads the objects through
`ClusterOps` and returns the status to write; `run_status_loop` writes it
every interval on a thread of its own (not kopf's: the operator may patch only
the status subresource of Queues, which platform teams own). The same loop
stops what a queue under `stopPolicy: HoldAndDrain` runs (`drain`) and the
borrowed TrainingJobs whose quota serving pods reclaim
(`reclaim_for_serving`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from chronotope.api.v1alpha1.queue import QueueStatus, QuotaRelease, StopPolicy
from chronotope.controllers.trainingjob import (
    DRAINING,
    STOP_WHY,
    ClusterOps,
    Outcome,
    merged_status,
)
from chronotope.workloads.training_quota import (
    QuotaView,
    drain_victims,
    local_queue_report,
    queue_report,
    serving_reclaims,
    serving_workloads,
    waiting_serving,
)
from chronotope.workloads.training_status import condition

__all__ = [
    "QueueObserver",
    "QueueOps",
    "Reports",
    "drain",
    "reclaim_for_serving",
    "reconcile_local_queue",
    "reconcile_queue",
    "run_status_loop",
    "write_statuses",
]

log = logging.getLogger(__name__)

QueueObserver = Callable[[str, Mapping[str, Any], Mapping[str, Any]], None]
"""(queue name, its spec, its new status) -> None: feeds the metrics."""


def _generation(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("generation")
    return int(value) if value is not None else None


class Reports:
    """One reading of every Queue's report, shared by the Queues' timers for `ttl_s` seconds.

    Each report reads every TrainingJob; computing it once per Queue per timer
    tick would cost (Queues x jobs) each interval.
    """

    def __init__(self, ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        """Reuse a reading for `ttl_s` seconds of `clock`."""
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._reports: dict[str, QueueStatus] = {}
        self._local: dict[tuple[str, str], tuple[int, int, str | None]] = {}

    def read(self, ops: ClusterOps) -> dict[str, QueueStatus]:
        """Every Queue's status numbers and forecast (fresh or recent)."""
        with self._lock:
            self._refresh(ops)
            return self._reports

    def local(self, ops: ClusterOps) -> dict[tuple[str, str], tuple[int, int, str | None]]:
        """Every LocalQueue's (admitted, pending, why inactive) (fresh or recent)."""
        with self._lock:
            self._refresh(ops)
            return self._local

    def _refresh(self, ops: ClusterOps) -> None:
        if self._at is not None and self.clock() - self._at < self.ttl_s:
            return
        view = _view(ops)
        jobs = ops.training_jobs()
        serving = serving_workloads(view, ops.pods())
        waiting = waiting_serving(ops.inference_pipelines(), ops.model_variants())
        self._reports = queue_report(view, jobs, serving, waiting)
        self._local = local_queue_report(view, jobs, serving, waiting)
        self._at = self.clock()


def _what(release: QuotaRelease) -> str:
    parts = [f"{release.gpus} {release.gpu_type}"] if release.gpus else []
    if release.share_milli:
        parts.append(f"{release.share_milli} {release.gpu_type} share milli")
    return ", ".join(parts)


def reconcile_queue(
    obj: Mapping[str, Any],
    ops: ClusterOps,
    now: datetime,
    observe: QueueObserver | None = None,
    reports: Reports | None = None,
) -> Outcome:
    """The status of Queue `obj` from the cluster's TrainingJobs now (or `reports`' reading)."""
    name = str(obj["metadata"]["name"])
    status = (reports or Reports(ttl_s=0.0)).read(ops).get(name)
    if status is None:  # being deleted, or not in the cache yet
        return Outcome()
    body = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    used = sum(row.used for row in status.gpus)
    message = (
        f"{status.admitted_workloads} admitted, {status.pending_workloads} pending; "
        f"{used} GPU(s) in use"
    )
    if status.forecast:
        message += "; next predicted releases: " + ", ".join(
            f"{_what(r)} at {r.at:%Y-%m-%d %H:%M} ({r.workload})" for r in status.forecast[:3]
        )
    gen = _generation(obj)
    stop = StopPolicy((obj.get("spec") or {}).get("stopPolicy") or StopPolicy.NONE)
    if stop is StopPolicy.NONE:
        active = condition("Active", True, "Ready", message, now=now, generation=gen)
    else:
        drains = stop is StopPolicy.HOLD_AND_DRAIN
        what = "draining: admits nothing" if drains else "admits nothing new"
        message = f"stopPolicy {stop.value}, {what}; {message}"
        active = condition("Active", False, "Stopped", message, now=now, generation=gen)
    body["conditions"] = [active]
    body["observedGeneration"] = gen
    if observe is not None:
        observe(name, obj.get("spec") or {}, body)
    return Outcome(status=body)


def reconcile_local_queue(
    obj: Mapping[str, Any], ops: ClusterOps, now: datetime, reports: Reports | None = None
) -> Outcome:
    """The status of LocalQueue `obj`: its jobs, and whether its Queue exists."""
    meta = obj["metadata"]
    key = (str(meta.get("namespace")), str(meta["name"]))
    found = (reports or Reports(ttl_s=0.0)).local(ops).get(key)
    if found is None:
        return Outcome()
    admitted, pending, inactive = found
    gen = _generation(obj)
    if inactive is None:
        active = condition(
            "Active",
            True,
            "Ready",
            f"admits into Queue {obj['spec']['queue']}",
            now=now,
            generation=gen,
        )
    else:
        active = condition("Active", False, "QueueMissing", inactive, now=now, generation=gen)
    return Outcome(
        status={
            "admittedWorkloads": admitted,
            "pendingWorkloads": pending,
            "conditions": [active],
            "observedGeneration": gen,
        }
    )


class QueueOps(ClusterOps, Protocol):
    """`ClusterOps` plus the two status writes of this module."""

    def write_queue_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Patch Queue `name`'s status subresource with `status`."""
        ...

    def write_local_queue_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Patch LocalQueue `namespace/name`'s status subresource with `status`."""
        ...


def _changed(obj: Mapping[str, Any], out: Outcome) -> dict[str, Any]:
    old: Mapping[str, Any] = obj.get("status") or {}
    new = merged_status(old, out.status)
    return {k: v for k, v in new.items() if old.get(k) != v}


def drain(ops: ClusterOps, view: QuotaView | None = None) -> list[str]:
    """Checkpoint and stop the started TrainingJobs of queues under `stopPolicy: HoldAndDrain`.

    Each victim is asked once (`training_quota.drain_victims`), with its queue's
    reclaim grace period; its own reconcile posts `Preempted` ("preempted by
    Queue Q (draining queue Q)") and re-queues it, and the stopped queue holds it.
    Returns the victims' keys. `view`: the Queues as read for this pass (read if None).
    """
    view = view if view is not None else _view(ops)
    if all(q.stop_policy is not StopPolicy.HOLD_AND_DRAIN for q in view.queues.values()):
        return []  # the common case: no job to read
    victims = drain_victims(view, ops.training_jobs())
    for key, queue, grace in victims:
        log.info("%s: draining queue %s: checkpointing and stopping it", key, queue)
        ops.preempt(key, by=f"Queue {queue}", why=f"{DRAINING}{queue}", grace_seconds=grace)
    return [key for key, _, _ in victims]


def reclaim_for_serving(ops: ClusterOps, view: QuotaView | None = None) -> list[str]:
    """Checkpoint and stop borrowed TrainingJobs whose quota serving pods reclaim.

    An InferencePipeline or serving group whose queue lent the quota it needs
    creates its pods anyway (on a node or not, they take the quota:
    `training_quota.serving_reclaims`);
    each borrowed job to stop is asked once, with the reclaiming queue's grace
    period; its own reconcile posts `Preempted` ("preempted by InferencePipeline
    NS/NAME (reclaiming quota of queue Q)") and re-queues it, and the quota holds
    it back while the serving pods hold the quota. Returns the victims' keys.
    `view`: the Queues as read for this pass (read if None).
    """
    view = view if view is not None else _view(ops)
    if not view.on:
        return []
    out = serving_reclaims(view, ops.training_jobs, ops.pods())
    for r in out:
        namespace, _, owner = r.workload.partition("/")
        kind, _, name = owner.partition(":")
        by = f"{_SERVING_KINDS.get(kind, kind)} {namespace}/{name}"
        log.info("%s: %s reclaims queue %s's lent quota: stopping it", r.victim, by, r.queue)
        why = f"{STOP_WHY[r.cause]}{r.queue}"
        ops.preempt(r.victim, by=by, why=why, grace_seconds=r.grace_seconds)
    return [r.victim for r in out]


def _view(ops: ClusterOps) -> QuotaView:
    return QuotaView.parse(ops.queues(), ops.local_queues(), ops.namespaces())


_SERVING_KINDS = {"pipeline": "InferencePipeline", "serving-group": "serving group"}


def write_statuses(ops: QueueOps, now: datetime, observe: QueueObserver | None = None) -> int:
    """One pass: `drain`, `reclaim_for_serving`, then every Queue's and LocalQueue's changed status.

    Returns how many statuses it wrote.
    """
    view = _view(ops)
    drain(ops, view)
    reclaim_for_serving(ops, view)
    reports = Reports(ttl_s=float("inf"))  # one reading for the whole pass
    written = 0
    for obj in ops.queues():
        changed = _changed(obj, reconcile_queue(obj, ops, now, observe, reports))
        if changed:
            ops.write_queue_status(str(obj["metadata"]["name"]), changed)
            written += 1
    for obj in ops.local_queues():
        changed = _changed(obj, reconcile_local_queue(obj, ops, now, reports))
        if changed:
            meta = obj["metadata"]
            ops.write_local_queue_status(str(meta["namespace"]), str(meta["name"]), changed)
            written += 1
    return written


def run_status_loop(
    ops: QueueOps,
    stop: threading.Event,
    interval: float,
    observe: QueueObserver | None = None,
    *,
    changed: threading.Event | None = None,
    idle_s: float = 15.0,
) -> None:
    """Write the Queues' and LocalQueues' status until `stop` is set.

    Every `interval` seconds; with `changed` (set by the cache's listener when a
    TrainingJob, Queue or LocalQueue changes), only once something changed, or
    every `idle_s` seconds (the queue metrics go stale without a reading). A pass
    that fails (an API hiccup) is logged and tried again next interval.
    """
    while not stop.is_set():
        if changed is not None:
            changed.clear()
        try:
            write_statuses(ops, datetime.now(UTC), observe)
        except Exception:
            log.exception("writing Queue status failed; retrying in %.0fs", interval)
            if changed is not None:
                changed.set()
        stop.wait(interval)
        quiet = time.monotonic() + max(0.0, idle_s - interval)
        while changed is not None and not changed.is_set() and not stop.is_set():
            left = quiet - time.monotonic()
            if left <= 0:
                break
            changed.wait(min(left, 1.0))
