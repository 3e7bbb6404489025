"""What a pod asks of GPUs, read from its spec and annotations (pure).

Whole GPUs: `resources.limits["nvidia.com/gpu"]: N`.
A GPU share: `resources.limits["chronotope.dev/gpu-share"]: 1` plus the
sharing annotations (memory MiB, compute percent) defined by the API.
The share annotations and their parser are the API's
(`chronotope.api.annotations`), one definition for pods and custom resources.
Allowed GPU models come from the pod's `nodeSelector` on
`nvidia.com/gpu.product` (or the `chronotope.dev/gpu-models` annotation,
a comma list) so kube-scheduler and the extender agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chronotope.api.annotations import (
    GPU_COMPUTE_PERCENT,
    GPU_MEMORY_MIB,
    AnnotationError,
    parse_gpu_share,
)
from chronotope.extender.ledger import MILLI, GpuRequest
from chronotope.sharing.labels import GPU_PRODUCT_LABEL, GPU_RESOURCE, SHARE_RESOURCE

__all__ = [
    "GPU_MODELS_ANNOTATION",
    "GPU_RESOURCE",
    "PLANNED_GPUS_ANNOTATION",
    "PLANNED_NODE_ANNOTATION",
    "SHARE_COMPUTE_ANNOTATION",
    "SHARE_MEMORY_ANNOTATION",
    "SHARE_RESOURCE",
    "Plan",
    "PodRequestError",
    "planned",
    "pod_gpu_request",
]

SHARE_MEMORY_ANNOTATION = GPU_MEMORY_MIB
SHARE_COMPUTE_ANNOTATION = GPU_COMPUTE_PERCENT
GPU_MODELS_ANNOTATION = "chronotope.dev/gpu-models"
PLANNED_NODE_ANNOTATION = "chronotope.dev/planned-node"
PLANNED_GPUS_ANNOTATION = "chronotope.dev/planned-gpus"


class PodRequestError(ValueError):
    """The pod's GPU request is malformed; the message names the field."""


def _int(value: Any, where: str, low: int, high: int) -> int:
    try:
        number = int(str(value))
    except ValueError as exc:
        raise PodRequestError(f"{where}: {value!r} is not an integer") from exc
    if not low <= number <= high:
        raise PodRequestError(f"{where}: {number} is outside {low}..{high}")
    return number


def _limits(pod: Mapping[str, Any], resource: str) -> int:
    total = 0
    for container in pod.get("spec", {}).get("containers", []) or []:
        res = container.get("resources") or {}
        value = (res.get("limits") or {}).get(resource, (res.get("requests") or {}).get(resource))
        if value is not None:
            total += _int(
                value, f"containers[{container.get('name', '?')}].resources.{resource}", 0, 64
            )
    return total


def pod_gpu_request(pod: Mapping[str, Any]) -> GpuRequest | None:
    """The pod's GPU request, or None for a pod that asks for no GPU."""
    annotations: Mapping[str, str] = pod.get("metadata", {}).get("annotations") or {}
    whole = _limits(pod, GPU_RESOURCE)
    shares = _limits(pod, SHARE_RESOURCE)
    models = _models(pod, annotations)
    if whole and shares:
        raise PodRequestError(f"a pod asks for either {GPU_RESOURCE} or {SHARE_RESOURCE}, not both")
    if whole:
        return GpuRequest(count=whole, models=models)
    if not shares:
        return None
    if shares != 1:
        raise PodRequestError(f"{SHARE_RESOURCE}: a pod shares exactly one GPU, asked {shares}")
    try:
        share = parse_gpu_share(annotations)
    except AnnotationError as exc:
        raise PodRequestError(f"metadata.annotations[{exc.key}]: {exc.message}") from exc
    if share is None:
        raise PodRequestError(
            f"metadata.annotations[{SHARE_MEMORY_ANNOTATION}] is required for a GPU share"
        )
    return GpuRequest(
        count=1,
        share_milli=share.compute_percent * MILLI // 100,
        memory_mib=share.memory_mib,
        models=models,
    )


def _models(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> tuple[str, ...]:
    selector = (pod.get("spec", {}).get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
    if selector:
        return (str(selector),)
    listed = annotations.get(GPU_MODELS_ANNOTATION, "")
    return tuple(m.strip() for m in listed.split(",") if m.strip())


@dataclass(frozen=True)
class Plan:
    """Where the batch planner put this pod: a node and, optionally, exact GPUs."""

    node: str
    gpus: tuple[int, ...] | None


def planned(pod: Mapping[str, Any]) -> Plan | None:
    """The batch plan written on the pod by a controller, or None (online placement)."""
    annotations: Mapping[str, str] = pod.get("metadata", {}).get("annotations") or {}
    node = annotations.get(PLANNED_NODE_ANNOTATION, "").strip()
    if not node:
        return None
    raw = annotations.get(PLANNED_GPUS_ANNOTATION, "").strip()
    if not raw:
        return Plan(node, None)
    try:
        gpus = tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise PodRequestError(
            f"metadata.annotations[{PLANNED_GPUS_ANNOTATION}]: {raw!r} is not a list of indices"
        ) from None
    return Plan(node, gpus)
