"""What GPUs the cluster has, and which are free, from plain node and pod objects.

Bound pods are the truth: a GPU is taken when a live pod's assignment
annotations name it (whole GPUs and shares alike); pods bound by another
scheduler without annotations take `nvidia.com/gpu` GPUs by count. Workers
created for a gang but not yet bound are promised GPUs of their type, so two
jobs decided in a row do not both count on the same free GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from chronotope.sharing.assignment import ASSIGNED_GPUS, ASSIGNED_NODE
from chronotope.sharing.labels import (
    DONE_PHASES,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    ZONE_LABEL,
)

__all__ = ["NodeCapacity", "cluster_capacity"]


@dataclass(frozen=True)
class NodeCapacity:
    name: str
    gpu_model: str
    total: int
    free: int
    schedulable: bool
    memory_mib: int = 0
    """Memory of one GPU (the `nvidia.com/gpu.memory` label); 0 when unknown."""
    zone: str = ""


def _gpu_count(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        total += int(str(limits.get(GPU_RESOURCE, 0)) or 0)
    return total


def cluster_capacity(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    ignore_pods: frozenset[str] = frozenset(),
) -> list[NodeCapacity]:
    """Per node: GPU model, total and free whole GPUs. `ignore_pods` ("ns/name") count as free."""
    used: dict[str, set[int]] = {}
    unannotated: dict[str, int] = {}
    promised: dict[str, int] = {}  # GPU model -> GPUs of created but not yet bound workers
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if key in ignore_pods or (pod.get("status") or {}).get("phase") in DONE_PHASES:
            continue
        if meta.get("deletionTimestamp"):
            continue
        if not node:
            model = (spec.get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
            if model and spec.get("schedulerName") == "chronotope":
                promised[model] = promised.get(model, 0) + max(1, _gpu_count(pod))
            continue
        annotations = meta.get("annotations") or {}
        gpus = annotations.get(ASSIGNED_GPUS)
        if gpus and annotations.get(ASSIGNED_NODE) == node:
            used.setdefault(node, set()).update(int(g) for g in gpus.split(",") if g.strip())
        else:
            unannotated[node] = unannotated.get(node, 0) + _gpu_count(pod)
    out: list[NodeCapacity] = []
    for node in nodes:
        meta = node.get("metadata") or {}
        name = meta["name"]
        total = int(
            str(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, 0)) or 0
        )
        if total == 0:
            continue
        free = max(0, total - len(used.get(name, set())) - unannotated.get(name, 0))
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (node.get("status") or {}).get("conditions") or []
        )
        labels = meta.get("labels") or {}
        memory = str(labels.get(GPU_MEMORY_LABEL, "0"))
        out.append(
            NodeCapacity(
                name=name,
                gpu_model=labels.get(GPU_PRODUCT_LABEL, ""),
                total=total,
                free=free,
                schedulable=ready and not (node.get("spec") or {}).get("unschedulable", False),
                memory_mib=int(memory) if memory.isdigit() else 0,
                zone=labels.get(ZONE_LABEL, ""),
            )
        )
    return _minus_promised(out, promised)


def _minus_promised(nodes: list[NodeCapacity], promised: dict[str, int]) -> list[NodeCapacity]:
    """Treat GPUs promised to started-but-unbound gangs as taken (largest free nodes first)."""
    result = []
    left = dict(promised)
    for node in sorted(nodes, key=lambda n: -n.free):
        take = min(node.free, left.get(node.gpu_model, 0))
        if take:
            left[node.gpu_model] -= take
        result.append(replace(node, free=node.free - take))
    return result
