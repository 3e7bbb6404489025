"""What the admission webhook reads from the cluster, and its registration objects.

`KubeAdmissionLookups` answers the webhook's questions (`workloads.admission.
Lookups`): GPU types and memory from the operator's watch cache of nodes,
ConfigMaps and ModelVariants from the API server (a GET with a short timeout;
ModelVariants from the watch cache first). `pod_template_types` turns the
Kubernetes client's models into the type table `workloads.pod_shape` walks.
`apply_admission_objects` / `delete_webhook_configurations` register the
webhook and install admission policies (the local dev cluster does; the Helm
chart renders its own), and
`dry_run_create` shows whether a registration is in effect.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube.client import raw_json
from chronotope.kube.store import OperatorCache
from chronotope.sharing.labels import GPU_PRODUCT_LABEL
from chronotope.workloads.admission import AdmissionLookupError
from chronotope.workloads.pod_shape import ObjectType

__all__ = [
    "ADMISSION_KINDS",
    "KubeAdmissionLookups",
    "apply_admission_objects",
    "delete_webhook_configurations",
    "dry_run_create",
    "pod_template_types",
]

_NOT_FOUND = 404

# Fields the Kubernetes OpenAPI types as resource.Quantity (an int or a string such as
# "500m"); the client's models flatten them to `str`, so they are marked here.
_QUANTITIES = {
    ("V1ResourceRequirements", "limits"),
    ("V1ResourceRequirements", "requests"),
    ("V1VolumeResourceRequirements", "limits"),
    ("V1VolumeResourceRequirements", "requests"),
    ("V1PodSpec", "overhead"),
    ("V1EmptyDirVolumeSource", "size_limit"),
    ("V1ResourceFieldSelector", "divisor"),
}
_SCALARS = {"str": "str", "int": "int", "float": "float", "bool": "bool", "datetime": "str"}
_LIST = re.compile(r"^[Ll]ist\[(.+)\]$")
_MAP = re.compile(r"^(?:[Dd]ict\[str, (.+)\]|dict\(str, (.+)\))$")


def _expr(openapi_type: str, refs: list[str]) -> str:
    """The client's type string (`List[V1Container]`, `dict(str, str)`) as a shape expression."""
    if openapi_type in _SCALARS:
        return _SCALARS[openapi_type]
    if openapi_type == "object":  # int-or-string, raw JSON
        return "any"
    if m := _LIST.match(openapi_type):
        return "list:" + _expr(m.group(1), refs)
    if m := _MAP.match(openapi_type):
        return "map:" + _expr(m.group(1) or m.group(2), refs)
    refs.append(openapi_type)
    return openapi_type


def _required(model: Any, attribute: str) -> bool:
    # clients with pydantic models (the 37.x this project installs) say which fields are
    # required; older generated clients do not, and their table checks types and unknown
    # fields only
    fields = getattr(model, "model_fields", None)
    return bool(fields and attribute in fields and fields[attribute].is_required())


@functools.cache
def pod_template_types() -> dict[str, ObjectType]:
    """The PodTemplateSpec type closure of the installed Kubernetes client, as a type table."""
    table: dict[str, ObjectType] = {}
    todo = ["V1PodTemplateSpec"]
    while todo:
        name = todo.pop()
        if name in table:
            continue
        model = getattr(client, name)
        refs: list[str] = []
        fields: dict[str, str] = {}
        required: set[str] = set()
        for attribute, openapi_type in model.openapi_types.items():
            json_name = model.attribute_map[attribute]
            expr = _expr(openapi_type, refs)
            if (name, attribute) in _QUANTITIES:
                expr = expr.replace("str", "quantity")
            fields[json_name] = expr
            if _required(model, attribute):
                required.add(json_name)
        table[name] = ObjectType(fields, frozenset(required))
        todo.extend(refs)
    return table


class KubeAdmissionLookups:
    """`workloads.admission.Lookups` on a real API server; see the module docstring."""

    def __init__(
        self, api: client.ApiClient, cache: OperatorCache | None = None, timeout_s: float = 1.5
    ) -> None:
        """Read through `api`, nodes and ModelVariants from `cache` when given."""
        self.api = api
        self.cache = cache
        self.timeout_s = timeout_s

    def gpu_nodes(self) -> list[dict[str, Any]]:
        """The nodes labelled with a GPU type (watch cache first)."""
        if self.cache is not None:
            nodes = self.cache.nodes.list()
        else:
            nodes = self._get(lambda: client.CoreV1Api(self.api).list_node(**self._raw()))["items"]
        return [
            n
            for n in nodes
            if ((n.get("metadata") or {}).get("labels") or {}).get(GPU_PRODUCT_LABEL)
        ]

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's data, or None when it does not exist."""
        found = self._get(
            lambda: client.CoreV1Api(self.api).read_namespaced_config_map(
                name, namespace, **self._raw()
            )
        )
        return None if found is None else dict(found.get("data") or {})

    def model_variant_exists(self, namespace: str, name: str) -> bool:
        """Whether the ModelVariant exists (watch cache first: it may lag a fresh create)."""
        if self.cache is not None:
            known = self.cache.variants.list(namespace)
            if any(v["metadata"]["name"] == name for v in known):
                return True
        found = self._get(
            lambda: client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                "chronotope.dev", "v1alpha1", namespace, "modelvariants", name, **self._raw()
            )
        )
        return found is not None

    def _raw(self) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self.timeout_s}

    def _get(self, call: Any) -> Any:
        try:
            return raw_json(call())
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise AdmissionLookupError(f"API server answered {exc.status} {exc.reason}") from exc
        except Exception as exc:  # timeouts, refused connections: the lookup, not the request
            raise AdmissionLookupError(f"{type(exc).__name__}: {exc}"[:200]) from exc


_KINDS = {
    "ValidatingWebhookConfiguration": "validating_webhook_configuration",
    "MutatingWebhookConfiguration": "mutating_webhook_configuration",
}
ADMISSION_KINDS = {
    **_KINDS,
    "ValidatingAdmissionPolicy": "validating_admission_policy",
    "ValidatingAdmissionPolicyBinding": "validating_admission_policy_binding",
}
"""The admissionregistration.k8s.io/v1 kinds `apply_admission_objects` installs."""


def apply_admission_objects(api: client.ApiClient, objs: Iterable[Mapping[str, Any]]) -> None:
    """Create each admissionregistration object (`ADMISSION_KINDS`), or replace its namesake."""
    admission = client.AdmissionregistrationV1Api(api)
    for obj in objs:
        suffix = ADMISSION_KINDS[obj["kind"]]
        name = obj["metadata"]["name"]
        try:
            current = raw_json(getattr(admission, f"read_{suffix}")(name, _preload_content=False))
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise
            getattr(admission, f"create_{suffix}")(dict(obj), _preload_content=False).release_conn()
            continue
        body = dict(obj)
        body["metadata"] = dict(obj["metadata"]) | {
            "resourceVersion": current["metadata"]["resourceVersion"]
        }
        getattr(admission, f"replace_{suffix}")(name, body, _preload_content=False).release_conn()


def delete_webhook_configurations(api: client.ApiClient, name: str) -> None:
    """Delete the validating and mutating configurations named `name` (absent ones too)."""
    admission = client.AdmissionregistrationV1Api(api)
    for suffix in _KINDS.values():
        try:
            getattr(admission, f"delete_{suffix}")(name, _preload_content=False).release_conn()
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise


def dry_run_create(api: client.ApiClient, obj: Mapping[str, Any]) -> dict[str, Any] | str:
    """Create a namespaced Chronotope object with dryRun=All: what would be stored, or why not.

    The request goes through admission like a real one (webhooks included) and
    stores nothing.
    """
    group, version = str(obj["apiVersion"]).split("/")
    plural = str(obj["kind"]).lower() + "s"
    try:
        created = client.CustomObjectsApi(api).create_namespaced_custom_object(
            group, version, obj["metadata"]["namespace"], plural, dict(obj),
            dry_run="All", _preload_content=False,
        )  # fmt: skip
    except ApiException as exc:
        return str(exc.body or exc.reason)
    stored: dict[str, Any] = raw_json(created)
    return stored
