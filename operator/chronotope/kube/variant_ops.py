"""The API calls the ModelVariant controller makes (`controllers.modelvariant`).

Variants, nodes and a group's pods come from the operator's watch-fed cache
when there is one; the placement ConfigMap is read from the API server (it
is the group's memory across operator restarts, so it must be current). A
group's ConfigMap, Service and Deployment are created, or patched: the
ConfigMap's data and the Service's labels and owner references (a strategic
merge adds the group's newer variants as owners; the garbage collector drops
deleted ones); the Deployment is replaced (labels, owners, spec), since a
merge would keep a GPU limit or share annotation the group no longer asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube import workloads as kw
from chronotope.kube.client import raw_json
from chronotope.kube.reads import KubeReads
from chronotope.workloads.serving_group import GROUP_LABEL

__all__ = ["KubeVariantOps"]

_CONFLICT = 409


class KubeVariantOps(KubeReads):
    """`VariantOps` on a real API server; see the module docstring."""

    def variants(self, namespace: str) -> list[dict[str, Any]]:
        """The ModelVariants of a namespace."""
        if self.cache is not None:
            return self.cache.variants.list(namespace)
        data = raw_json(
            client.CustomObjectsApi(self.api).list_namespaced_custom_object(
                "chronotope.dev", "v1alpha1", namespace, "modelvariants", _preload_content=False
            )
        )
        items: list[dict[str, Any]] = data.get("items") or []
        return items

    def pods(self, namespace: str, group: str) -> list[dict[str, Any]]:
        """The serving group's pods."""
        selector = f"{GROUP_LABEL}={group}"
        if self.cache is not None:
            return self.cache.pods.list(namespace, selector)
        return kw.list_pods(self.api, namespace, selector)

    def apply(self, objects: Sequence[dict[str, Any]]) -> None:
        """Create each object, or patch what the controller owns of it."""
        core, apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        for obj in objects:
            meta = obj["metadata"]
            owned = {"labels": meta["labels"], "ownerReferences": meta["ownerReferences"]}
            kind = obj["kind"]
            if kind == "ConfigMap":
                _create_or_patch(
                    core.create_namespaced_config_map,
                    core.patch_namespaced_config_map,
                    obj,
                    {"metadata": owned, "data": obj["data"]},
                )
            elif kind == "Service":
                _create_or_patch(
                    core.create_namespaced_service,
                    core.patch_namespaced_service,
                    obj,
                    {"metadata": owned},
                )
            elif kind == "Deployment":
                _apply_deployment(apps, obj)
            else:
                raise ValueError(f"KubeVariantOps.apply: unexpected kind {kind}")


def _create_or_patch(
    create: Callable[..., Any],
    patch: Callable[..., Any],
    obj: dict[str, Any],
    body: dict[str, Any],
) -> None:
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    try:
        create(namespace, obj, _preload_content=False)
    except ApiException as exc:
        if exc.status != _CONFLICT:
            raise
        patch(name, namespace, body, _preload_content=False)


def _apply_deployment(apps: client.AppsV1Api, obj: dict[str, Any], attempts: int = 3) -> None:
    """Create, or replace labels, owners and spec (a merge patch would keep a stale GPU limit).

    A replace races the Deployment controller's status writes (409 on the
    resourceVersion): read again and retry a few times.
    """
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    try:
        apps.create_namespaced_deployment(namespace, obj, _preload_content=False)
        return
    except ApiException as exc:
        if exc.status != _CONFLICT:
            raise
    for attempt in range(attempts):
        current = raw_json(apps.read_namespaced_deployment(name, namespace, _preload_content=False))
        meta = current["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), **obj["metadata"]["labels"]}
        meta["ownerReferences"] = obj["metadata"]["ownerReferences"]
        body = {**current, "metadata": meta, "spec": obj["spec"]}
        body.pop("status", None)
        try:
            apps.replace_namespaced_deployment(name, namespace, body, _preload_content=False)
            return
        except ApiException as exc:
            if exc.status != _CONFLICT or attempt == attempts - 1:
                raise
