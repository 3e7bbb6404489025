"""API calls the workload controllers need, with plain dicts in and out.

Lists come back as raw JSON (no client models), creates are idempotent
(AlreadyExists is success), and deletes ignore NotFound, so a controller can
repeat any step after a crash or restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube.client import raw_json

__all__ = [
    "CHECKPOINT_ANNOTATION",
    "annotate_custom",
    "create_gang",
    "create_pods",
    "delete_pods",
    "ensure_service",
    "list_custom",
    "list_namespaces",
    "list_nodes",
    "list_pods",
    "read_config_map",
]

CHECKPOINT_ANNOTATION = "chronotope.dev/checkpoint-requested"
"""Written on workers before they are stopped: checkpoint now, SIGTERM follows."""

_NOT_FOUND = 404
_CONFLICT = 409
Obj = dict[str, Any]


def _items(response: Any) -> list[Obj]:
    data: Obj = raw_json(response)
    items: list[Obj] = data.get("items") or []
    return items


def list_nodes(api: client.ApiClient) -> list[Obj]:
    """All nodes, as raw JSON."""
    return _items(client.CoreV1Api(api).list_node(_preload_content=False))


def list_namespaces(api: client.ApiClient) -> list[Obj]:
    """All namespaces, as raw JSON."""
    return _items(client.CoreV1Api(api).list_namespace(_preload_content=False))


def list_claims(api: client.ApiClient) -> list[Obj]:
    """All PersistentVolumeClaims, as raw JSON."""
    core = client.CoreV1Api(api)
    return _items(core.list_persistent_volume_claim_for_all_namespaces(_preload_content=False))


def list_volumes(api: client.ApiClient) -> list[Obj]:
    """All PersistentVolumes, as raw JSON."""
    return _items(client.CoreV1Api(api).list_persistent_volume(_preload_content=False))


def list_storage_classes(api: client.ApiClient) -> list[Obj]:
    """All StorageClasses, as raw JSON."""
    return _items(client.StorageV1Api(api).list_storage_class(_preload_content=False))


def list_csi_drivers(api: client.ApiClient) -> list[Obj]:
    """All CSIDrivers, as raw JSON."""
    return _items(client.StorageV1Api(api).list_csi_driver(_preload_content=False))


def list_csi_capacities(api: client.ApiClient) -> list[Obj]:
    """All CSIStorageCapacities, as raw JSON."""
    storage = client.StorageV1Api(api)
    return _items(storage.list_csi_storage_capacity_for_all_namespaces(_preload_content=False))


def list_csi_nodes(api: client.ApiClient) -> list[Obj]:
    """All CSINodes, as raw JSON."""
    return _items(client.StorageV1Api(api).list_csi_node(_preload_content=False))


def list_volume_attachments(api: client.ApiClient) -> list[Obj]:
    """All VolumeAttachments, as raw JSON."""
    return _items(client.StorageV1Api(api).list_volume_attachment(_preload_content=False))


def list_runtime_classes(api: client.ApiClient) -> list[Obj]:
    """All RuntimeClasses, as raw JSON."""
    return _items(client.NodeV1Api(api).list_runtime_class(_preload_content=False))


def list_pods(
    api: client.ApiClient, namespace: str | None = None, label_selector: str | None = None
) -> list[Obj]:
    """The pods in `namespace` (all namespaces if None) matching `label_selector`, as raw JSON."""
    core = client.CoreV1Api(api)
    kwargs: dict[str, Any] = {"_preload_content": False}
    if label_selector:
        kwargs["label_selector"] = label_selector
    if namespace is None:
        return _items(core.list_pod_for_all_namespaces(**kwargs))
    return _items(core.list_namespaced_pod(namespace, **kwargs))


def read_config_map(api: client.ApiClient, namespace: str, name: str) -> Obj | None:
    """The ConfigMap as raw JSON, or None when it does not exist."""
    try:
        response = client.CoreV1Api(api).read_namespaced_config_map(
            name, namespace, _preload_content=False
        )
    except ApiException as exc:
        if exc.status == _NOT_FOUND:
            return None
        raise
    data: Obj = raw_json(response)
    return data


def list_custom(api: client.ApiClient, group: str, version: str, plural: str) -> list[Obj]:
    """All cluster-wide objects of a custom resource, as dicts."""
    custom = client.CustomObjectsApi(api)
    data = custom.list_cluster_custom_object(group, version, plural)
    items: list[Obj] = data.get("items") or []
    return items


_CREATES = ThreadPoolExecutor(8, thread_name_prefix="create")
"""Creates of one gang in flight at once: its latency is one API write, not one per pod
(the Job controller creates a Job's pods in parallel too)."""


def create_pods(api: client.ApiClient, pods: Iterable[Obj]) -> int:
    """Create the pods, each in its own namespace, side by side; returns how many were new.

    AlreadyExists counts as done, not new. Raises the first failure once every
    create has returned.
    """
    return sum(_all([(_create_pod, api, pod) for pod in pods]))


def create_gang(
    api: client.ApiClient, namespace: str, service: Obj | None, pods: Iterable[Obj]
) -> int:
    """`ensure_service` (unless `service` is None) and `create_pods` at once.

    One API write of latency for the gang. Returns the pods created (AlreadyExists
    is not new).
    """
    creates = [(_create_pod, api, p) for p in pods]
    if service is None:
        return sum(_all(creates))
    return sum(_all([(ensure_service, api, namespace, service), *creates])[1:])


def _all(calls: list[tuple[Any, ...]]) -> list[Any]:
    """Run `fn(*args)` for each `(fn, *args)`, side by side; raise the first failure at the end."""
    if len(calls) == 1:
        fn, *args = calls[0]
        return [fn(*args)]
    futures = [_CREATES.submit(fn, *args) for fn, *args in calls]
    wait(futures)
    return [f.result() for f in futures]


def _create_pod(api: client.ApiClient, pod: Obj) -> bool:
    try:  # a raw response: the created pod is not read, so skip the client's models
        raw_json(
            client.CoreV1Api(api).create_namespaced_pod(
                pod["metadata"]["namespace"], pod, _preload_content=False
            )
        )
    except ApiException as exc:
        if exc.status != _CONFLICT:
            raise
        return False
    return True


def ensure_service(api: client.ApiClient, namespace: str, service: Obj) -> None:
    """Create the service in `namespace` unless it already exists."""
    try:
        raw_json(
            client.CoreV1Api(api).create_namespaced_service(
                namespace, service, _preload_content=False
            )
        )
    except ApiException as exc:
        if exc.status != _CONFLICT:
            raise


def delete_pods(
    api: client.ApiClient, namespace: str, names: Iterable[str], grace_seconds: int = 30
) -> None:
    """Ask workers to checkpoint (annotation), then delete them with a SIGTERM grace period."""
    core = client.CoreV1Api(api)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name in names:
        try:
            core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": {CHECKPOINT_ANNOTATION: stamp}}}
            )
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_seconds)
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise


def annotate_custom(
    api: client.ApiClient,
    resource: tuple[str, str, str],
    namespace: str,
    name: str,
    annotations: dict[str, str],
) -> None:
    """Merge annotations into a custom object; `resource` is (group, version, plural)."""
    group, version, plural = resource
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        group, version, namespace, plural, name, {"metadata": {"annotations": annotations}}
    )
