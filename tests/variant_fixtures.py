"""ModelVariant, node and pod dicts for the ModelVariant controller's unit tests."""

from __future__ import annotations

from typing import Any

__all__ = ["LLAMA", "node", "pod", "variant"]

LLAMA = "meta-llama/Llama-2-7b-hf"


def variant(
    name: str,
    *,
    qps: float = 0.2,
    slo_ms: float = 2000,
    delta_mib: int = 500,
    base: str = LLAMA,
    base_mib: int = 13000,
    group: str | None = "llama",
    created: int = 0,
    generation: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    """A ModelVariant object as the API server returns it (namespace `ns`)."""
    body: dict[str, Any] = {
        "base": {"name": base, "parametersBillions": 6.7, "sizeMiB": base_mib},
        "delta": {"uri": f"s3://deltas/{name}", "bits": 4, "compressedSizeMiB": delta_mib},
        "traffic": {"expectedQPS": qps},
        "slo": {"p99LatencyMs": slo_ms},
    }
    if group is not None:
        body["servingGroup"] = group
    body |= spec
    return {
        "apiVersion": "chronotope.dev/v1alpha1",
        "kind": "ModelVariant",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "generation": generation,
            "creationTimestamp": f"2030-01-01T00:00:{created:02d}Z",
        },
        "spec": body,
    }


def node(
    name: str,
    product: str = "H100-SXM5-80GB",
    gpus: int = 8,
    *,
    ready: bool = True,
    memory_mib: int | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A GPU node as GPU feature discovery labels it."""
    labels = {"nvidia.com/gpu.product": product}
    if memory_mib is not None:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    node_name: str | None = None,
    *,
    ready: bool = False,
    group: str = "llama",
    waiting: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A serving group's pod: unbound (with the scheduler's reason), bound, or Ready."""
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if waiting:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": waiting,
            }
        )
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": {"chronotope.dev/serving-group": group},
    }
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node_name} if node_name else {},
        "status": {"phase": "Running" if node_name else "Pending", "conditions": conditions},
    }
