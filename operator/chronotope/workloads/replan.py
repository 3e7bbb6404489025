"""Whether a running elastic gang should be re-planned because availability changed (pure).

SAILOR re-plans when GPUs come or go. Losing workers is handled as a fault
(the gang restarts smaller); this module decides the other direction and
cordons: a running job below its wanted size restarts bigger (or on a faster
type) when GPUs became free, and a job with a worker on a cordoned node moves
off it, both through checkpoint-restart. A restart costs time, so a bigger
plan is taken only when it finishes clearly earlier than staying put.

And the nodes a stuck gang's next plans avoid (`avoid_after_stuck`): the nodes
where kube-scheduler left its workers unbound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.capacity import Capacity, admitting
from chronotope.workloads.node_fit import job_rules, next_avoid
from chronotope.workloads.podreq import PodRequestError, planned
from chronotope.workloads.training import Action, Decision

__all__ = [
    "RESTART_COST",
    "avoid_after_stuck",
    "better_plan",
    "completed_fraction",
    "parse_time",
    "progress",
    "remaining_work",
]

RESTART_COST = timedelta(seconds=60)
"""Checkpoint, stop and restart of a gang (a conservative guess)."""
MIN_GAIN = 0.10
"""A new plan must save at least this share of the remaining time (and the restart)."""


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as Kubernetes writes it (`...Z`), or None when empty."""
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def remaining_work(status: Mapping[str, Any]) -> float:
    """Share of the job's work still to do, from `status.completedFraction`."""
    return 1.0 - float(status.get("completedFraction") or 0.0)


def better_plan(plan: Mapping[str, Any], candidate: Decision, now: datetime) -> str | None:
    """Why `candidate` (decided as if the gang's GPUs were free) beats the running `plan`.

    Returns None when staying put is as good. The running plan's progress is
    read from its start and predicted completion; the candidate's duration is
    for the whole job, so it is scaled to the work that is left.
    """
    if candidate.action is not Action.START or candidate.finish is None:
        return None
    start, finish = (
        parse_time(plan.get("startTime")),
        parse_time(plan.get("predictedCompletionTime")),
    )
    if start is None or finish is None or finish <= now:
        return None
    old_full = (finish - start).total_seconds()
    new_full = (candidate.finish - now).total_seconds()
    if old_full <= 0:
        return None
    left = (finish - now).total_seconds()
    new_finish = now + RESTART_COST + timedelta(seconds=left * new_full / old_full)
    saved = (finish - new_finish).total_seconds()
    if saved <= MIN_GAIN * left:
        return None
    return (
        f"{candidate.workers} worker(s) on {candidate.gpu_type} are free now "
        f"(running: {plan.get('workers')} on {plan.get('gpuType')}); restarting from the "
        f"checkpoint finishes about {saved / 60:.0f} min earlier"
    )


def progress(status: Mapping[str, Any], now: datetime) -> float:
    """Share of the *estimated* work done so far, uncapped (above 1 past the estimate).

    The earlier share plus the running plan's elapsed share of the rest.
    """
    before = 1.0 - remaining_work(status)
    plan = status.get("plan") or {}
    start, finish = plan.get("startTime"), plan.get("predictedCompletionTime")
    if status.get("phase") != "Running" or not start or not finish:
        return before
    t0, t1 = parse_time(start), parse_time(finish)
    assert t0 is not None
    assert t1 is not None
    span = (t1 - t0).total_seconds()
    if span <= 0:
        return before
    share = max(0.0, (now - t0).total_seconds() / span)
    return before + (1.0 - before) * share


def completed_fraction(status: Mapping[str, Any], now: datetime) -> float:
    """Work done so far as status shows it: `progress`, at most 0.99 until the job ends."""
    return round(min(0.99, progress(status, now)), 4)


def avoid_after_stuck(
    status: Mapping[str, Any],
    gang: Iterable[Mapping[str, Any]],
    spec: TrainingJobSpec,
    capacity: Capacity,
) -> list[str]:
    """The nodes a job's next plans leave out, its gang having stayed unbound too long.

    The nodes its unbound workers were planned on (`planned-node`) join those it
    avoided already (`status.avoidNodes`): kube-scheduler did not bind them there
    for a reason the plan does not model (a host port taken, pod anti-affinity, a
    volume in another zone), and planning there again would wait the same way.
    `spec` is the job's spec as written (`job_spec(..., as_written=True)`): the
    schedulable nodes of its GPU types that its rules admit bound the list
    (`node_fit.next_avoid`).
    """
    stuck = []
    for pod in gang:
        if (pod.get("spec") or {}).get("nodeName"):
            continue
        try:
            where = planned(pod)
        except PodRequestError:
            continue
        if where is not None:
            stuck.append(where.node)
    rules, per_worker = job_rules(spec), spec.gpu.count or 1
    usable = [
        n.name
        for t in spec.gpu_types
        for n in admitting(capacity, t.name, rules, per_worker).nodes
        if n.schedulable  # a cordoned or NotReady node is no way out now
    ]
    return next_avoid(map(str, status.get("avoidNodes") or []), stuck, usable)
