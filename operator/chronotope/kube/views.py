"""Reads for `kubectl chronotope`: objects by kind and an object's events, as plain dicts."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from chronotope.kube.client import raw_json

__all__ = ["KINDS", "QUEUE_KINDS", "canonical", "events_for", "list_kind", "read_kind"]

Obj = dict[str, Any]

KINDS: dict[str, tuple[str, str]] = {
    "trainingjob": ("TrainingJob", "trainingjobs"),
    "inferencepipeline": ("InferencePipeline", "inferencepipelines"),
    "modelvariant": ("ModelVariant", "modelvariants"),
    "pod": ("Pod", "pods"),
}
"""Lower-case kind or short name -> (Kind, plural): the kinds `why` explains."""
QUEUE_KINDS: dict[str, tuple[str, str]] = {
    "queue": ("Queue", "queues"),
    "localqueue": ("LocalQueue", "localqueues"),
}
"""The queue kinds, which `list_kind` lists too."""
ALIASES = {
    "tj": "trainingjob",
    "trainingjobs": "trainingjob",
    "ipl": "inferencepipeline",
    "pipeline": "inferencepipeline",
    "inferencepipelines": "inferencepipeline",
    "mv": "modelvariant",
    "modelvariants": "modelvariant",
    "pods": "pod",
    "po": "pod",
}
_NOT_FOUND = 404


def canonical(kind: str) -> str | None:
    """`trainingjob` for any spelling kubectl users type, or None for an unknown kind."""
    k = kind.lower()
    k = ALIASES.get(k, k)
    return k if k in KINDS else None


def list_kind(api: client.ApiClient, kind: str, namespace: str | None) -> list[Obj]:
    """Objects of one kind in `namespace`, or in all namespaces when None.

    `kind`: a `KINDS` or `QUEUE_KINDS` key, `node` or `namespace`; pass None for
    the cluster-scoped ones (`node`, `namespace`, `queue`).
    """
    if kind == "pod":
        core = client.CoreV1Api(api)
        resp = (
            core.list_namespaced_pod(namespace, _preload_content=False)
            if namespace
            else core.list_pod_for_all_namespaces(_preload_content=False)
        )
    elif kind == "node":
        resp = client.CoreV1Api(api).list_node(_preload_content=False)
    elif kind == "namespace":
        resp = client.CoreV1Api(api).list_namespace(_preload_content=False)
    else:
        custom = client.CustomObjectsApi(api)
        plural = {**KINDS, **QUEUE_KINDS}[kind][1]
        try:
            resp = (
                custom.list_namespaced_custom_object(
                    "chronotope.dev", "v1alpha1", namespace, plural, _preload_content=False
                )
                if namespace
                else custom.list_cluster_custom_object(
                    "chronotope.dev", "v1alpha1", plural, _preload_content=False
                )
            )
        except client.exceptions.ApiException as exc:
            if exc.status == _NOT_FOUND:  # the CRDs are not installed: no such objects
                return []
            raise
    items: list[Obj] = raw_json(resp).get("items") or []
    return items


def read_kind(api: client.ApiClient, kind: str, namespace: str, name: str) -> Obj | None:
    """One object, or None when it does not exist."""
    try:
        if kind == "pod":
            resp = client.CoreV1Api(api).read_namespaced_pod(
                name, namespace, _preload_content=False
            )
        else:
            resp = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "chronotope.dev",
                "v1alpha1",
                namespace,
                KINDS[kind][1],
                name,
                _preload_content=False,
            )
    except client.exceptions.ApiException as exc:
        if exc.status == _NOT_FOUND:
            return None
        raise
    obj: Obj = raw_json(resp)
    return obj


def events_for(api: client.ApiClient, namespace: str, kind: str, name: str) -> list[Obj]:
    """The events about one object."""
    selector = f"involvedObject.kind={KINDS[kind][0]},involvedObject.name={name}"
    resp = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=selector, _preload_content=False
    )
    items: list[Obj] = raw_json(resp).get("items") or []
    return items
