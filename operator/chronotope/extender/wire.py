"""The `k8s.io/kube-scheduler/extender/v1` wire format.

Those Go structs carry no JSON tags, so the keys on the wire are the Go field
names: `Pod`, `Nodes`, `NodeNames`, `FailedNodes`, `FailedAndUnresolvableNodes`,
`Error`; `HostPriorityList` is `[{"Host": ..., "Score": 0..10}]`; binding
arguments are `PodName`, `PodNamespace`, `PodUID`, `Node`. Go decodes JSON
keys case-insensitively, but we always answer with the exact names.

Parsing is strict about shape (a malformed request is a `WireError`, answered
with HTTP 400) and lenient about content it does not need. Input is bounded:
the body's size (`MAX_BODY_BYTES`, the server enforces it while reading), its
nesting (`MAX_DEPTH`), the length of names (`MAX_NAME`), and the type of every
pod field the extender reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "MAX_NAME",
    "MAX_PRIORITY",
    "BindingArgs",
    "ExtenderArgs",
    "WireError",
    "binding_result",
    "check_depth",
    "filter_result",
    "host_priorities",
    "parse_binding_args",
    "parse_extender_args",
]

MAX_PRIORITY = 10  # MaxExtenderPriority

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body. A pod is at most ~1.5 MB (etcd's object limit) and NodeNames
for 15,000 nodes about 0.4 MB. `Nodes` as full objects (sent only when nodeCacheCapable
is off; the shipped configurations turn it on) fit for a few thousand nodes."""

MAX_DEPTH = 64
"""Deepest nesting of objects and lists in a body. A pod, managedFields included, is
about 15 deep; Python's JSON parser itself stops near 1,000."""

MAX_NAME = 253
"""Longest pod, namespace, UID or node name (a DNS subdomain, Kubernetes' longest name)."""


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


_NESTED = frozenset({dict, list})


def check_depth(body: Any, limit: int = MAX_DEPTH) -> None:
    """Raise WireError when objects and lists in `body` nest deeper than `limit`.

    Level by level, not recursive, so a body just under the parser's own limit cannot
    exhaust the stack. It runs on every request: a list or object holding no
    containers (NodeNames, labels) is passed over in C (`map(type, ...)`).
    """
    level = [body] if type(body) in _NESTED else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise WireError(f"body is nested deeper than {limit} levels")
        below: list[Any] = []
        for value in level:
            children = value.values() if type(value) is dict else value
            if not _NESTED.isdisjoint(map(type, children)):
                below.extend([c for c in children if type(c) in _NESTED])
        level = below


def _name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME


def _names(values: list[Any]) -> bool:
    """Whether every item is a name (`_name`); in C for the thousands of NodeNames."""
    return not values or (
        {str}.issuperset(map(type, values))
        and "" not in values
        and max(map(len, values)) <= MAX_NAME
    )


def _node_name(node: Any) -> Any:
    """`metadata.name` of a Node object, or None when it has no such field."""
    meta = node.get("metadata") if isinstance(node, dict) else None
    return meta.get("name") if isinstance(meta, dict) else None


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
    check_depth(body)
    body = _object(body, "ExtenderArgs")
    pod = body.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise WireError("ExtenderArgs.Pod must be a Pod object with metadata")
    problem = _pod_problem(pod)
    if problem:
        raise WireError(f"ExtenderArgs.Pod.{problem}")
    names = body.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not _names(names):
            raise WireError(
                f"ExtenderArgs.NodeNames must be a list of node names (strings of 1 to "
                f"{MAX_NAME} characters)"
            )
        return ExtenderArgs(pod, list(names), nodes_given_as_objects=False)
    nodes = body.get("Nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        names = [_node_name(n) for n in nodes["items"]]
        if not _names(names):
            raise WireError("ExtenderArgs.Nodes.items[] must be Nodes with metadata.name")
        return ExtenderArgs(pod, names, nodes_given_as_objects=True)
    raise WireError("ExtenderArgs needs NodeNames (nodeCacheCapable) or Nodes")


def parse_binding_args(body: Any) -> BindingArgs:
    """ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node} for /bind."""
    check_depth(body)
    body = _object(body, "ExtenderBindingArgs")
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = body.get(key)
        if not _name(value):
            raise WireError(
                f"ExtenderBindingArgs.{key} must be a string of 1 to {MAX_NAME} characters"
            )
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
