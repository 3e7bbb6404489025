"""Submit a pod, wait for kube-scheduler's answer, and clear pods that fit nowhere.

The API side of `chronotope replay`: one pod at a time, as the simulator's
protocol has it. A pod is done when it is bound (its node and the GPUs of its
assignment annotations are returned) or when kube-scheduler marks it
unschedulable; then it is deleted, as the simulator fails a pod for good.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube.client import raw_json
from chronotope.sharing.assignment import GpuAssignment

__all__ = ["ensure_namespace", "place_one"]

_NOT_FOUND = 404
_CONFLICT = 409


def ensure_namespace(api: client.ApiClient, name: str, timeout: float = 60.0) -> None:
    """Create the namespace (if missing) and wait for its default service account."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != _CONFLICT:
            raise
    deadline = time.monotonic() + timeout
    while not core.list_namespaced_service_account(name).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"namespace {name}: no default service account after {timeout}s")
        time.sleep(0.1)


def place_one(
    api: client.ApiClient,
    namespace: str,
    manifest: dict[str, Any],
    *,
    timeout: float = 60.0,
    poll_s: float = 0.005,
) -> tuple[str, tuple[int, ...]] | None:
    """Create the pod and wait: (node, GPU indices) once bound, None if unschedulable."""
    core = client.CoreV1Api(api)
    name = manifest["metadata"]["name"]
    raw_json(core.create_namespaced_pod(namespace, manifest, _preload_content=False))
    deadline = time.monotonic() + timeout
    while True:
        pod = raw_json(core.read_namespaced_pod(name, namespace, _preload_content=False))
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            try:
                gpus = GpuAssignment.from_annotations(annotations).gpu_indices
            except ValueError:
                gpus = ()
            return node, gpus
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                _delete(core, namespace, name)
                return None
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod {namespace}/{name}: neither bound nor unschedulable")
        time.sleep(poll_s)


def _delete(core: client.CoreV1Api, namespace: str, name: str) -> None:
    try:
        raw_json(
            core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0, _preload_content=False
            )
        )
    except ApiException as exc:
        if exc.status != _NOT_FOUND:
            raise
