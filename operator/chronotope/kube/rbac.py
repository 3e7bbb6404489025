"""Apply ServiceAccounts and RBAC objects, and mint ServiceAccount tokens (TokenRequest).

The local cluster uses these to run its components under the Helm chart's
identities (`devcluster.identities`): the chart's ServiceAccounts and roles are
applied as rendered, then each component gets a bound token for its account.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = ["apply_rbac", "request_token"]

_NOT_FOUND = 404
_CONFLICT = 409
_INVALID = 422


@dataclass(frozen=True)
class _Kind:
    namespaced: bool
    create: Callable[..., Any]
    read: Callable[..., Any]
    replace: Callable[..., Any]
    delete: Callable[..., Any]


def _kinds(api: client.ApiClient) -> dict[str, _Kind]:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    return {
        "ServiceAccount": _Kind(
            True,
            core.create_namespaced_service_account,
            core.read_namespaced_service_account,
            core.replace_namespaced_service_account,
            core.delete_namespaced_service_account,
        ),
        "ClusterRole": _Kind(
            False,
            rbac.create_cluster_role,
            rbac.read_cluster_role,
            rbac.replace_cluster_role,
            rbac.delete_cluster_role,
        ),
        "ClusterRoleBinding": _Kind(
            False,
            rbac.create_cluster_role_binding,
            rbac.read_cluster_role_binding,
            rbac.replace_cluster_role_binding,
            rbac.delete_cluster_role_binding,
        ),
        "Role": _Kind(
            True,
            rbac.create_namespaced_role,
            rbac.read_namespaced_role,
            rbac.replace_namespaced_role,
            rbac.delete_namespaced_role,
        ),
        "RoleBinding": _Kind(
            True,
            rbac.create_namespaced_role_binding,
            rbac.read_namespaced_role_binding,
            rbac.replace_namespaced_role_binding,
            rbac.delete_namespaced_role_binding,
        ),
    }


def _apply_one(kind: _Kind, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    where = (meta["name"], meta["namespace"]) if kind.namespaced else (meta["name"],)
    ns = where[1:]  # create takes (namespace, body) or (body)
    try:
        kind.create(*ns, obj)
        return
    except ApiException as exc:
        if exc.status != _CONFLICT:
            raise
    current = kind.read(*where)
    body = obj | {"metadata": meta | {"resourceVersion": current.metadata.resource_version}}
    try:
        kind.replace(*where, body)
    except ApiException as exc:
        if exc.status != _INVALID:  # a binding's roleRef is immutable: recreate it
            raise
        kind.delete(*where)
        kind.create(*ns, obj)


def apply_rbac(api: client.ApiClient, objects: Sequence[dict[str, Any]]) -> list[str]:
    """Create or replace each ServiceAccount / (Cluster)Role / (Cluster)RoleBinding.

    Namespaced objects must name their namespace (a rendered chart does).
    Returns `Kind/name` for each object, in order. Raises ValueError before
    writing anything when an object is of another kind or lacks a namespace.
    """
    kinds = _kinds(api)
    for obj in objects:
        kind, meta = obj.get("kind"), obj.get("metadata") or {}
        if kind not in kinds:
            raise ValueError(f"refusing to apply {kind}/{meta.get('name')}: not an RBAC object")
        if kinds[kind].namespaced and not meta.get("namespace"):
            raise ValueError(f"{kind}/{meta.get('name')} has no metadata.namespace")
    for obj in objects:
        _apply_one(kinds[obj["kind"]], obj)
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objects]


def request_token(
    api: client.ApiClient, namespace: str, service_account: str, expiry_s: int
) -> str:
    """A bound token for the ServiceAccount (TokenRequest API), valid `expiry_s` seconds.

    Raises LookupError when the account does not exist.
    """
    core = client.CoreV1Api(api)
    request: dict[str, Any] = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": expiry_s},
    }
    try:
        response = core.create_namespaced_service_account_token(service_account, namespace, request)
    except ApiException as exc:
        if exc.status == _NOT_FOUND:
            raise LookupError(f"no ServiceAccount {namespace}/{service_account}") from exc
        raise
    return str(response.status.token)
