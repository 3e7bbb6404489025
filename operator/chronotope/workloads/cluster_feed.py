"""Node and pod objects into the one cluster model (`solver.cache.ClusterCache`).

The extender's watch and the operator's capacity view read the same objects
the same way: a node's GPU model and count, GPU memory, allocatable CPU and
memory; a bound pod's assignment annotations, or, for a pod bound without one,
its whole GPUs by count and its CPU and memory requests. Only the `chronotope`
scheduler's pods have their assignment read (`scheduler_assignment`): the
admission policy lets only the scheduler write assignments (docs/security.md),
and a pod of any other scheduler holds whole GPUs by its requests whatever its
annotations say. An unbound pod's plan (the operator's pass wrote it) holds the GPUs
it names (`hold_planned`). Pure: plain dicts in, cache updates out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from chronotope.api.quantity import QuantityError, cpu_milli, memory_mib
from chronotope.sharing.assignment import DEVICE_PLUGIN, PRIORITIES, PROFILES, GpuAssignment
from chronotope.sharing.labels import (
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    SCHEDULER_NAME,
)
from chronotope.solver.cache import ClusterCache, Holding, NodeInfo
from chronotope.solver.model import MILLI, UNBOUNDED, PodRequest, Reason, percent_milli
from chronotope.solver.slots import DOMAIN_LABELS
from chronotope.workloads.podreq import PodRequestError, planned, pod_request

__all__ = [
    "CONDITION_TAINTS",
    "hold_planned",
    "node_info",
    "node_schedulable",
    "pod_holding",
    "scheduler_assignment",
]

log = logging.getLogger(__name__)

CONDITION_TAINTS = frozenset(
    f"node.kubernetes.io/{name}"
    for name in (
        "not-ready",
        "unreachable",
        "unschedulable",
        "network-unavailable",
        "memory-pressure",
        "disk-pressure",
        "pid-pressure",
    )
)
"""The taints Kubernetes puts on a node for its conditions (TaintNodesByCondition): while
one is on, kube-scheduler places no pod there that does not tolerate it, and worker pods
do not. A new node keeps `not-ready` for a while after it reports Ready."""


def node_schedulable(node: Mapping[str, Any]) -> bool:
    """Whether new pods can land on `node`: Ready, not cordoned, no condition taint.

    Nor being deleted. The training pass, the pipeline planner and the variant placer
    ask this.
    """
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    if spec.get("unschedulable") or meta.get("deletionTimestamp"):
        return False
    if any(
        t.get("key") in CONDITION_TAINTS and t.get("effect") in ("NoSchedule", "NoExecute")
        for t in spec.get("taints") or []
    ):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """What the cache keeps of a node object."""
    meta = node.get("metadata", {})
    labels = meta.get("labels") or {}
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or capacity

    def amount(resource: str, parse: Callable[[object], int]) -> int:
        raw = allocatable.get(resource, capacity.get(resource))
        if raw is None:
            return UNBOUNDED
        try:
            return parse(raw)
        except QuantityError:
            log.warning("node %s: %s %r is not a quantity", meta.get("name"), resource, raw)
            return UNBOUNDED

    memory = str(labels.get(GPU_MEMORY_LABEL, "0") or "0")
    return NodeInfo(
        name=meta["name"],
        gpu_model=labels.get(GPU_PRODUCT_LABEL, ""),
        gpu_count=int(capacity.get(GPU_RESOURCE, 0) or 0),
        gpu_memory_mib=int(memory) if memory.isdigit() else 0,
        cpu_milli=amount("cpu", cpu_milli),
        memory_mib=amount("memory", memory_mib),
        unschedulable=not node_schedulable(node),
        device_plugin=DEVICE_PLUGIN in (meta.get("annotations") or {}),
        topology=tuple(
            (label, str(labels[label])) for label in DOMAIN_LABELS.values() if label in labels
        ),
    )


def pod_holding(cache: ClusterCache, key: str, pod: Mapping[str, Any], node: str) -> Holding:
    """What a pod bound to `node` takes: its assignment, or whole GPUs by count."""
    try:
        req: PodRequest | None = pod_request(pod)
    except PodRequestError:
        req = None
    cpu, mem = (req.cpu_milli, req.memory_mib) if req is not None else (0, 0)
    if req is not None:
        cache.observe(key, req)  # a restarted reader relearns the request mix
    a = scheduler_assignment(pod, node)
    if a is not None:
        milli = MILLI if a.compute_percent is None else percent_milli(a.compute_percent)
        assigned = Holding(node, a.gpu_indices, milli, a.memory_mib or 0, cpu, mem)
        return _with_class(assigned, a, req)
    if req is None or req.num_gpus == 0 or req.is_share:  # no GPU we know of
        return Holding(node, (), 0, 0, cpu, mem)
    held = cache.holdings.get(key)
    if held is not None and held.node == node and len(held.gpu_indices) == req.num_gpus:
        gpus = held.gpu_indices
    else:
        gpus = cache.first_free(node, req.num_gpus)
        if len(gpus) < req.num_gpus:
            log.warning(
                "pod %s holds %d GPUs on %s, only %d are free there",
                key,
                req.num_gpus,
                node,
                len(gpus),
            )
    return Holding(node, gpus, MILLI, 0, cpu, mem)


def hold_planned(cache: ClusterCache, key: str, pod: Mapping[str, Any], now: float = 0.0) -> bool:
    """Hold, as `key`, the node and GPUs an unbound pod's plan names, if they still fit.

    A pod the operator's pass placed carries its plan; until it binds, those GPUs
    are its own to the operator's next pass and to the extender's other placements.
    Only a pod of the `chronotope` scheduler that is not being deleted holds: no
    other scheduler's pod ever reaches the extender to end its hold.
    """
    if (pod.get("spec") or {}).get("schedulerName") != SCHEDULER_NAME:
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    try:
        plan = planned(pod)
        if plan is None or plan.node not in cache.nodes:
            return False  # most pods: no plan, and no request to read
        req = pod_request(pod)
    except PodRequestError:
        return False
    return not isinstance(cache.assume(key, plan.node, req, now, plan.gpus), Reason)


def scheduler_assignment(pod: Mapping[str, Any], node: str) -> GpuAssignment | None:
    """The GPU assignment the scheduler made for `pod` on `node`; None when it counts for nothing.

    Pure. None for a pod of another scheduler (its annotations are not ours to
    trust: it holds whole GPUs by its requests), for a pod without a readable
    assignment, and for one whose assignment names another node.
    """
    if (pod.get("spec") or {}).get("schedulerName") != SCHEDULER_NAME:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        a = GpuAssignment.from_annotations(annotations)
    except ValueError:
        return None
    return a if a.node == node else None


def _with_class(held: Holding, a: GpuAssignment, req: PodRequest | None) -> Holding:
    """A share's priority and profile: as assigned (the decision), else as the pod asks."""
    if a.priority is not None:
        return replace(
            held, priority=PRIORITIES[a.priority], profile=PROFILES[a.profile or "unknown"]
        )
    if req is not None and req.is_share:
        return replace(held, priority=req.gpu_priority, profile=req.gpu_profile)
    return held
