"""Which running jobs to preempt so a more important job can start (pure).

A waiting job may preempt running jobs that are marked preemptible and have a
lower priority, cheapest first (lowest priority, then fewest GPUs), adding
victims one at a time until the job fits, then sparing every victim it fits
without (most important first: kube-scheduler's reprieve); if it would not fit
even with every candidate gone, nobody is preempted. Victims are stopped gracefully by the
caller (checkpoint annotation, then SIGTERM with a grace period) and re-queue.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.capacity import (
    NO_FACTS,
    Capacity,
    ClusterFacts,
    cluster_capacity,
    cluster_without,
)
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.profiled import ProfilePlanner
from chronotope.workloads.training import Action, Decision, decide

__all__ = ["Preemption", "capacity_without", "plan_preemption"]


@dataclass(frozen=True)
class Preemption:
    """The jobs to stop (`namespace/name` of TrainingJobs) and the decision that follows."""

    victims: tuple[str, ...]  # "namespace/name" of TrainingJobs
    decision: Decision


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def plan_preemption(
    me: str,
    spec: TrainingJobSpec,
    jobs: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    *,
    now: datetime,
    planner: ProfilePlanner | None = None,
    facts: ClusterFacts = NO_FACTS,
    read: Capacity | None = None,
) -> Preemption | None:
    """The fewest, cheapest victims that let `spec` start now, or None.

    `facts`: what the cluster holds beyond its nodes and pods (`capacity.ClusterFacts`).
    `read`: `cluster_capacity` of the nodes and pods, when known (`capacity_without`).
    """
    types = {t.name for t in spec.gpu_types}
    candidates = []
    for job in jobs:
        job_spec = job.get("spec") or {}
        plan = (job.get("status") or {}).get("plan") or {}
        if (
            _key(job) == me
            or not job_spec.get("preemptible", False)
            or int(job_spec.get("priority", 0)) >= spec.priority
            or plan.get("gpuType") not in types
        ):
            continue
        candidates.append((int(job_spec.get("priority", 0)), float(plan.get("totalGpus", 0)), job))
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1]))
    without = partial(
        _decided_without,
        spec,
        nodes=nodes,
        pods=pods,
        now=now,
        planner=planner,
        facts=facts,
        read=read,
    )
    chosen: list[str] = []
    for _, _, job in candidates:
        chosen.append(_key(job))
        decision = without(chosen)
        if decision.action is not Action.START:
            continue
        # kube-scheduler's reprieve: an early (cheap) victim may free GPUs the job cannot
        # use (on a node its pods may not go to, or too few on its node) while a later
        # one made the fit; spare every victim it starts without, most important first
        for key in reversed(list(chosen)):
            rest = [k for k in chosen if k != key]
            spared = without(rest)
            if spared.action is Action.START:
                chosen, decision = rest, spared
        return Preemption(tuple(chosen), decision)
    return None


def _decided_without(
    spec: TrainingJobSpec,
    victims: Collection[str],
    *,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    now: datetime,
    planner: ProfilePlanner | None = None,
    facts: ClusterFacts = NO_FACTS,
    read: Capacity | None = None,
) -> Decision:
    """`spec`'s start decision on the cluster with the pods of TrainingJobs `victims` gone."""
    capacity = capacity_without(victims, nodes=nodes, pods=pods, facts=facts, read=read)
    return decide(spec, capacity, now, planner=planner)


def capacity_without(
    victims: Collection[str],
    *,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    facts: ClusterFacts = NO_FACTS,
    read: Capacity | None = None,
) -> Capacity:
    """The cluster's capacity with the pods of TrainingJobs `victims` gone.

    `victims`: `namespace/name` of TrainingJobs (their workers carry `JOB_LABEL`).
    `read`: the cluster's capacity with every pod, when known (`cluster_capacity` of
    the same nodes, pods and facts): then only the victims' nodes are read again
    (`capacity.cluster_without`).
    """
    ignored = frozenset(
        _key(pod)
        for pod in pods
        if (owner := ((pod.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL))
        and f"{pod['metadata'].get('namespace')}/{owner}" in victims
    )
    if read is not None:
        return cluster_without(read, ignored, nodes, pods, facts)
    return cluster_capacity(nodes, pods, ignore_pods=ignored, facts=facts)
