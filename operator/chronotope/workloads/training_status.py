"""TrainingJob status from its decision and its worker pods (pure).

Status is always recomputed from what the cluster shows (bound pods are the
truth), so an operator restart loses nothing: the next reconcile derives the
same phase, placement and reasons.

Every status below sets both conditions (Schedulable and Running) from one
reason, so that merging it over an older status (conditions are merged by
type) never leaves a condition from an earlier phase behind: a job that
started cannot keep a "NotStarted" condition that still says why it waited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from chronotope.api.v1alpha1.trainingjob import WHY_WAITING_MAX
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.parallelism import Degrees
from chronotope.workloads.replan import completed_fraction, parse_time
from chronotope.workloads.training import Decision

__all__ = [
    "QUOTA_RESERVED",
    "capped_why",
    "condition",
    "decided_phase",
    "merge_conditions",
    "pod_unplaced",
    "pod_waiting_reason",
    "pods_status",
    "queued_since",
    "resizing_status",
    "started_status",
    "unplaced_reason",
    "waiting_status",
]


QUOTA_RESERVED = "QuotaReserved"
"""The condition type that says whether the job's queue's quota admits it (Kueue's name)."""


def condition(
    kind: str, ok: bool, reason: str, message: str, *, now: datetime, generation: int | None
) -> dict[str, Any]:
    """A status condition of type `kind`, stamped with `now` and the observed generation."""
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message[:32_000],
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "observedGeneration": generation,
    }


def merge_conditions(
    old: Sequence[Mapping[str, Any]], new: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Replace conditions by type, keeping lastTransitionTime when the status did not change."""
    by_type = {c.get("type"): dict(c) for c in old}
    for cond in new:
        prev = by_type.get(cond["type"])
        kept = cond
        if prev is not None and prev.get("status") == cond["status"]:
            kept = cond | {"lastTransitionTime": prev.get("lastTransitionTime")}
        by_type[cond["type"]] = kept
    return [c for c in by_type.values() if c.get("type")]


def queued_since(job: Mapping[str, Any]) -> datetime | None:
    """When the job last joined the queue: when it last stopped running, else its creation.

    That is the `Running` condition's `lastTransitionTime` while it is `False`
    (set at the first waiting status, kept while the job does not run, moved
    when a running gang is stopped), as Kueue measures admission wait from a
    workload's creation or its last requeue.
    """
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Running" and cond.get("status") == "False":
            since = parse_time(cond.get("lastTransitionTime"))
            if since is not None:
                return since
    return parse_time((job.get("metadata") or {}).get("creationTimestamp"))


def capped_why(why: str) -> str:
    """`why` cut to the CRD's maxLength: a longer reason would fail the status write."""
    return why if len(why) <= WHY_WAITING_MAX else why[: WHY_WAITING_MAX - 3] + "..."


def decided_phase(decision: Decision) -> str:
    """The phase a decision gives a job: Starting, Waiting, or Pending (it never can start)."""
    why = decision.why
    if why is None:
        return "Starting"
    return "Pending" if why.unresolvable else "Waiting"


def waiting_status(decision: Decision, now: datetime, generation: int | None) -> dict[str, Any]:
    """Status for a job that is not running: why it waits, or why it never can."""
    why = decision.why
    assert why is not None, "a START has no waiting status"
    return {
        "phase": decided_phase(decision),
        "whyWaiting": capped_why(why.message),
        "predictedStartTime": _iso(decision.start) if decision.start is not None else None,
        "replicas": 0,
        "placement": [],
        "conditions": [
            condition(
                "Schedulable",
                not why.unresolvable,
                why.code,
                why.message,
                now=now,
                generation=generation,
            ),
            condition("Running", False, "NotStarted", why.message, now=now, generation=generation),
        ],
    }


def pod_waiting_reason(pod: Mapping[str, Any]) -> str | None:
    """Why kube-scheduler has not placed `pod` (its `PodScheduled=False` message), or None."""
    unplaced = pod_unplaced(pod)
    return None if unplaced is None else unplaced[0]


def pod_unplaced(pod: Mapping[str, Any]) -> tuple[str, datetime | None] | None:
    """kube-scheduler's reason for not placing `pod`, and since when; None if it did not say.

    From the pod's `PodScheduled=False` condition (its message, and its
    `lastTransitionTime`: None when the condition states none).
    """
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            why = str(cond.get("message") or cond.get("reason") or "not scheduled yet")
            return why, parse_time(cond.get("lastTransitionTime"))
    return None


def unplaced_reason(
    pods: Iterable[Mapping[str, Any]],
    *,
    now: datetime | None = None,
    longer_than_s: float = 0.0,
) -> str | None:
    """kube-scheduler's reason for the first of `pods` it has not placed, or None.

    Bound pods and pods being deleted are skipped. With `now`, only a pod unplaced
    for over `longer_than_s` (since its condition's `lastTransitionTime`) counts.
    """
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") or (pod.get("metadata") or {}).get(
            "deletionTimestamp"
        ):
            continue
        unplaced = pod_unplaced(pod)
        if unplaced is None:
            continue
        why, since = unplaced
        if now is not None and (since is None or (now - since).total_seconds() <= longer_than_s):
            continue
        return why
    return None


def pods_status(
    pods: Sequence[Mapping[str, Any]],
    plan: Mapping[str, Any],
    now: datetime,
    generation: int | None,
) -> dict[str, Any]:
    """Status for a gang that was started: Starting until every worker runs, then Running."""
    placement = []
    running = 0
    waiting = None
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        node = (pod.get("spec") or {}).get("nodeName")
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if node:
            gpus = annotations.get("chronotope.dev/assigned-gpus", "")
            placement.append(
                {
                    "pod": pod["metadata"]["name"],
                    "node": node,
                    "gpus": [g for g in gpus.split(",") if g],
                }
            )
        else:
            waiting = waiting or pod_waiting_reason(pod)
        if (pod.get("status") or {}).get("phase") == "Running":
            running += 1
    workers = int(plan.get("workers", len(pods)))
    all_running = running == workers and len(pods) == workers
    why = None
    if not all_running:
        why = waiting or f"{len(placement)} of {workers} worker(s) placed, {running} running"
    out = {
        "phase": "Running" if all_running else "Starting",
        "whyWaiting": None if why is None else capped_why(why),
        "replicas": len(placement),
        "placement": placement,
        "conditions": [
            condition(
                "Schedulable",
                True,
                "GangPlaced" if len(placement) == workers else "GangPlacing",
                why or "all workers placed",
                now=now,
                generation=generation,
            ),
            condition(
                "Running",
                all_running,
                "AllWorkersRunning" if all_running else "WorkersStarting",
                why or f"{running} worker(s) running",
                now=now,
                generation=generation,
            ),
        ],
    }
    if len(placement) == workers:  # the gang is placed: the nodes it avoided are open again
        out["avoidNodes"] = None
    return out


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parallelism(degrees: Degrees) -> dict[str, Any]:
    out: dict[str, Any] = {
        "data": degrees.data,
        "tensor": degrees.tensor,
        "pipeline": degrees.pipeline,
    }
    if degrees.micro_batch_size is not None:
        out["microBatchSize"] = degrees.micro_batch_size
    return out


def _degrees_text(d: Degrees) -> str:
    text = f"data {d.data} x tensor {d.tensor} x pipeline {d.pipeline}"
    return text + (f", microbatch {d.micro_batch_size}" if d.micro_batch_size else "")


def started_status(
    name: str,
    decision: Decision,
    degrees: Degrees,
    now: datetime,
    generation: int | None,
    *,
    replicas: int,
) -> dict[str, Any]:
    """Status of job `name` whose gang was just created for `decision` (a START).

    `replicas` is the spec.replicas the plan is for (`plannedForReplicas`).
    """
    assert decision.finish is not None
    return {
        "phase": decided_phase(decision),
        "whyWaiting": None,
        "predictedStartTime": None,
        "selector": f"{JOB_LABEL}={name}",
        "plan": {
            "gpuType": decision.gpu_type,
            "workers": decision.workers,
            "plannedForReplicas": replicas,
            "totalGpus": decision.workers * decision.gpus_per_worker,
            "parallelism": _parallelism(degrees),
            "startTime": _iso(now),
            "predictedCompletionTime": _iso(decision.finish),
            "expectedUtility": decision.utility,
            "predictedSamplesPerSecond": decision.samples_per_second,
            "planner": decision.planner_note
            or "parallelism hints (no model profile): " + _degrees_text(degrees),
        },
        "conditions": [
            condition(
                "Schedulable", True, "Planned", decision.reason, now=now, generation=generation
            ),
            condition(
                "Running",
                False,
                "WorkersStarting",
                f"gang of {decision.workers} worker(s) created on {decision.gpu_type}; "
                "waiting for the workers to be placed and run",
                now=now,
                generation=generation,
            ),
        ],
    }


def resizing_status(
    status: Mapping[str, Any], why: str, now: datetime, generation: int | None = None
) -> dict[str, Any]:
    """Status of a job whose gang is being stopped to re-plan (checkpoint kept)."""
    return {
        "conditions": [
            condition("Schedulable", True, "Replanning", why, now=now, generation=generation),
            condition("Running", False, "Replanning", why, now=now, generation=generation),
            condition(
                QUOTA_RESERVED,
                False,
                "Requeued",
                "stopped to re-plan: it holds no quota until it is admitted again",
                now=now,
                generation=generation,
            ),
        ],
        "phase": "Resizing",
        "whyWaiting": capped_why(why),
        "plan": None,
        "placement": [],
        "replicas": 0,
        "restarts": int(status.get("restarts", 0)) + 1,
        "completedFraction": completed_fraction(status, now),
    }
