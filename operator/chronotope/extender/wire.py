"""The `k8s.io/kube-scheduler/extender/v1` wire format.

Those Go structs carry no JSON tags, so the keys on the wire are the Go field
names: `Pod`, `Nodes`, `NodeNames`, `FailedNodes`, `FailedAndUnresolvableNodes`,
`Error`; `HostPriorityList` is `[{"Host": ..., "Score": 0..10}]`; binding
arguments are `PodName`, `PodNamespace`, `PodUID`, `Node`. Go decodes JSON
keys case-insensitively, but we always answer with the exact names.

Parsing is strict about shape (a malformed request is a `WireError`, answered
with HTTP 400) and lenient about content it does not need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_PRIORITY",
    "BindingArgs",
    "ExtenderArgs",
    "WireError",
    "binding_result",
    "filter_result",
    "host_priorities",
    "parse_binding_args",
    "parse_extender_args",
]

MAX_PRIORITY = 10  # MaxExtenderPriority


class WireError(ValueError):
    """The request body is not what the extender API specifies."""


@dataclass(frozen=True)
class ExtenderArgs:
    """The parsed ExtenderArgs: the pod, the candidate node names, and how they came."""

    pod: dict[str, Any]
    node_names: list[str]
    nodes_given_as_objects: bool

    @property
    def pod_key(self) -> str:
        """The pod as `namespace/name` (namespace `default` when unset)."""
        meta = self.pod.get("metadata", {})
        return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


@dataclass(frozen=True)
class BindingArgs:
    """The parsed ExtenderBindingArgs: which pod to bind to which node."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def pod_key(self) -> str:
        """The pod as `namespace/name`."""
        return f"{self.pod_namespace}/{self.pod_name}"


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise WireError(f"{what} must be a JSON object, got {type(body).__name__}")
    return body


def _strings(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _pod_problem(pod: dict[str, Any]) -> str:
    """The first field of the pod whose type the extender cannot read ('' when none)."""
    meta = pod["metadata"]
    for key in ("name", "namespace", "uid"):
        if not isinstance(meta.get(key, ""), str):
            return f"metadata.{key} must be a string"
    for key in ("annotations", "labels"):
        if not _strings(meta.get(key, {})):
            return f"metadata.{key} must map strings to strings"
    spec = pod.get("spec", {})
    if not isinstance(spec, dict):
        return "spec must be an object"
    if not _strings(spec.get("nodeSelector", {})):
        return "spec.nodeSelector must map strings to strings"
    for key in ("containers", "initContainers"):
        items = spec.get(key, [])
        if not isinstance(items, list) or not all(isinstance(c, dict) for c in items):
            return f"spec.{key} must be a list of objects"
        for i, c in enumerate(items):
            res = c.get("resources", {})
            if not isinstance(res, dict) or not all(
                isinstance(res.get(k, {}), dict) for k in ("limits", "requests")
            ):
                return f"spec.{key}[{i}].resources must hold limits and requests objects"
    return ""


def parse_extender_args(body: Any) -> ExtenderArgs:
    """ExtenderArgs{Pod, Nodes, NodeNames} for /filter and /prioritize."""
    body = _object(body, "ExtenderArgs")
    pod = body.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise WireError("ExtenderArgs.Pod must be a Pod object with metadata")
    problem = _pod_problem(pod)
    if problem:
        raise WireError(f"ExtenderArgs.Pod.{problem}")
    names = body.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise WireError("ExtenderArgs.NodeNames must be a list of strings")
        return ExtenderArgs(pod, list(names), nodes_given_as_objects=False)
    nodes = body.get("Nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        try:
            return ExtenderArgs(
                pod,
                [str(n["metadata"]["name"]) for n in nodes["items"]],
                nodes_given_as_objects=True,
            )
        except (KeyError, TypeError) as exc:
            raise WireError("ExtenderArgs.Nodes.items[] must be Nodes with metadata.name") from exc
    raise WireError("ExtenderArgs needs NodeNames (nodeCacheCapable) or Nodes")


def parse_binding_args(body: Any) -> BindingArgs:
    """ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node} for /bind."""
    body = _object(body, "ExtenderBindingArgs")
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = body.get(key)
        if not isinstance(value, str) or not value:
            raise WireError(f"ExtenderBindingArgs.{key} must be a non-empty string")
        values[key] = value
    return BindingArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


def filter_result(
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult for a nodeCacheCapable extender (names, not Node objects)."""
    return {
        "Nodes": None,
        "NodeNames": passed,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }


def host_priorities(scores: dict[str, int]) -> list[dict[str, Any]]:
    """HostPriorityList, scores clamped to 0..MaxExtenderPriority."""
    return [
        {"Host": host, "Score": max(0, min(MAX_PRIORITY, int(score)))}
        for host, score in scores.items()
    ]


def binding_result(error: str = "") -> dict[str, Any]:
    """ExtenderBindingResult; an empty `error` means the bind succeeded."""
    return {"Error": error}
