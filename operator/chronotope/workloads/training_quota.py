"""TrainingJobs and serving workloads against their Queues: the quota step, and the report (pure).

`workloads.quota` holds the accounting rules on plain values; this module
reads TrainingJob objects into them, the same way for every scheduling pass:

- a job *holds* quota while its gang exists (phase `Starting` or `Running`
  with a plan): its plan's GPU type, at its plan's worker count; the pods of
  InferencePipelines and serving groups hold quota too (`serving_workloads`);
- every other live job *waits* for quota, in the policy order of
  `workloads.queueing.queue_key` (priority, deadline, age), with one
  alternative per GPU type it accepts, at its replica count;
- each job asks for exactly what its start decision chose first (type and
  workers), then its other types.

One admission cycle over all waiting jobs runs each pass
(`admission_cycle`), so a job is admitted only after the jobs ahead of it
have taken their share of the quota (Kueue's BestEffortFIFO: a job that does
not fit does not hold back later ones). Jobs ahead that quota admits but the
cluster cannot place yet still count against the quota in that cycle, as a
Kueue quota reservation does: quota is a cap, not a promise of GPUs. Docs:
docs/queues.md.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from chronotope.api.v1alpha1.common import QuotaDemand
from chronotope.api.v1alpha1.localqueue import LocalQueueSpec
from chronotope.api.v1alpha1.modelvariant import ModelVariantSpec
from chronotope.api.v1alpha1.queue import (
    QueuedWorkload,
    QueueReclaim,
    QueueSpec,
    QueueStatus,
    QuotaRelease,
    StopPolicy,
)
from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec, UtilityFunction
from chronotope.sharing.labels import (
    DONE_PHASES,
    PREEMPTED_BY_ANNOTATION,
    QUEUE_LABEL,
)
from chronotope.solver.model import MILLI
from chronotope.workloads.job_spec import job_spec_or_none
from chronotope.workloads.node_fit import NamespaceLabels, namespace_labels
from chronotope.workloads.pipeline import PIPELINE_LABEL, QUOTA_WAIT
from chronotope.workloads.podreq import PodRequestError, pod_request, replica_pod
from chronotope.workloads.queueing import queue_key
from chronotope.workloads.quota import (
    Admission,
    AdmittedWorkload,
    Demand,
    PendingWorkload,
    QueueQuota,
    QuotaBook,
    Resource,
    StopCause,
    Unit,
    Verdict,
    WaitReason,
    admit,
    demands_of,
    fits_now,
    forecast_starts,
    policy_first,
    queue_statuses,
    reclaim_to_fit,
    room_once_released,
)
from chronotope.workloads.replan import parse_time
from chronotope.workloads.serving_group import GROUP_LABEL
from chronotope.workloads.training import Action, Decision
from chronotope.workloads.variants import group_name

__all__ = [
    "DEFAULT_LOCAL_QUEUE",
    "ENDED",
    "FORECAST",
    "HOLDING",
    "SERVING_OWNERS",
    "QuotaCycle",
    "QuotaView",
    "ServingHolders",
    "ServingReclaim",
    "ServingRoom",
    "ServingWait",
    "admission_cycle",
    "drain_victims",
    "is_serving_pod",
    "local_queue_report",
    "pending_order",
    "queue_report",
    "quota_wait",
    "reclaim_words",
    "serving_admission",
    "serving_demand",
    "serving_holders",
    "serving_reclaim",
    "serving_reclaims",
    "serving_room",
    "serving_workloads",
    "waiting_serving",
]

log = logging.getLogger(__name__)

HOLDING = ("Starting", "Running")
"""Phases of a job whose gang exists: it holds quota."""

ENDED = ("Succeeded", "Failed")
"""Phases of a job that is over: it holds and asks for nothing."""

DEFAULT_LOCAL_QUEUE = "default"
"""The LocalQueue of a serving pod without the queue label, and of every serving group."""


@dataclass(frozen=True)
class QuotaView:
    """The cluster's Queues (by name) and LocalQueues (by (namespace, name)), parsed.

    `namespaces`: each namespace's labels, for Queues with a `namespaceSelector`
    (None: not read; such a Queue then admits nothing, `QuotaBook.refuses`).
    """

    queues: Mapping[str, QueueSpec]
    local_queues: Mapping[tuple[str, str], LocalQueueSpec]
    namespaces: NamespaceLabels | None = None

    @classmethod
    def parse(
        cls,
        queues: Iterable[Mapping[str, Any]],
        local_queues: Iterable[Mapping[str, Any]],
        namespaces: Iterable[Mapping[str, Any]] | None = None,
    ) -> QuotaView:
        """From API objects; an object the models reject is left out (and logged)."""
        parsed: dict[str, QueueSpec] = {}
        for obj in queues:
            meta = obj.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue
            try:
                parsed[str(meta["name"])] = QueueSpec.model_validate(obj.get("spec") or {})
            except ValueError as exc:
                log.warning("Queue %s skipped: %s", meta.get("name"), exc)
        local: dict[tuple[str, str], LocalQueueSpec] = {}
        for obj in local_queues:
            meta = obj.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue
            try:
                spec = LocalQueueSpec.model_validate(obj.get("spec") or {})
            except ValueError as exc:
                log.warning(
                    "LocalQueue %s/%s skipped: %s", meta.get("namespace"), meta.get("name"), exc
                )
                continue
            local[(str(meta.get("namespace")), str(meta["name"]))] = spec
        labels = namespace_labels(namespaces) if namespaces is not None else None
        return cls(parsed, local, labels)

    @property
    def on(self) -> bool:
        """Quotas apply once any Queue exists."""
        return bool(self.queues)

    def without_preemption(self) -> QuotaView:
        """The same Queues with reclaim and within-queue preemption off.

        For a scheduling pass's later rounds (`training_pass.schedule`): they admit
        only quota nobody holds, and stop nobody.
        """
        queues = {  # QueueReclaim's defaults: policy Never, withinQueue Never
            name: spec.model_copy(
                update={
                    "reclaim": QueueReclaim(grace_period_seconds=spec.reclaim.grace_period_seconds)
                }
            )
            for name, spec in self.queues.items()
        }
        return replace(self, queues=queues)


def _key(job: Mapping[str, Any]) -> str:
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _live(
    jobs: Iterable[Mapping[str, Any]],
) -> Iterator[tuple[Mapping[str, Any], TrainingJobSpec]]:
    """The jobs neither ended nor being deleted, with their specs.

    A job whose spec the models reject is left out: it holds and asks for nothing.
    """
    for job in jobs:
        meta = job.get("metadata") or {}
        if meta.get("deletionTimestamp") or (job.get("status") or {}).get("phase") in ENDED:
            continue
        spec = job_spec_or_none(job)
        if spec is not None:
            yield job, spec


SERVING_OWNERS = ((PIPELINE_LABEL, "pipeline"), (GROUP_LABEL, "serving-group"))
"""Pod labels that make a pod part of a serving workload, and the workload's kind."""


def _pod_quota(pod: Mapping[str, Any]) -> tuple[Resource, int] | None:
    """The quota pool a pod's GPUs take and how much: whole GPUs, or a share's milli.

    None for a pod without GPUs, without exactly one GPU type, or with a bad request.
    """
    try:
        req = pod_request(pod)
    except PodRequestError:
        return None
    if not req.num_gpus or len(req.gpu_models) != 1:
        return None
    if req.gpu_milli >= MILLI:
        return (req.gpu_models[0], Unit.GPUS), req.num_gpus
    return (req.gpu_models[0], Unit.SHARE_MILLI), req.gpu_milli


def is_serving_pod(pod: Mapping[str, Any]) -> bool:
    """Whether `pod` belongs to an InferencePipeline stage or a serving group."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return any(k in labels for k, _ in SERVING_OWNERS)


def serving_workloads(view: QuotaView, pods: Iterable[Mapping[str, Any]]) -> list[AdmittedWorkload]:
    """Serving workloads as holders of quota, from their pods.

    Each InferencePipeline's and serving group's live GPU pods, summed per GPU
    type, count in the queue of their LocalQueue: the pod label
    `chronotope.dev/queue` (`default` without it) in the pod's namespace. Pods
    whose LocalQueue or Queue does not exist count nowhere, as do pods without
    one GPU type. Keys are `namespace/pipeline:NAME` or
    `namespace/serving-group:NAME`. Reclaiming never stops them.
    """
    usage: dict[tuple[str, str], Counter[Resource]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        owner = next(((kind, labels[k]) for k, kind in SERVING_OWNERS if k in labels), None)
        if owner is None or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in DONE_PHASES:
            continue
        namespace = str(meta.get("namespace"))
        key = f"{namespace}/{owner[0]}:{owner[1]}"
        local = view.local_queues.get((namespace, labels.get(QUEUE_LABEL, DEFAULT_LOCAL_QUEUE)))
        if local is None or local.queue not in view.queues:
            continue
        held = _pod_quota(pod)
        if held is not None:
            usage.setdefault((key, local.queue), Counter())[held[0]] += held[1]
    return [
        AdmittedWorkload(key, queue, dict(held), 0.0, reclaimable=False)
        for (key, queue), held in sorted(usage.items())
    ]


@dataclass(frozen=True)
class ServingWait:
    """A serving workload that quota holds back with nothing of it running (`waiting_serving`)."""

    order: tuple[int, str, str, str]
    """Its place among the TrainingJobs (`queueing.queue_key`: priority 0, no deadline, age)."""
    workload: PendingWorkload
    """Its one alternative: what it asks, on every GPU type at once (it takes part in the
    admission cycle); none when its status does not say (it is only counted and listed)."""
    why: str = ""
    """Its `whyWaiting` (a group's, of its oldest variant)."""


def waiting_serving(
    pipelines: Iterable[Mapping[str, Any]], variants: Iterable[Mapping[str, Any]]
) -> list[ServingWait]:
    """Serving workloads that quota holds back with nothing of them running, oldest first.

    An InferencePipeline whose status waits for quota (`phase: Pending`,
    `whyWaiting` "waiting for quota: ..."), and a serving group whose Pending
    variant's `Ready` condition says `QuotaExceeded`; keyed as
    `serving_workloads` keys them (`namespace/pipeline:NAME`,
    `namespace/serving-group:NAME`), with the demand their status records
    (`quotaDemand`, `serving_demand`; a group's from its oldest variant). Each
    is admitted by its own controller once its demand fits; in the TrainingJob
    admission cycle its demand (all its GPU types at once) keeps its place by age
    (`_cycle`).
    """
    found: dict[str, ServingWait] = {}

    def add(obj: Mapping[str, Any], owner: str, local_queue: str) -> None:
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace"))
        key = f"{namespace}/{owner}"
        created = str(meta.get("creationTimestamp") or "")
        order = queue_key({"metadata": {"creationTimestamp": created, "name": key}})
        if key in found and found[key].order <= order:
            return
        rows = (obj.get("status") or {}).get("quotaDemand") or []
        wanted: Counter[Resource] = Counter()
        for row in rows:
            wanted[(str(row.get("gpuType")), Unit.GPUS)] += int(row.get("gpus") or 0)
            wanted[(str(row.get("gpuType")), Unit.SHARE_MILLI)] += int(row.get("shareMilli") or 0)
        demands = _as_demands(+wanted)
        alternatives = (Demand.together(demands),) if demands else ()
        why = str((obj.get("status") or {}).get("whyWaiting") or "")
        pending = PendingWorkload(
            key, namespace, local_queue, alternatives, preempts_within_queue=False
        )
        found[key] = ServingWait(order, pending, why)

    for obj in pipelines:
        status = obj.get("status") or {}
        if (obj.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") != "Pending":
            continue
        if str(status.get("whyWaiting") or "").startswith(QUOTA_WAIT):
            local = str((obj.get("spec") or {}).get("queue") or DEFAULT_LOCAL_QUEUE)
            add(obj, f"pipeline:{obj['metadata']['name']}", local)
    for obj in variants:
        status = obj.get("status") or {}
        if (obj.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") != "Pending":
            continue
        conditions = status.get("conditions") or []
        ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
        if ready.get("reason") != WaitReason.QUOTA_EXCEEDED:
            continue
        try:
            group = group_name(ModelVariantSpec.model_validate(obj.get("spec") or {}))
        except ValueError:
            continue  # a variant the models reject is in no group
        add(obj, f"serving-group:{group}", DEFAULT_LOCAL_QUEUE)
    return sorted(found.values(), key=lambda w: w.order)


def serving_demand(namespace: str, objects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The `quotaDemand` rows of a serving workload's Deployments `objects` (per GPU type)."""
    return [
        QuotaDemand(gpu_type=d.gpu_type, gpus=d.gpus, share_milli=d.share_milli).model_dump(
            by_alias=True, mode="json"
        )
        for d in _as_demands(_serving_demands(namespace, objects))
    ]


def _serving_demands(namespace: str, objects: Iterable[Mapping[str, Any]]) -> Counter[Resource]:
    """What Deployments `objects` ask of quota per pool: replicas x their pod template's GPUs."""
    wanted: Counter[Resource] = Counter()
    for obj in objects:
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        pod = {"metadata": {"namespace": namespace, **(template.get("metadata") or {})}}
        held = _pod_quota(pod | {"spec": template.get("spec") or {}})
        if held is not None:
            wanted[held[0]] += int(spec.get("replicas", 1)) * held[1]
    return wanted


def _as_demands(wanted: Mapping[Resource, int]) -> list[Demand]:
    """Per-pool amounts as one Demand per GPU type (whole GPUs and share milli together)."""
    return [
        Demand(t, wanted.get((t, Unit.GPUS), 0), wanted.get((t, Unit.SHARE_MILLI), 0))
        for t in sorted({pool[0] for pool in wanted})
    ]


def _serving_queue(
    view: QuotaView, namespace: str, local_queue: str, book: QuotaBook
) -> QueueQuota | str:
    """The Queue of LocalQueue `namespace/local_queue` in `book`, or why there is none."""
    local = view.local_queues.get((namespace, local_queue))
    if local is None:
        return f"no LocalQueue {local_queue} in namespace {namespace}"
    queue = book.queues.get(local.queue)
    if queue is None:
        return (
            f"LocalQueue {namespace}/{local_queue} names Queue {local.queue}, which does not exist"
        )
    return queue


def serving_admission(
    view: QuotaView,
    holders: ServingHolders,
    *,
    local_queue: str,
    objects: Iterable[Mapping[str, Any]],
) -> str | None:
    """Whether serving workload `holders.key` may run `objects` now, or why not.

    `objects` are the workload's Deployments as it would apply them: their
    replicas times their pod template's GPUs are its demand, per GPU type; what
    it holds now (its own pods) does not count against it. None: quotas are off,
    the demand fits the queue of LocalQueue `local_queue` in its namespace, or
    it is no more than the workload holds now on every pool (a shrink gives
    back and takes nothing, even above a lowered quota).
    """
    if not view.on:
        return None
    key = holders.key
    namespace = key.split("/", 1)[0]
    book, own = holders.book.copy(), holders.own  # fits_now counts on the book: a copy
    queue = _serving_queue(view, namespace, local_queue, book)
    if isinstance(queue, str):
        return queue
    refused = book.refuses(queue, namespace)
    wanted = _serving_demands(namespace, objects)
    if own and all(n <= own[pool] for pool, n in wanted.items()):
        return None  # a shrink gives back, even in a namespace the Queue no longer selects
    if refused is not None:
        return refused
    return fits_now(book, queue, key, _as_demands(wanted))


def serving_reclaim(
    view: QuotaView,
    holders: ServingHolders,
    *,
    local_queue: str,
    objects: Iterable[Mapping[str, Any]],
) -> tuple[str, Mapping[str, StopCause]] | None:
    """(its Queue, the borrowed TrainingJobs to stop and why) for `objects` to fit; None if not.

    For a serving workload that `serving_admission` holds back because its queue
    lent the quota it needs: within its nominal quota, and under the Queue's
    `reclaim.policy: PreemptBorrowed`, the borrowers of the cohort give it back;
    above it, under `reclaim.fairShare: Preempt`, borrowers above their fair share
    stop (`quota.reclaim_to_fit`, the victims a TrainingJob would stop). None
    also when it fits without stopping anyone, or quota is off.
    """
    if not view.on:
        return None
    namespace = holders.key.split("/", 1)[0]
    book = holders.book.copy()
    queue = _serving_queue(view, namespace, local_queue, book)
    if isinstance(queue, str) or book.refuses(queue, namespace) is not None:
        return None
    victims = reclaim_to_fit(
        book, queue, holders.key, _as_demands(_serving_demands(namespace, objects))
    )
    return (queue.name, victims) if victims else None


def reclaim_words(queue: str, victims: Mapping[str, StopCause]) -> str:
    """What a serving workload that reclaims lent quota (or borrows for its fair share) says."""
    causes = set(victims.values())
    does = " and ".join(
        words
        for cause, words in (
            (StopCause.RECLAIM, "reclaims the quota it lent"),
            (StopCause.FAIR_SHARE, "borrows for its fair share"),
        )
        if cause in causes
    )
    return (
        f"queue {queue} {does}: stopping borrowed TrainingJob(s) "
        f"{', '.join(victims)} (checkpointed within the queue's grace period); its pods "
        "start once they have stopped"
    )


@dataclass(frozen=True)
class ServingReclaim:
    """A borrowed TrainingJob to stop because a serving workload's queue needs its quota back."""

    victim: str
    queue: str
    grace_seconds: int
    workload: str
    """The serving workload whose pods wait for it (`namespace/pipeline:NAME` ...)."""
    cause: StopCause = StopCause.RECLAIM
    """Why: its queue reclaims what it lent, or borrows for its fair share."""


def serving_reclaims(
    view: QuotaView,
    jobs: Callable[[], Sequence[Mapping[str, Any]]],
    pods: Sequence[Mapping[str, Any]],
) -> list[ServingReclaim]:
    """The borrowed TrainingJobs to stop so that serving workloads get their lent quota back.

    Each serving workload's live pods, bound to a node or not, hold or reserve
    quota (`serving_workloads`). Where what a workload's pods ask fits its
    queue's nominal quota only once borrowers in the cohort give back what it
    lent, and the Queue reclaims (`PreemptBorrowed`), the borrowed TrainingJobs
    `reclaim_to_fit` picks are stopped with the reclaiming queue's grace period,
    as a TrainingJob's reclaim stops them; so are those above their fair share
    where what it asks above its nominal quota fits only once they stop and its
    Queue sets `fairShare: Preempt`. Bound pods count as unbound ones do:
    on free GPUs of the type a serving workload's pods run at once, but the
    borrower still holds quota its lender now uses. Jobs already asked to stop
    (their `preempted-by` annotation is set) count as gone and are not asked
    again; a workload that fits without stopping anyone, or cannot fit even then
    (above its nominal quota), stops nobody. `jobs` (the TrainingJobs) is read
    only when a serving pod exists.
    """
    if not view.on:
        return []
    serving = serving_workloads(view, pods)
    if not serving:
        return []  # no serving workload holds quota: no job to read
    holding = [
        j
        for j in jobs()
        if (j.get("status") or {}).get("phase") in HOLDING
        and not ((j.get("metadata") or {}).get("annotations") or {}).get(PREEMPTED_BY_ANNOTATION)
    ]
    book, _ = _cycle(view, holding)
    out: list[ServingReclaim] = []
    for workload in serving:
        queue = book.queues[workload.queue]
        trial = book.copy()
        victims = reclaim_to_fit(trial, queue, workload.key, _as_demands(workload.usage))
        if not victims:  # fits as it is, or cannot fit by reclaiming: it holds what it asks
            book.add(workload)
            continue
        book = trial
        out.extend(
            ServingReclaim(v, queue.name, queue.grace_seconds, workload.key, cause)
            for v, cause in victims.items()
        )
    return out


@dataclass(frozen=True)
class ServingHolders:
    """What everyone but serving workload `key` holds now (`book`), and what it holds (`own`).

    Built once per reconcile (`serving_holders`); `serving_admission` and
    `serving_room` read it, never change it.
    """

    key: str
    """`namespace/pipeline:NAME` or `namespace/serving-group:NAME`."""
    book: QuotaBook
    own: Counter[Resource]


def serving_holders(
    view: QuotaView, jobs: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], key: str
) -> ServingHolders:
    """The started TrainingJobs' and the serving pods' holdings, all but `key`'s, and `key`'s."""
    holding = [j for j in jobs if (j.get("status") or {}).get("phase") in HOLDING]
    serving = serving_workloads(view, pods)
    own: Counter[Resource] = Counter()
    for w in serving:
        if w.key == key:
            own.update(w.usage)
    book, _ = _cycle(view, holding, serving=[w for w in serving if w.key != key])
    return ServingHolders(key, book, own)


@dataclass(frozen=True)
class ServingRoom:
    """The most a serving workload's queue could ever hold, per pool (`QuotaBook.ceiling`).

    `now`, where the caller gave the cluster's workloads: the most the workload may
    hold now, per pool (what it holds counts as room: `QuotaBook.room_now` on the
    book without it); None where not asked.
    """

    queue: str
    ceilings: Mapping[Resource, int]
    now: Mapping[Resource, int] | None = None

    def pod_quota(
        self, gpu_type: str, limits: Mapping[str, str], annotations: Mapping[str, str]
    ) -> tuple[Resource, int] | None:
        """The pool one pod asking `limits` (and share `annotations`) on `gpu_type` takes.

        And how much, read as admission reads a serving pod (`_pod_quota`); None
        without a GPU.
        """
        return _pod_quota(replica_pod(limits, annotations, gpu_type=gpu_type))

    def holds(
        self, gpu_type: str, limits: Mapping[str, str], annotations: Mapping[str, str]
    ) -> bool:
        """Whether one pod asking `limits` (and share `annotations`) on `gpu_type` could ever fit.

        One that asks for no GPU always fits.
        """
        held = self.pod_quota(gpu_type, limits, annotations)
        return held is None or held[1] <= self.ceilings.get(held[0], 0)

    def excess(self, usage: Mapping[Resource, int]) -> float:
        """How far `usage` exceeds the room now, in GPUs (a share's milli / 1000).

        0 without `now`.
        """
        if self.now is None:
            return 0.0
        out = 0.0
        for pool, amount in usage.items():
            over = amount - self.now.get(pool, 0)
            if over > 0:
                out += over if pool[1] is Unit.GPUS else over / MILLI
        return out

    def rows(self) -> list[dict[str, Any]]:
        """The room now per GPU type as status rows (`gpuType`, `gpus`, `shareMilli`)."""
        by_type: dict[str, dict[str, Any]] = {}
        for (gpu_type, unit), amount in sorted((self.now or {}).items()):
            row = by_type.setdefault(gpu_type, {"gpuType": gpu_type, "gpus": 0, "shareMilli": 0})
            row["gpus" if unit is Unit.GPUS else "shareMilli"] = amount
        return list(by_type.values())


def serving_room(
    view: QuotaView,
    namespace: str,
    local_queue: str,
    *,
    now: ServingHolders | None = None,
) -> ServingRoom | None:
    """What the queue of LocalQueue `namespace/local_queue` could ever hold, or None.

    A replica on a pool its Queue does not list, or whose nominal quota and what it
    may borrow in its cohort are below one replica, is never admitted: a pipeline
    planned on it would wait for quota that cannot come. None: no limit (quotas
    off), or the LocalQueue or its Queue is missing, or the Queue does not admit
    the namespace (admission reports those). With `now` (what everyone holds, as
    `serving_admission` reads it) it also says what the workload may hold now
    (nothing more in a stopped queue).
    """
    if not view.on:
        return None
    local = view.local_queues.get((namespace, local_queue))
    if local is None or local.queue not in view.queues:
        return None
    book = QuotaBook(view.queues, view.local_queues, namespaces=view.namespaces)
    queue = book.queues[local.queue]
    if book.refuses(queue, namespace) is not None:  # admission says why, as for a missing one
        return None
    ceilings = {pool: book.ceiling(queue, pool) for pool in queue.nominal}
    if now is None:
        return ServingRoom(queue.name, ceilings)
    if queue.stop is not StopPolicy.NONE:  # it may keep what it holds, and take nothing more
        return ServingRoom(queue.name, ceilings, {pool: now.own[pool] for pool in queue.nominal})
    held = now.book.queues.get(queue.name, queue)
    return ServingRoom(
        queue.name, ceilings, {pool: now.book.room_now(held, pool) for pool in queue.nominal}
    )


def _held(job: Mapping[str, Any], spec: TrainingJobSpec, queue: str) -> AdmittedWorkload | None:
    """What a started job holds: its plan's type at its plan's workers."""
    status = job.get("status") or {}
    plan = status.get("plan") or {}
    if status.get("phase") not in HOLDING or not plan.get("gpuType"):
        return None
    workers = int(plan.get("workers") or spec.replicas)
    demand = next(
        (d for d in demands_of(spec, workers) if d.gpu_type == plan["gpuType"]),
        None,
    )
    if demand is None:  # started on a type the spec no longer lists: count it as whole GPUs
        demand = Demand(str(plan["gpuType"]), gpus=int(float(plan.get("totalGpus") or 0)))
    started = parse_time(plan.get("startTime"))
    return AdmittedWorkload(
        _key(job),
        queue,
        demand.pools(),
        started.timestamp() if started else 0.0,
        priority=spec.priority,
        preemptible=spec.preemptible,
    )


def drain_victims(view: QuotaView, jobs: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
    """(job key, queue, grace seconds) of each started TrainingJob a draining queue stops.

    A queue under `stopPolicy: HoldAndDrain` checkpoints and stops every TrainingJob
    that holds its quota, with its reclaim grace period; a job already asked to stop
    (its `preempted-by` annotation is set, until its own reconcile re-queues it) is
    not asked again. Serving workloads are never stopped.
    """
    draining = {n: q for n, q in view.queues.items() if q.stop_policy is StopPolicy.HOLD_AND_DRAIN}
    out = []
    for job, spec in _live(jobs):
        meta = job.get("metadata") or {}
        local = view.local_queues.get((str(meta.get("namespace")), spec.queue))
        name = local.queue if local is not None else ""
        queue = draining.get(name)
        if queue is None or (meta.get("annotations") or {}).get(PREEMPTED_BY_ANNOTATION):
            continue
        if _held(job, spec, name) is not None:
            out.append((_key(job), name, queue.reclaim.grace_period_seconds))
    return sorted(out)


def _cycle(
    view: QuotaView,
    jobs: Sequence[Mapping[str, Any]],
    first: Mapping[str, Decision] | None = None,
    serving: Sequence[AdmittedWorkload] = (),
    waiting: Sequence[ServingWait] = (),
    *,
    wished: Mapping[str, tuple[int, str]] | None = None,
) -> tuple[QuotaBook, list[PendingWorkload]]:
    """The book of what started jobs and `serving` workloads hold; the waiting jobs in order.

    `first` maps a job key to its START decision: that job asks for the
    decision's type and workers before its other alternatives. The `waiting`
    serving workloads that say what they ask and hold nothing yet wait among the
    jobs in their order (`ServingWait.order`), each asking all its GPU types at
    once, so a younger job does not take quota an older serving workload fits.
    `wished`: the cluster policy's wish (job key -> its place and type): those jobs go
    first (`quota.policy_first`; the serving workloads keep their places), each asking
    for the wished type before its others, as the simulator's queues ask.
    """
    admitted: list[AdmittedWorkload] = list(serving)
    pending: list[PendingWorkload] = []
    orders: dict[str, tuple[int, str, str, str]] = {}
    for job, spec in _live(sorted(jobs, key=queue_key)):
        meta = job.get("metadata") or {}
        status = job.get("status") or {}
        namespace = str(meta.get("namespace"))
        key = _key(job)
        queue = view.local_queues.get((namespace, spec.queue))
        held = _held(job, spec, queue.queue) if queue is not None else None
        if held is not None:
            admitted.append(held)
            continue
        if status.get("phase") in HOLDING:
            continue  # a started job of a missing (Local)Queue counts nowhere
        alternatives = demands_of(spec)
        if first is not None and key in first:
            alternatives = _decided_first(spec, first[key], alternatives)
        if wished and key in wished:
            gpu_type = wished[key][1]
            alternatives = (
                *(d for d in alternatives if d.gpu_type == gpu_type),
                *(d for d in alternatives if d.gpu_type != gpu_type),
            )
        pending.append(
            PendingWorkload(key, namespace, spec.queue, alternatives, priority=spec.priority)
        )
        orders[key] = queue_key(job)
    for w in _still_waiting(serving, waiting):
        if w.workload.alternatives:
            pending.append(w.workload)
            orders[w.workload.key] = w.order
    pending.sort(key=lambda p: orders[p.key])
    book = QuotaBook(view.queues, view.local_queues, admitted, view.namespaces)
    if wished:
        places = {k: place for k, (place, _) in wished.items()}
        pending = policy_first(book, pending, places, fixed={w.workload.key for w in waiting})
    return book, pending


def _decided_first(
    spec: TrainingJobSpec, decision: Decision, alternatives: tuple[Demand, ...]
) -> tuple[Demand, ...]:
    if decision.action is not Action.START or decision.gpu_type is None:
        return alternatives
    chosen = next(
        (d for d in demands_of(spec, decision.workers) if d.gpu_type == decision.gpu_type), None
    )
    if chosen is None:
        return alternatives
    return (chosen, *(d for d in alternatives if d.gpu_type != decision.gpu_type))


@dataclass(frozen=True)
class QuotaCycle:
    """One admission cycle's verdicts, and where quota lets the running jobs asked about move."""

    admissions: dict[str, Admission]
    move_types: dict[str, frozenset[str]]
    """Running job -> its GPU type and those its queue's quota admits it on once it gives
    its own hold up (after this cycle's admissions, reclaiming nothing); none for a job
    of a missing (Local)Queue, which must keep what it runs on."""


def admission_cycle(
    view: QuotaView,
    jobs: Sequence[Mapping[str, Any]],
    decided: Mapping[str, Decision],
    now: datetime,
    *,
    explain: Iterable[str] | None = None,
    serving: Sequence[AdmittedWorkload] = (),
    moving: Collection[str] = (),
    serving_waits: Sequence[ServingWait] = (),
    wished: Mapping[str, tuple[int, str]] | None = None,
    leases: Mapping[str, Collection[str]] | None = None,
) -> QuotaCycle:
    """The quota verdict of every waiting job now: one admission cycle (Kueue's).

    `decided` maps a job key to its start decision (a START asks for its type and
    workers first). ADMIT or BORROW name the GPU type quota lets a job start on;
    RECLAIM names the borrowed jobs to stop first (with their grace period); WAIT
    says which quota blocks, and for the jobs in `explain` (all if None) when the
    quota frees up. With no Queue at all, every job is admitted.

    The `serving_waits` (serving workloads) wait among the jobs by age (`_cycle`),
    asking all their GPU types at once: one that fits keeps its quota from the
    younger jobs of its queue until its own controller admits it; they get no verdict here.

    `wished` (the cluster policy's wish, quota aside: job key -> its place and type) goes
    first, on that type first (`quota.policy_first`); `leases` (waiting job -> the running
    jobs whose lease the policy gives it) may stop those of its own queue it needs
    (`quota.admit`, pass 6).

    Also the types quota lets each running job of `moving` move to: the fleet
    policy's lease may stop a running job to restart it on a faster type
    (`workloads.fleet`), and a move quota would not admit only restarts the job
    where it was, so the policy is offered just the types quota admits.
    """
    if not view.on:
        off = "no Queue exists: quotas are off"
        return QuotaCycle(
            {
                k: Admission(k, Verdict.ADMIT, message=off)
                for k in (decided if explain is None else explain)
            },
            {},
        )
    book, pending = _cycle(view, jobs, decided, serving, serving_waits, wished=wished)
    decisions = admit(book, pending, now.timestamp(), leases=leases)
    others = {w.workload.key for w in serving_waits}
    pending = [p for p in pending if p.key not in others]  # jobs only from here
    move_types = _move_types(book, jobs, moving) if moving else {}
    wanted = None if explain is None else set(explain)
    waiting = [
        p
        for p in pending
        if decisions[p.key].verdict is Verdict.WAIT
        and decisions[p.key].reason is WaitReason.QUOTA_EXCEEDED
    ]
    # the jobs admitted now hold their quota until their decisions' predicted finish
    admitted_now = [
        (d.finish.timestamp(), key)
        for key, d in decided.items()
        if d.finish is not None and key in decisions and decisions[key].verdict is not Verdict.WAIT
    ]
    runs_for = {
        key: (d.finish - (d.start or now)).total_seconds()
        for key, d in decided.items()
        if d.finish is not None
    }
    ends = [*_releases(jobs), *admitted_now]
    holding_back = {p.key for p in waiting}
    # waiting for a faster type pays only a job whose utility falls with its finish
    # (`training.decide` waits only for strictly more utility): no forecast for the rest
    timeless = {_key(job) for job, spec in _live(jobs) if not _falls_with_time(spec)}
    ahead: list[PendingWorkload] = []  # the jobs waiting for quota before this one
    for asking in pending:
        if asking.key in holding_back:
            ahead.append(asking)
            continue
        if asking.key in timeless:
            continue
        mine = decisions[asking.key]
        preferred = _preferred_later(
            book, asking, mine, decided.get(asking.key), ahead=ahead, ends=ends, runs_for=runs_for
        )
        if preferred is not None:
            decisions[asking.key] = replace(mine, preferred=preferred)
    turns = forecast_starts(book, waiting, ends, runs_for)
    for asking in waiting:
        if wanted is not None and asking.key not in wanted:
            continue
        mine = decisions[asking.key]
        found = turns.get(asking.key)
        if found is None:
            continue
        when = datetime.fromtimestamp(found[0], UTC)
        text = f"{mine.message}; its quota frees up {when:%Y-%m-%d %H:%M} ({found[1]} ends)"
        decisions[asking.key] = replace(mine, message=text, quota_frees_at=found[0])
    return QuotaCycle({k: d for k, d in decisions.items() if k not in others}, move_types)


def _move_types(
    book: QuotaBook, jobs: Iterable[Mapping[str, Any]], moving: Collection[str]
) -> dict[str, frozenset[str]]:
    """Running job of `moving` -> its type and those its queue admits it on without its hold.

    A job of a missing (Local)Queue holds nothing and would not be admitted again
    (it would wait with `QueueMissing`): no type, so it keeps what it runs on, as
    docs/queues.md promises for a deleted Queue's work.
    """
    own: dict[str, str] = {}
    asks: dict[str, list[Demand]] = {}
    for job, spec in _live(jobs):
        key = _key(job)
        plan = (job.get("status") or {}).get("plan") or {}
        if key not in moving or not plan.get("gpuType"):
            continue
        own[key] = str(plan["gpuType"])
        workers = int(plan.get("workers") or spec.replicas)
        asks[key] = [d for d in demands_of(spec, workers) if d.gpu_type != own[key]]
    room = room_once_released(book, asks)
    return {
        key: frozenset({own[key], *(d.gpu_type for d in room[key])}) if key in room else frozenset()
        for key in asks
    }


def _falls_with_time(spec: TrainingJobSpec) -> bool:
    return spec.utility is not None and spec.utility.function is not UtilityFunction.CONSTANT


def _preferred_later(
    book: QuotaBook,
    asking: PendingWorkload,
    admission: Admission,
    decided: Decision | None,
    *,
    ahead: Sequence[PendingWorkload],
    ends: Sequence[tuple[float, str]],
    runs_for: Mapping[str, float],
) -> tuple[str, float, str] | None:
    """For a job admitted on another type than its decision's: when that type's quota frees up.

    (type, time, whose end), or None when it was admitted on its own type, or
    the preferred type's quota never frees up for it by the predicted ends. Its
    turn comes as `forecast_starts` sequences the waiting jobs: those waiting
    for quota ahead of it take the freed quota first.
    """
    if admission.verdict not in (Verdict.ADMIT, Verdict.BORROW) or admission.demand is None:
        return None
    if decided is None or decided.gpu_type in (None, admission.demand.gpu_type):
        return None
    wanted = next((d for d in asking.alternatives if d.gpu_type == decided.gpu_type), None)
    if wanted is None:
        return None
    # asked about as waiting: the forecast no longer counts what it is admitted to now
    there = replace(asking, alternatives=(wanted,))
    turns = forecast_starts(book, [*ahead, there], ends, runs_for, until=asking.key)
    found = turns.get(asking.key)
    return None if found is None else (wanted.gpu_type, found[0], found[1])


def _releases(jobs: Sequence[Mapping[str, Any]]) -> list[tuple[float, str]]:
    """(predicted completion, key) of every started job that has a prediction."""
    out = []
    for job in jobs:
        status = job.get("status") or {}
        if status.get("phase") not in HOLDING:
            continue
        ends = parse_time((status.get("plan") or {}).get("predictedCompletionTime"))
        if ends is not None:
            out.append((ends.timestamp(), _key(job)))
    return out


FORECAST = 10
"""Releases a Queue's status forecast lists at most (the soonest)."""


def _forecast(book: QuotaBook, jobs: Sequence[Mapping[str, Any]]) -> dict[str, list[QuotaRelease]]:
    """Per Queue, the soonest predicted releases of its admitted workloads (the plan-ahead)."""
    out: dict[str, list[QuotaRelease]] = {}
    for when, key in sorted(_releases(jobs)):
        workload = book.workloads.get(key)
        if workload is None or len(out.setdefault(workload.queue, [])) >= FORECAST:
            continue
        for gpu_type in sorted({pool[0] for pool in workload.usage}):
            out[workload.queue].append(
                QuotaRelease(
                    at=datetime.fromtimestamp(when, UTC),
                    workload=key,
                    gpu_type=gpu_type,
                    gpus=workload.usage.get((gpu_type, Unit.GPUS), 0),
                    share_milli=workload.usage.get((gpu_type, Unit.SHARE_MILLI), 0),
                )
            )
    return out


def quota_wait(admission: Admission) -> Decision:
    """The WAIT decision that carries a quota verdict's reason (the job's condition)."""
    if admission.verdict is Verdict.RECLAIM:
        victims = ", ".join(admission.victims)
        within = admission.cause in (StopCause.WITHIN_QUEUE, StopCause.LEASE)
        whose = {StopCause.WITHIN_QUEUE: "lower-priority preemptible ", StopCause.LEASE: ""}.get(
            admission.cause, "borrowed "
        )
        text = (
            f"{admission.message}: stopping {whose}{victims} "
            f"(checkpoint, grace {admission.grace_seconds}s), then it starts"
        )
        cause = "PreemptingWithinQueue" if within else "ReclaimingQuota"
        return Decision(Action.WAIT, text, cause=cause)
    reason = admission.reason.value if admission.reason is not None else "QuotaExceeded"
    start = (
        datetime.fromtimestamp(admission.quota_frees_at, UTC)
        if admission.quota_frees_at is not None
        else None
    )
    return Decision(Action.WAIT, admission.message, cause=reason, start=start)


def queue_report(
    view: QuotaView,
    jobs: Sequence[Mapping[str, Any]],
    serving: Sequence[AdmittedWorkload] = (),
    waiting: Sequence[ServingWait] = (),
) -> dict[str, QueueStatus]:
    """Every Queue's usage, borrowed and lent GPUs per type, admitted and pending workloads.

    Usage is what started jobs and `serving` workloads hold; every live job that
    has not started counts as pending in its Queue, whether quota or GPUs hold it
    back, and so does each `waiting` serving workload (`waiting_serving`) that
    holds nothing: in admission order when it takes part in the cycle, else
    listed after the Queue's others.
    """
    book, pending = _cycle(view, jobs, serving=serving, waiting=waiting)
    pending += _outside_cycle(serving, waiting)
    verdicts: dict[str, Admission] = {}
    for p in pending:
        queue = view.local_queues.get((p.namespace, p.local_queue))
        if queue is not None:
            verdicts[p.key] = Admission(p.key, Verdict.WAIT, queue.queue)
    statuses = queue_statuses(book, verdicts)
    for name, releases in _forecast(book, jobs).items():
        if name in statuses:
            statuses[name] = statuses[name].model_copy(update={"forecast": releases})
    for name, head in _positions(view, pending, jobs, first=PENDING_HEAD).items():
        if name in statuses:
            statuses[name] = statuses[name].model_copy(update={"pending_head": head})
    return statuses


def _still_waiting(
    serving: Sequence[AdmittedWorkload], waiting: Sequence[ServingWait]
) -> list[ServingWait]:
    """The `waiting` serving workloads that hold no quota (none of their pods exist)."""
    held = {w.key for w in serving}
    return [w for w in waiting if w.workload.key not in held]


def _outside_cycle(
    serving: Sequence[AdmittedWorkload], waiting: Sequence[ServingWait]
) -> list[PendingWorkload]:
    """The still waiting serving workloads the admission cycle leaves out (no demand said)."""
    return [w.workload for w in _still_waiting(serving, waiting) if not w.workload.alternatives]


PENDING_HEAD = 10
"""Pending workloads a Queue's status lists at most (the first in admission order)."""
REASON_CHARS = 128
"""A listed workload's reason is cut to this (`QueuedWorkload.reason`'s limit)."""


def pending_order(
    view: QuotaView,
    jobs: Sequence[Mapping[str, Any]],
    serving: Sequence[AdmittedWorkload] = (),
    waiting: Sequence[ServingWait] = (),
) -> dict[str, list[QueuedWorkload]]:
    """Per Queue, every pending workload with its position, in admission order.

    The order is the one each admission cycle walks (`queueing.queue_key`:
    priority, then deadline, then age), so position 1 is considered first; under
    BestEffortFIFO a job further back still starts first when it fits and those
    ahead do not. A job whose LocalQueue or Queue does not exist is in no Queue.
    The `waiting` serving workloads that hold nothing are placed as in `queue_report`.
    """
    _, pending = _cycle(view, jobs, serving=serving, waiting=waiting)
    return _positions(view, pending + _outside_cycle(serving, waiting), jobs)


def _positions(
    view: QuotaView,
    pending: Sequence[PendingWorkload],
    jobs: Sequence[Mapping[str, Any]],
    first: int | None = None,
) -> dict[str, list[QueuedWorkload]]:
    """Per Queue its pending workloads with their positions (only the `first` if given)."""
    wanted = {p.key for p in pending}
    reasons: dict[str, str | None] = {}
    starts: dict[str, datetime | None] = {}
    for job in jobs:
        key = _key(job)
        if key in wanted:
            status = job.get("status") or {}
            starts[key] = parse_time(status.get("predictedStartTime"))
            conditions = status.get("conditions") or []
            reasons[key] = next(
                (
                    str(c["reason"])[:REASON_CHARS]
                    for c in conditions
                    if c.get("type") == "Schedulable" and c.get("reason")
                ),
                None,
            )
    for p in pending:
        if p.key not in reasons:  # not a TrainingJob: a serving workload quota holds back
            reasons[p.key] = str(WaitReason.QUOTA_EXCEEDED)
    out: dict[str, list[QueuedWorkload]] = {}
    local: Counter[tuple[str, str]] = Counter()
    for p in pending:
        queue = view.local_queues.get((p.namespace, p.local_queue))
        if queue is None or queue.queue not in view.queues:
            continue
        local[(p.namespace, p.local_queue)] += 1
        queued = out.setdefault(queue.queue, [])
        if first is not None and len(queued) >= first:
            continue
        queued.append(
            QueuedWorkload(
                workload=p.key,
                local_queue=p.local_queue,
                priority=p.priority,
                position=len(queued) + 1,
                local_queue_position=local[(p.namespace, p.local_queue)],
                reason=reasons.get(p.key),
                predicted_start_time=starts.get(p.key),
            )
        )
    return out


def local_queue_report(
    view: QuotaView,
    jobs: Sequence[Mapping[str, Any]],
    serving: Sequence[AdmittedWorkload] = (),
    waiting: Sequence[ServingWait] = (),
) -> dict[tuple[str, str], tuple[int, int, str | None]]:
    """Per LocalQueue: (admitted jobs, pending workloads, why it is inactive or None).

    Jobs count as in `queue_report`; `waiting` serving workloads that hold
    nothing count as pending. Serving workloads that hold quota count in their
    Queue's `admittedWorkloads` only (their LocalQueue is a pod label, not kept
    in the accounting). A LocalQueue is inactive while the Queue it names does
    not exist.
    """
    counts: dict[tuple[str, str], list[int]] = {key: [0, 0] for key in view.local_queues}
    for job, spec in _live(jobs):
        meta = job.get("metadata") or {}
        status = job.get("status") or {}
        key = (str(meta.get("namespace")), spec.queue)
        if key in counts:
            counts[key][0 if status.get("phase") in HOLDING else 1] += 1
    for w in _still_waiting(serving, waiting):
        at = (w.workload.namespace, w.workload.local_queue)
        if at in counts:
            counts[at][1] += 1
    out: dict[tuple[str, str], tuple[int, int, str | None]] = {}
    for key, (admitted, pending) in counts.items():
        target = view.local_queues[key].queue
        inactive = None if target in view.queues else f"Queue {target} does not exist"
        out[key] = (admitted, pending, inactive)
    return out
