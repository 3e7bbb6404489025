"""Watch-fed stores of nodes, pods and the Chronotope kinds for the operator (plain dicts).

Listing every pod of the cluster on every reconcile of every waiting job does
not scale; the operator instead keeps one copy of each kind, fed by the
`Informer` (list, then watch, relist on `410 Gone`), and reads it in memory.
Its own writes are overlaid at once (`put`): the worker pods a decision just
created count in the next decision even before their watch event arrives,
so two jobs decided in a row never count on the same free GPUs. Objects are
shared, read-only views: callers must not mutate them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes import client

from chronotope.kube.informer import Informer, Resource

__all__ = ["OperatorCache", "Store", "parse_selector"]

Obj = dict[str, Any]


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


def _older(obj: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    """`obj` is an earlier version of the same object than `than` (same uid, lower resourceVersion).

    resourceVersions are etcd revisions here, integers; one that is not (another
    storage) is never called older, and neither is an object recreated (new uid).
    """
    a, b = obj.get("metadata") or {}, than.get("metadata") or {}
    if a.get("uid") != b.get("uid"):
        return False
    mine, theirs = str(a.get("resourceVersion") or ""), str(b.get("resourceVersion") or "")
    return mine.isdigit() and theirs.isdigit() and int(mine) < int(theirs)


def parse_selector(selector: str | None) -> dict[str, str]:
    """`a=b,c=d` (equality only, as the operator writes them) -> {a: b, c: d}."""
    out: dict[str, str] = {}
    for part in (selector or "").split(","):
        if part.strip():
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"unsupported label selector {selector!r}: only a=b terms")
            out[key.strip()] = value.strip()
    return out


class Store:
    """The current objects of one kind, by namespace, then namespace/name.

    Kept per namespace: a reconcile asks for one job's workers, and scanning
    every pod of the cluster for that would be the list call moved in memory.
    """

    def __init__(self) -> None:
        """An empty store."""
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, Obj]] = {}
        self.changes = 0
        """How many times its objects changed (an event applied, a relist, an overlay):
        what is worked out from them may be kept until this moves."""

    @staticmethod
    def _namespace(obj: Mapping[str, Any]) -> str:
        return str((obj.get("metadata") or {}).get("namespace") or "")

    def on_event(self, kind: str, obj: Obj) -> bool:
        """Apply one watch event: DELETED removes the object, anything else stores it.

        An event older than what the store holds is dropped (returns False): the
        operator stores the object each of its writes returns at once, and the watch
        may still deliver the version of an earlier write after it (a job's annotation
        patch after its status patch), which would make a started job look unstarted.
        """
        with self._lock:
            bucket = self._items.setdefault(self._namespace(obj), {})
            if kind == "DELETED":
                bucket.pop(_key(obj), None)
                self.changes += 1
                return True
            held = bucket.get(_key(obj))
            if held is not None and _older(obj, held):
                return False
            bucket[_key(obj)] = obj
            self.changes += 1
            return True

    def on_sync(self, objs: list[Obj]) -> None:
        """Replace the whole store with a fresh list."""
        items: dict[str, dict[str, Obj]] = {}
        for obj in objs:
            items.setdefault(self._namespace(obj), {})[_key(obj)] = obj
        with self._lock:
            self._items = items
            self.changes += 1

    def put(self, objs: Iterable[Obj]) -> None:
        """Overlay objects this process just created (the watch event may still be coming)."""
        with self._lock:
            for obj in objs:
                self._items.setdefault(self._namespace(obj), {}).setdefault(_key(obj), obj)
            self.changes += 1

    def get(self, namespace: str | None, name: str) -> Obj | None:
        """The object `namespace/name` (namespace None or "" for cluster-scoped), or None."""
        with self._lock:
            return self._items.get(namespace or "", {}).get(f"{namespace or ''}/{name}")

    def list(self, namespace: str | None = None, selector: str | None = None) -> list[Obj]:
        """The objects in `namespace` (all if None) whose labels match `selector` (`a=b,c=d`)."""
        labels = parse_selector(selector)
        with self._lock:
            if namespace is None:
                items = [o for bucket in self._items.values() for o in bucket.values()]
            else:
                items = list(self._items.get(namespace, {}).values())
        return [
            o
            for o in items
            if all(
                ((o.get("metadata") or {}).get("labels") or {}).get(k) == v
                for k, v in labels.items()
            )
        ]


Listener = Callable[[str, str, Obj], None]
"""(resource plural, event type, object) -> None; event type "SYNC" after a relist (no object)."""


class OperatorCache:
    """Nodes, pods, namespaces, claims, volumes, storage and runtime classes, and our objects.

    Kept current by one `Informer`.

    Listeners (`listen`) hear each watch event after the store applied it, and
    each relist: controllers wake the objects that depend on what changed.
    """

    def __init__(self, api: client.ApiClient) -> None:
        """Build empty stores and the informer that feeds them; `start` begins watching."""
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        storage = client.StorageV1Api(api)
        node = client.NodeV1Api(api)
        self.nodes, self.pods, self.training_jobs = Store(), Store(), Store()
        self.pipelines, self.variants = Store(), Store()
        self.queues, self.local_queues = Store(), Store()
        self.namespaces = Store()
        self.claims, self.volumes, self.storage_classes = Store(), Store(), Store()
        self.csi_drivers, self.csi_capacities = Store(), Store()
        self.csi_nodes, self.volume_attachments = Store(), Store()
        self.runtime_classes = Store()
        self._listeners: list[Listener] = []

        def lister(plural: str) -> Any:
            return functools.partial(
                custom.list_cluster_custom_object, "chronotope.dev", "v1alpha1", plural
            )

        kinds = [
            ("nodes", core.list_node, self.nodes),
            ("pods", core.list_pod_for_all_namespaces, self.pods),
            ("trainingjobs", lister("trainingjobs"), self.training_jobs),
            ("inferencepipelines", lister("inferencepipelines"), self.pipelines),
            ("modelvariants", lister("modelvariants"), self.variants),
            ("queues", lister("queues"), self.queues),
            ("localqueues", lister("localqueues"), self.local_queues),
            ("namespaces", core.list_namespace, self.namespaces),
            (
                "persistentvolumeclaims",
                core.list_persistent_volume_claim_for_all_namespaces,
                self.claims,
            ),
            ("persistentvolumes", core.list_persistent_volume, self.volumes),
            ("storageclasses", storage.list_storage_class, self.storage_classes),
            ("csidrivers", storage.list_csi_driver, self.csi_drivers),
            (
                "csistoragecapacities",
                storage.list_csi_storage_capacity_for_all_namespaces,
                self.csi_capacities,
            ),
            ("csinodes", storage.list_csi_node, self.csi_nodes),
            ("volumeattachments", storage.list_volume_attachment, self.volume_attachments),
            ("runtimeclasses", node.list_runtime_class, self.runtime_classes),
        ]
        self.informer = Informer(
            api,
            [
                Resource(plural, list_fn, *self._fan(plural, store))
                for plural, list_fn, store in kinds
            ],
        )

    def listen(self, listener: Listener) -> None:
        """Call `listener` after every watch event and relist from now on."""
        self._listeners.append(listener)

    def _fan(
        self, plural: str, store: Store
    ) -> tuple[Callable[[str, Obj], None], Callable[[list[Obj]], None]]:
        def on_event(kind: str, obj: Obj) -> None:
            if not store.on_event(kind, obj):
                return  # older than the operator's own write the store holds: nothing new
            for listener in list(self._listeners):
                listener(plural, kind, obj)

        def on_sync(objs: list[Obj]) -> None:
            store.on_sync(objs)
            for listener in list(self._listeners):
                listener(plural, "SYNC", {})

        return on_event, on_sync

    def start(self, timeout: float) -> bool:
        """Start watching; True once every kind has been listed within `timeout` seconds."""
        self.informer.start()
        return self.informer.wait_synced(timeout)

    def stop(self) -> None:
        """Stop the informer's watches."""
        self.informer.stop()
