"""API-server side of the device-plugin handshake: node locks and pod assignments.

Implements the `AllocationStore` seam of `chronotope.deviceplugin.allocator`
with the kubernetes client, plus the reads the plugin needs at start-up (how
many GPUs the node has). Releasing the node lock is a compare-and-delete:
the patch carries the node's resourceVersion, so a binder that took the lock
in between makes it fail with 409 and we re-read instead of deleting its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.sharing.assignment import (
    ALLOCATION_LOCK,
    DEVICE_PLUGIN,
    HANDSHAKE,
    PodRecord,
    parse_lock,
)

__all__ = [
    "GPU_COUNT_LABEL",
    "GPU_RESOURCE",
    "KubeAllocationStore",
    "mark_node_has_plugin",
    "node_gpu_count",
]

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
_CONFLICT = 409
_NOT_FOUND = 404


def _annotations(obj: Any) -> dict[str, str]:
    return dict(obj.metadata.annotations or {})


def node_gpu_count(api: client.ApiClient, node: str) -> int:
    """GPUs on `node`: the `nvidia.com/gpu.count` label, else `nvidia.com/gpu` capacity."""
    obj = client.CoreV1Api(api).read_node(node)
    labels = obj.metadata.labels or {}
    if GPU_COUNT_LABEL in labels:
        return int(labels[GPU_COUNT_LABEL])
    capacity = (obj.status.capacity or {}) if obj.status else {}
    return int(capacity.get(GPU_RESOURCE, "0"))


class KubeAllocationStore:
    """`AllocationStore` over the API server (structurally typed; no base class)."""

    def __init__(self, api: client.ApiClient, *, retries: int = 5) -> None:
        """Use the API server `api`; a lock release makes up to `retries` tries on conflicts."""
        self._core = client.CoreV1Api(api)
        self._retries = retries

    def read_node_lock(self, node: str) -> str | None:
        """The node's allocation-lock annotation, if any."""
        return _annotations(self._core.read_node(node)).get(ALLOCATION_LOCK)

    def find_pods_by_handshake(self, node: str, handshake: str) -> list[PodRecord]:
        """Pods bound to `node` whose handshake annotation is `handshake`."""
        pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        return [
            PodRecord(
                p.metadata.namespace, p.metadata.name, _annotations(p), p.spec.scheduler_name or ""
            )
            for p in pods.items
            if _annotations(p).get(HANDSHAKE) == handshake
        ]

    def mark_consumed(self, pod: PodRecord, annotations: Mapping[str, str]) -> None:
        """Merge `annotations` into the pod's annotations."""
        # Idempotent merge of our own keys; the allocator serialises calls per node.
        self._core.patch_namespaced_pod(
            pod.name, pod.namespace, {"metadata": {"annotations": dict(annotations)}}
        )

    def release_node_lock(self, node: str, handshake: str) -> bool:
        """Remove the node lock if it still holds `handshake`; True when removed.

        The patch carries the node's resourceVersion: a concurrent change makes it
        read the node again, and `RuntimeError` follows when every try conflicts.
        """
        for _ in range(self._retries):
            obj = self._core.read_node(node)
            held = parse_lock(_annotations(obj).get(ALLOCATION_LOCK))
            if held is None or held[0] != handshake:
                return False
            patch = {
                "metadata": {
                    "resourceVersion": obj.metadata.resource_version,
                    "annotations": {ALLOCATION_LOCK: None},
                }
            }
            try:
                self._core.patch_node(node, patch)
            except ApiException as exc:
                if exc.status != _CONFLICT:
                    raise
                log.debug("node %s changed while releasing its lock; re-reading", node)
                continue
            return True
        raise RuntimeError(
            f"node {node}: lock release kept conflicting after {self._retries} tries"
        )


def mark_node_has_plugin(api: client.ApiClient, node: str, version: str = "v1beta1") -> None:
    """Announce on the Node that the device plugin runs there, so binds take its lock."""
    client.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {DEVICE_PLUGIN: version}}})
