"""Apply a placement: one Binding that carries the GPU assignment.

Decide, then bind (kube-scheduler's own split): the extender has already
chosen node and GPUs; this module only enacts the choice. The assignment
annotations travel on the Binding's own metadata, and the API server copies
them onto the pod in the same write that sets `spec.nodeName`: one API call
per bind, and no moment at which a pod is annotated but unbound or bound
without its assignment. A Binding for a pod already bound fails (409), so a
slow, superseded try can never overwrite the assignment of a pod a later try
bound. A node running the device plugin gets its node lock first, so its
`Allocate` finds exactly this pod (see `chronotope.sharing.assignment`).
Every step is idempotent, so kube-scheduler retrying a bind is safe; a
failure is raised to the caller, which forgets its assumption.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube.client import raw_json
from chronotope.kube.events import post_event
from chronotope.sharing.assignment import (
    ALLOCATION_LOCK,
    DEVICE_PLUGIN,
    BindRequest,
    GpuAssignment,
    format_lock,
    lock_is_stale,
    parse_lock,
)

__all__ = ["BindError", "Binder", "fetch_pod", "post_pod_event"]

_CONFLICT = 409


class BindError(RuntimeError):
    """The binding could not be made; the message says why."""


class Binder:
    """Enact a placement: bind the pod, with its GPU assignment; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        lock_wait_s: float = 30.0,
        runs_plugin: Callable[[str], bool] | None = None,
    ) -> None:
        """Bind through `api`; wait up to `lock_wait_s` for a node lock.

        `runs_plugin` says whether a node runs the device plugin; without it each
        bind reads the node.
        """
        self.core = client.CoreV1Api(api)
        self.lock_wait_s = lock_wait_s
        # the caller's watch-fed cache knows which nodes run the device plugin; without
        # it, ask the API server (one extra read per bind)
        self.runs_plugin = runs_plugin or self._node_runs_plugin

    def bind(self, request: BindRequest) -> None:
        """Bind the pod to its node, carrying the assignment; raises `BindError` on failure.

        A node running the device plugin is locked for this pod first. A retry of a
        bind that already happened, to the same node and GPUs, succeeds.
        """
        namespace, name, uid, node = request.namespace, request.name, request.uid, request.node
        assignment = request.assignment
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if assignment is not None:
            if self.runs_plugin(node):
                self._take_node_lock(node, assignment.handshake)
            metadata["annotations"] = assignment.to_annotations()
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            # _preload_content=False: the client cannot deserialize the Binding response
            raw_json(self.core.create_namespaced_binding(namespace, body, _preload_content=False))
        except ApiException as exc:
            if exc.status == _CONFLICT and self._already_on(namespace, name, node, assignment):
                return  # a retried bind that already happened
            raise BindError(f"binding {namespace}/{name} to {node} failed: {exc.reason}") from exc

    def _already_on(
        self, namespace: str, name: str, node: str, assignment: GpuAssignment | None
    ) -> bool:
        """Whether an earlier try already bound the pod here, with these GPUs."""
        pod = raw_json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
        if (pod.get("spec") or {}).get("nodeName") != node:
            return False
        if assignment is None:
            return True
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        try:
            held = GpuAssignment.from_annotations(annotations)
        except ValueError:
            return False
        return held.gpu_indices == assignment.gpu_indices

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


def post_pod_event(api: client.ApiClient, key: str, reason: str, message: str) -> None:
    """A Normal event on pod `key` ("namespace/name") from the chronotope scheduler."""
    namespace, _, name = key.partition("/")
    involved = {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}
    post_event(api, involved, reason, message, component="chronotope-scheduler")
