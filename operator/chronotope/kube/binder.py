"""Apply a placement: write the GPU assignment onto the pod, then bind it.

Decide, then bind (kube-scheduler's own split): the extender has already
chosen node and GPUs; this module only enacts the choice. Order matters: the
assignment annotations go on the pod *before* the Binding, so a pod is never
bound without them, and a node running the device plugin gets the node lock
first, so its `Allocate` finds exactly this pod (see
`chronotope.sharing.assignment`). Every step is idempotent, so kube-scheduler
retrying a bind is safe; a failure is raised to the caller, which forgets its
assumption.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube.client import raw_json
from chronotope.sharing.assignment import (
    ALLOCATION_LOCK,
    DEVICE_PLUGIN,
    BindRequest,
    GpuAssignment,
    format_lock,
    lock_is_stale,
    parse_lock,
)

__all__ = ["BindError", "Binder", "fetch_pod"]

_CONFLICT = 409


class BindError(RuntimeError):
    """The binding could not be made; the message says why."""


class Binder:
    def __init__(
        self,
        api: client.ApiClient,
        lock_wait_s: float = 30.0,
        runs_plugin: Callable[[str], bool] | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.lock_wait_s = lock_wait_s
        # the caller's watch-fed cache knows which nodes run the device plugin; without
        # it, ask the API server (one extra read per bind)
        self.runs_plugin = runs_plugin or self._node_runs_plugin

    def bind(self, request: BindRequest) -> None:
        namespace, name, uid, node = request.namespace, request.name, request.uid, request.node
        assignment, seen_version = request.assignment, request.seen_version
        if assignment is not None:
            if self.runs_plugin(node):
                self._take_node_lock(node, assignment.handshake)
            if not self._annotate_at(namespace, name, assignment, seen_version) and (
                self._annotate_unbound(namespace, name, uid, node, assignment)
            ):
                return  # already bound to this node by an earlier try
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            # _preload_content=False: the client cannot deserialize the Binding response
            raw_json(self.core.create_namespaced_binding(namespace, body, _preload_content=False))
        except ApiException as exc:
            if exc.status == _CONFLICT and self._already_on(namespace, name, node):
                return  # a retried bind that already happened
            raise BindError(f"binding {namespace}/{name} to {node} failed: {exc.reason}") from exc

    def _annotate_at(
        self, namespace: str, name: str, assignment: GpuAssignment, version: str | None
    ) -> bool:
        """Annotate with the resourceVersion kube-scheduler showed us, saving a read.

        The pod was unbound at that version, so success proves it still is; any change
        since (a bind by an earlier try included) fails with 409 and the caller falls
        back to reading the pod.
        """
        if version is None:
            return False
        patch = {
            "metadata": {"resourceVersion": version, "annotations": assignment.to_annotations()}
        }
        try:
            raw_json(self.core.patch_namespaced_pod(name, namespace, patch, _preload_content=False))
        except ApiException as exc:
            if exc.status != _CONFLICT:
                raise
            return False
        return True

    def _annotate_unbound(
        self, namespace: str, name: str, uid: str, node: str, assignment: GpuAssignment
    ) -> bool:
        """Write the assignment only while the pod is unbound (resourceVersion precondition).

        A slow, superseded bind must never overwrite the assignment of a pod that a
        later try already bound elsewhere. Returns True if the pod is already on `node`.
        """
        for _ in range(5):
            # raw JSON: client-model (de)serialization would dominate the bind's cost
            pod = raw_json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
            meta, bound_to = pod["metadata"], (pod.get("spec") or {}).get("nodeName")
            if meta.get("uid") != uid:
                raise BindError(f"pod {namespace}/{name} was replaced (uid {meta.get('uid')})")
            if bound_to:
                if bound_to == node:
                    return True
                raise BindError(f"pod {namespace}/{name} is already bound to {bound_to}")
            patch = {
                "metadata": {
                    "resourceVersion": meta["resourceVersion"],
                    "annotations": assignment.to_annotations(),
                }
            }
            try:
                raw_json(
                    self.core.patch_namespaced_pod(name, namespace, patch, _preload_content=False)
                )
                return False
            except ApiException as exc:
                if exc.status != _CONFLICT:
                    raise
        raise BindError(f"pod {namespace}/{name} kept changing; not annotated")

    def _already_on(self, namespace: str, name: str, node: str) -> bool:
        pod = self.core.read_namespaced_pod(name, namespace)
        return bool(pod.spec.node_name == node)

    def _node_runs_plugin(self, node: str) -> bool:
        obj = self.core.read_node(node)
        return DEVICE_PLUGIN in (obj.metadata.annotations or {})

    def _take_node_lock(self, node: str, handshake: str) -> None:
        """Wait until the node lock is free or stale, then take it (optimistic concurrency)."""
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            obj: Any = self.core.read_node(node)
            current = (obj.metadata.annotations or {}).get(ALLOCATION_LOCK)
            held = parse_lock(current)
            if held is not None and held[0] == handshake:
                return
            if lock_is_stale(current, time.time()) or current is None:
                patch = {
                    "metadata": {
                        "resourceVersion": obj.metadata.resource_version,
                        "annotations": {ALLOCATION_LOCK: format_lock(handshake, time.time())},
                    }
                }
                try:
                    self.core.patch_node(node, patch)
                    return
                except ApiException as exc:
                    if exc.status != _CONFLICT:
                        raise
            if time.monotonic() > deadline:
                raise BindError(f"node {node}: device-plugin allocation lock held by {current}")
            time.sleep(0.2)


def fetch_pod(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """A pod as a plain dict (for a bind that arrives before this process filtered it)."""
    pod = client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    result: dict[str, Any] = api.sanitize_for_serialization(pod)
    return result
