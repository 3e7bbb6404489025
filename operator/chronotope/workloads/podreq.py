"""What a pod asks of GPUs, read from its spec and annotations (pure).

Whole GPUs: `resources.limits["nvidia.com/gpu"]: N`.
A GPU share: `resources.limits["chronotope.dev/gpu-share"]: 1` plus the
sharing annotations (memory MiB, compute percent) defined by the API.
The share annotations and their parser are the API's
(`chronotope.api.annotations`), one definition for pods and custom resources.
Allowed GPU models come from the pod's `nodeSelector` on
`nvidia.com/gpu.product` (or the `chronotope.dev/gpu-models` annotation,
a comma list) so kube-scheduler and the extender agree.

A share's priority and profile (`chronotope.dev/gpu-priority`,
`gpu-profile`) ride on the request for the co-location rules. A profile that
does not parse is bad input that must not cost the pod its placement: the
request falls back to the unknown profile (the conservative stand-in), and
`profile_warning` says so for the caller to log and post as an event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chronotope.api.annotations import (
    GPU_COMPUTE_PERCENT,
    GPU_MEMORY_MIB,
    GPU_PRIORITY,
    GPU_PROFILE,
    AnnotationError,
    parse_gpu_share,
    to_annotations,
)
from chronotope.api.quantity import QuantityError, base_units, cpu_milli, memory_mib
from chronotope.api.v1alpha1.common import GpuShare
from chronotope.sharing.labels import GPU_PRODUCT_LABEL, GPU_RESOURCE, SHARE_RESOURCE
from chronotope.solver.model import MILLI, PodRequest, percent_milli

__all__ = [
    "GPU_MODELS_ANNOTATION",
    "GPU_RESOURCE",
    "GPU_RESOURCES",
    "PLANNED_GANG_ANNOTATION",
    "PLANNED_GPUS_ANNOTATION",
    "PLANNED_NODE_ANNOTATION",
    "SHARE_COMPUTE_ANNOTATION",
    "SHARE_MEMORY_ANNOTATION",
    "SHARE_RESOURCE",
    "PlannedPlacement",
    "PodRequestError",
    "extra_requests",
    "gang_plan_annotation",
    "gpu_resources",
    "planned",
    "planned_gang",
    "pod_gpu_request",
    "pod_key",
    "pod_request",
    "pod_requests",
    "pod_resources",
    "profile_warning",
    "replica_pod",
    "resource_amount",
]

SHARE_MEMORY_ANNOTATION = GPU_MEMORY_MIB
SHARE_COMPUTE_ANNOTATION = GPU_COMPUTE_PERCENT
GPU_MODELS_ANNOTATION = "chronotope.dev/gpu-models"
PLANNED_NODE_ANNOTATION = "chronotope.dev/planned-node"
PLANNED_GPUS_ANNOTATION = "chronotope.dev/planned-gpus"
PLANNED_GANG_ANNOTATION = "chronotope.dev/planned-gang"
"""Every member's planned node and GPUs, in rank order, on each member of a gang:
`node=0,1;node=2,3` (the extender reserves the whole gang there, or nowhere)."""


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


def pod_key(pod: Mapping[str, Any]) -> str:
    """The pod as `namespace/name`, the key the cache holds it under."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def pod_resources(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's CPU (milli) and memory (MiB) requests (`pod_requests`)."""
    asked = pod_requests(pod)
    return asked.get("cpu", 0), asked.get("memory", 0)


GPU_RESOURCES = frozenset({GPU_RESOURCE, SHARE_RESOURCE})
"""The resources the GPU model counts itself (whole GPUs, GPU shares)."""


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Every resource the pod requests, as kube-scheduler sums them (`resource_amount`'s units).

    `k8s.io/component-helpers/resource.PodRequests`: containers add up; an init
    container that runs all along (a sidecar, `restartPolicy: Always`) adds to them
    too; any other init container runs alone beside the sidecars started before it,
    so the pod needs the larger of the sum and the largest of those; then the pod's
    `overhead` (its RuntimeClass's, set by the API server) is added. A container that
    states only limits requests its limits (the API server's default). Resources
    requested as 0 are left out.
    """
    spec = pod.get("spec") or {}

    def one(container: Mapping[str, Any], where: str) -> dict[str, int]:
        res = container.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return _amounts(asked, f"{where}[{container.get('name', '?')}].resources")

    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        _add(total, one(c, "containers"))
    side: dict[str, int] = {}
    init: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        alone = one(c, "initContainers")
        if c.get("restartPolicy") == "Always":
            _add(total, alone)
            _add(side, alone)
            alone = dict(side)
        else:
            _add(alone, side)
        for name, value in alone.items():
            init[name] = max(init.get(name, 0), value)
    for name, value in init.items():
        total[name] = max(total.get(name, 0), value)
    _add(total, _amounts(spec.get("overhead") or {}, "overhead"))
    return {name: value for name, value in total.items() if value > 0}


def extra_requests(asked: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Of `pod_requests`' answer, the resources other than CPU, memory and GPUs, sorted."""
    return tuple(
        sorted(
            (name, value)
            for name, value in asked.items()
            if name not in ("cpu", "memory") and name not in GPU_RESOURCES
        )
    )


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for name, value in more.items():
        into[name] = into.get(name, 0) + value


def resource_amount(resource: str, raw: object) -> int:
    """A quantity of `resource` as the cluster model counts it; QuantityError if it is none.

    CPU in milli-cores, memory in MiB, anything else in its base unit (bytes, devices),
    each rounded up.
    """
    if resource == "cpu":
        return cpu_milli(raw)
    if resource == "memory":
        return memory_mib(raw)
    return base_units(raw)


def _amounts(asked: Mapping[str, Any], where: str) -> dict[str, int]:
    """A resource list in `resource_amount`'s units; PodRequestError naming `where`."""
    try:
        return {str(name): resource_amount(str(name), raw) for name, raw in asked.items()}
    except QuantityError as exc:
        raise PodRequestError(f"{where}: {exc}") from None


def pod_gpu_request(pod: Mapping[str, Any]) -> PodRequest | None:
    """The pod's request (GPUs, CPU, memory), or None for a pod that asks for no GPU."""
    req = pod_request(pod)
    return req if req.num_gpus else None


def pod_request(pod: Mapping[str, Any]) -> PodRequest:
    """The pod's request: GPUs (whole or a share, allowed models), CPU and memory."""
    annotations: Mapping[str, str] = pod.get("metadata", {}).get("annotations") or {}
    whole = _limits(pod, GPU_RESOURCE)
    shares = _limits(pod, SHARE_RESOURCE)
    models = _models(pod, annotations)
    if whole and shares:
        raise PodRequestError(f"a pod asks for either {GPU_RESOURCE} or {SHARE_RESOURCE}, not both")
    cpu, mem = pod_resources(pod)
    key = pod_key(pod)
    if not whole and not shares:
        return PodRequest(name=key, cpu_milli=cpu, memory_mib=mem)
    if whole:
        return PodRequest(
            name=key,
            cpu_milli=cpu,
            memory_mib=mem,
            num_gpus=whole,
            gpu_milli=MILLI,
            gpu_models=models,
        )
    if shares != 1:
        raise PodRequestError(f"{SHARE_RESOURCE}: a pod shares exactly one GPU, asked {shares}")
    share, _ = _share(annotations)
    return PodRequest(
        name=key,
        cpu_milli=cpu,
        memory_mib=mem,
        num_gpus=1,
        gpu_milli=percent_milli(share.compute_percent),
        gpu_memory_mib=share.memory_mib,
        gpu_models=models,
        gpu_priority=share.priority,
        gpu_profile=share.profile,
    )


def _share(annotations: Mapping[str, str]) -> tuple[GpuShare, str | None]:
    """The share the annotations ask for, and a warning when its profile fell back to unknown.

    Raises `PodRequestError` for any other bad annotation (the pod cannot be placed).
    """
    warning = None
    try:
        share = parse_gpu_share(annotations)
    except AnnotationError as exc:
        if exc.key != GPU_PROFILE:
            raise PodRequestError(f"metadata.annotations[{exc.key}]: {exc.message}") from exc
        warning = f"{exc}; placed as unknown (the conservative stand-in)"
        rest = {k: v for k, v in annotations.items() if k != GPU_PROFILE}
        try:
            share = parse_gpu_share(rest)
        except AnnotationError as again:
            raise PodRequestError(f"metadata.annotations[{again.key}]: {again.message}") from again
    if share is None:
        raise PodRequestError(
            f"metadata.annotations[{SHARE_MEMORY_ANNOTATION}] is required for a GPU share"
        )
    if warning is None and GPU_PRIORITY in annotations and GPU_PROFILE not in annotations:
        warning = (
            f"annotation {GPU_PROFILE} is missing on a share with {GPU_PRIORITY}; "
            "placed as unknown (the conservative stand-in)"
        )
    return share, warning


def profile_warning(pod: Mapping[str, Any]) -> str | None:
    """Why a share's profile fell back to unknown (missing or unparsable), or None.

    Only for pods asking for a share whose other annotations parse; the message
    names the annotation. A missing profile is worth a warning only where the
    pod states a priority (it asked for co-location rules).
    """
    if not _limits(pod, SHARE_RESOURCE):
        return None
    annotations: Mapping[str, str] = pod.get("metadata", {}).get("annotations") or {}
    try:
        return _share(annotations)[1]
    except PodRequestError:
        return None


def _models(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> tuple[str, ...]:
    selector = (pod.get("spec", {}).get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
    if selector:
        return (str(selector),)
    listed = annotations.get(GPU_MODELS_ANNOTATION, "")
    return tuple(m.strip() for m in listed.split(",") if m.strip())


@dataclass(frozen=True)
class PlannedPlacement:
    """Where the batch planner put this pod: a node and, optionally, exact GPUs."""

    node: str
    gpus: tuple[int, ...] | None


def planned(pod: Mapping[str, Any]) -> PlannedPlacement | None:
    """The batch plan written on the pod by a controller, or None (online placement)."""
    annotations: Mapping[str, str] = pod.get("metadata", {}).get("annotations") or {}
    node = annotations.get(PLANNED_NODE_ANNOTATION, "").strip()
    if not node:
        return None
    raw = annotations.get(PLANNED_GPUS_ANNOTATION, "")
    return PlannedPlacement(node, _indices(raw, PLANNED_GPUS_ANNOTATION))


def _indices(raw: str, annotation: str) -> tuple[int, ...] | None:
    """GPU indices written as `0,1,...` (None when empty); PodRequestError names `annotation`."""
    if not raw.strip():
        return None
    try:
        return tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise PodRequestError(
            f"metadata.annotations[{annotation}]: {raw.strip()!r} is not a list of indices"
        ) from None


def planned_gang(pod: Mapping[str, Any]) -> tuple[PlannedPlacement, ...] | None:
    """The whole gang's plan written on a member (`PLANNED_GANG_ANNOTATION`), or None."""
    annotations: Mapping[str, str] = pod.get("metadata", {}).get("annotations") or {}
    raw = annotations.get(PLANNED_GANG_ANNOTATION, "").strip()
    if not raw:
        return None
    slots = []
    for part in raw.split(";"):
        node, eq, gpus = part.partition("=")
        if not eq or not node.strip():
            raise PodRequestError(
                f"metadata.annotations[{PLANNED_GANG_ANNOTATION}]: {part!r} is not node=i,j,..."
            )
        slots.append(PlannedPlacement(node.strip(), _indices(gpus, PLANNED_GANG_ANNOTATION)))
    return tuple(slots)


def gang_plan_annotation(placements: Sequence[tuple[str, Sequence[int]]]) -> str:
    """`PLANNED_GANG_ANNOTATION`'s value for per-member (node, GPU indices), in rank order."""
    return ";".join(f"{node}={','.join(map(str, gpus))}" for node, gpus in placements)


def replica_pod(
    limits: Mapping[str, str],
    annotations: Mapping[str, str],
    *,
    gpu_type: str | None = None,
    name: str = "server",
) -> dict[str, Any]:
    """A pod of one container asking `limits`, with `annotations` (`gpu_resources`' pair).

    Pinned to `gpu_type` if given: one replica as quota admission and the free-GPU
    fit read it, before any Deployment exists.
    """
    spec: dict[str, Any] = {"containers": [{"name": name, "resources": {"limits": dict(limits)}}]}
    if gpu_type is not None:
        spec["nodeSelector"] = {GPU_PRODUCT_LABEL: gpu_type}
    return {"metadata": {"name": name, "annotations": dict(annotations)}, "spec": spec}


def gpu_resources(shared: GpuShare | None, count: int) -> tuple[dict[str, str], dict[str, str]]:
    """(container limits, pod annotations) asking for `count` whole GPUs or the share.

    The writing side of this module: what `pod_request` reads back. A share
    carries all its annotations (memory, compute, priority, profile), so the
    co-location rules see what the custom resource declared.
    """
    if shared is not None:
        return {SHARE_RESOURCE: "1"}, to_annotations(shared)
    return {GPU_RESOURCE: str(count)}, {}
