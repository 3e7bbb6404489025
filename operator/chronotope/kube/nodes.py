"""Create simulated (kwok) nodes and read back what the cluster reports for them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = ["apply_nodes", "wait_nodes_ready", "wait_nodes_untainted"]

_CONFLICT = 409


def _apply_one(core: client.CoreV1Api, manifest: dict[str, Any]) -> None:
    name = manifest["metadata"]["name"]
    try:
        core.create_node(manifest)
    except ApiException as exc:
        if exc.status != _CONFLICT:
            raise
        core.patch_node(name, {"metadata": manifest["metadata"], "spec": manifest["spec"]})
    # The apiserver keeps a node's status on create, but an existing node keeps its old
    # status on patch; write capacity through the status subresource either way.
    core.patch_node_status(name, {"status": manifest["status"]})


def apply_nodes(
    api: client.ApiClient, manifests: Sequence[dict[str, Any]], workers: int = 16
) -> int:
    """Create or update every node; returns how many were applied."""
    core = client.CoreV1Api(api)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda m: _apply_one(core, m), manifests))
    return len(manifests)


def _is_ready(node: Any) -> bool:
    for cond in node.status.conditions or []:
        if cond.type == "Ready":
            return bool(cond.status == "True")
    return False


def wait_nodes_ready(api: client.ApiClient, names: set[str], timeout: float) -> None:
    """Block until kwok reports every named node Ready; raise TimeoutError naming the stragglers."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        nodes = core.list_node(label_selector="type=kwok").items
        pending = names - {n.metadata.name for n in nodes if _is_ready(n)}
        if pending:
            time.sleep(0.5)
    if pending:
        sample = ", ".join(sorted(pending)[:5])
        raise TimeoutError(f"{len(pending)} node(s) not Ready after {timeout:.0f}s: {sample}")


def wait_nodes_untainted(api: client.ApiClient, names: set[str], timeout: float) -> None:
    """Block until none of the named nodes has a NoSchedule/NoExecute taint.

    New nodes carry `node.kubernetes.io/not-ready` until the node lifecycle
    controller, at its own pace, sees them Ready; until then kube-scheduler
    leaves them out, so a replay started early would see fewer nodes.
    """
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        tainted = {
            n.metadata.name
            for n in core.list_node().items
            if n.metadata.name in names
            and any(t.effect in ("NoSchedule", "NoExecute") for t in n.spec.taints or [])
        }
        if not tainted:
            return
        if time.monotonic() > deadline:
            sample = ", ".join(sorted(tainted)[:5])
            raise TimeoutError(
                f"{len(tainted)} node(s) still tainted after {timeout:.0f}s: {sample}"
            )
        time.sleep(0.5)
