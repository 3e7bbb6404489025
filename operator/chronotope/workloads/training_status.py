"""TrainingJob status from its decision and its worker pods (pure).

Status is always recomputed from what the cluster shows (bound pods are the
truth), so an operator restart loses nothing: the next reconcile derives the
same phase, placement and reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from chronotope.workloads.training import Action, Decision

__all__ = ["condition", "merge_conditions", "pods_status", "waiting_status"]


def condition(
    kind: str, ok: bool, reason: str, message: str, *, now: datetime, generation: int | None
) -> dict[str, Any]:
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


def waiting_status(decision: Decision, now: datetime, generation: int | None) -> dict[str, Any]:
    """Status for a job that is not running: why it waits, or why it never can."""
    impossible = decision.action is Action.IMPOSSIBLE
    return {
        "phase": "Pending" if impossible else "Waiting",
        "whyWaiting": decision.reason,
        "replicas": 0,
        "placement": [],
        "conditions": [
            condition(
                "Schedulable",
                not impossible,
                (decision.cause or "Unschedulable") if impossible else "WaitingForGPUs",
                decision.reason,
                now=now,
                generation=generation,
            ),
            condition(
                "Running", False, "NotStarted", decision.reason, now=now, generation=generation
            ),
        ],
    }


def _pod_waiting_reason(pod: Mapping[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "not scheduled yet")
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
            waiting = waiting or _pod_waiting_reason(pod)
        if (pod.get("status") or {}).get("phase") == "Running":
            running += 1
    workers = int(plan.get("workers", len(pods)))
    all_running = running == workers and len(pods) == workers
    why = None
    if not all_running:
        why = waiting or f"{len(placement)} of {workers} worker(s) placed, {running} running"
    return {
        "phase": "Running" if all_running else "Starting",
        "whyWaiting": why,
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
