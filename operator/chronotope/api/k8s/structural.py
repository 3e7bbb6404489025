"""Turn a Kubernetes OpenAPI v3 definition into a structural CRD schema, as controller-gen does.

Why: a CRD field that holds a Kubernetes type (a TrainingJob's pod template)
should be checked by the API server like the type itself, so a malformed
template is refused at admission instead of failing later in the operator.
JobSet and Kueue get this from controller-gen reading the Go types; this
module gets the same schema from the OpenAPI document the Go types generate,
with the same special cases:

- `$ref`s are inlined (a type that reaches itself again would become a
  free-form object; core/v1's pod types have no such cycle);
- `resource.Quantity` and `intstr.IntOrString` become
  `x-kubernetes-int-or-string` (a Quantity also gets apimachinery's pattern),
  `runtime.RawExtension` keeps unknown fields;
- an embedded `ObjectMeta` keeps only `name`, `namespace`, `labels`,
  `annotations` and `finalizers` (controller-gen's `generateEmbeddedObjectMeta`);
- descriptions are dropped, to keep the CRD far below the API server's and
  etcd's size limits (the field's own description, set by the caller, stays);
- `x-kubernetes-list-type`, `-list-map-keys` and `-map-type` are kept, the
  strategic-merge-patch hints (`x-kubernetes-patch-*`) and unions dropped;
- zero-value defaults (`""`, `0`, `false`, `{}`) are dropped: openapi-gen
  writes them for every non-pointer field, they change nothing for a pod, and
  on a required field (a container's `name`) they would defeat `required`.
  Other defaults come from the types' `+default` markers and are kept (a
  container port's `protocol: TCP`, which its list-map key needs).

Anything else raises `SchemaError`, so a new construct in a future Kubernetes
version fails generation instead of producing a CRD the server rejects.

Pure: dicts in, dicts out.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from chronotope.api.k8s.openapi import ref_name

__all__ = ["INT_OR_STRING", "QUANTITY", "SchemaError", "embedded_schema"]

Schema = dict[str, Any]


class SchemaError(ValueError):
    """An OpenAPI construct with no structural-schema equivalent."""


INT_OR_STRING: Schema = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "x-kubernetes-int-or-string": True,
}
"""controller-gen's schema for `intstr.IntOrString`."""

QUANTITY: Schema = {
    **INT_OR_STRING,
    "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
}
"""controller-gen's schema for `resource.Quantity`: apimachinery's grammar, as text or integer."""

_FREE_FORM: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

_SPECIAL: Mapping[str, Schema] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": QUANTITY,
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": INT_OR_STRING,
    "io.k8s.apimachinery.pkg.runtime.RawExtension": _FREE_FORM,
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSON": _FREE_FORM,
}

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
EMBEDDED_META_FIELDS = ("annotations", "finalizers", "labels", "name", "namespace")
"""The ObjectMeta fields an embedded object keeps (controller-gen's generateEmbeddedObjectMeta)."""

_PASS = frozenset(
    {
        "type",
        "format",
        "enum",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    }
)
_DROP = frozenset(
    {
        "description",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-unions",
    }
)


def embedded_schema(name: str, schemas: Mapping[str, Any]) -> Schema:
    """The structural CRD schema of definition `name` (e.g. `io.k8s.api.core.v1.PodTemplateSpec`).

    `schemas` is an OpenAPI v3 document's `components.schemas`.
    """
    return _Converter(schemas).definition(name, ())


class _Converter:
    def __init__(self, schemas: Mapping[str, Any]) -> None:
        self.schemas = schemas

    def definition(self, name: str, stack: tuple[str, ...]) -> Schema:
        if name in _SPECIAL:
            return copy.deepcopy(_SPECIAL[name])
        if name in stack:  # a type that contains itself: stop, as a free-form object
            return copy.deepcopy(_FREE_FORM)
        if name not in self.schemas:
            raise SchemaError(f"no definition {name!r}")
        node = self.schemas[name]
        if name == OBJECT_META:
            props = node.get("properties", {})
            kept = {k: props[k] for k in EMBEDDED_META_FIELDS if k in props}
            node = {"type": "object", "properties": kept}
        return self.node(node, (*stack, name), name)

    def node(self, node: Mapping[str, Any], stack: tuple[str, ...], path: str) -> Schema:
        node = dict(node)
        if "allOf" in node:
            parts = node.pop("allOf")
            if len(parts) != 1:
                raise SchemaError(f"{path}: allOf with {len(parts)} parts")
            node = {**parts[0], **node}
        if "$ref" in node:
            out = self.definition(ref_name(node.pop("$ref")), stack)
            self._default(out, node, path)
            return out
        out = {}
        for key in node:
            self._put(out, node, key, stack=stack, path=path)
        if out.get("x-kubernetes-list-type") == "map" and "items" in node:
            self._default_map_keys(out, node["items"])
        _check(out, path)
        return out

    def _put(
        self,
        out: Schema,
        node: Mapping[str, Any],
        key: str,
        *,
        stack: tuple[str, ...],
        path: str,
    ) -> None:
        """Convert keyword `key` of `node` into `out`."""
        value = node[key]
        if key in _DROP:
            return
        if key in _PASS:
            out[key] = value
        elif key == "default":
            self._default(out, node, path)
        elif key == "required":
            out[key] = list(value)
        elif key == "properties":
            out[key] = {
                prop: self.node(sub, stack, f"{path}.{prop}") for prop, sub in value.items()
            }
        elif key == "items":
            out[key] = self.node(value, stack, f"{path}[]")
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:
                out[key] = self.node(value, stack, f"{path}{{}}")
        else:
            raise SchemaError(f"{path}: OpenAPI keyword {key!r} has no structural equivalent")

    def _default_map_keys(self, out: Schema, raw_items: Mapping[str, Any]) -> None:
        """A list-map key the items do not require keeps its default, even a zero value.

        The API server requires every list-map key to be required or defaulted;
        the zero value is what the Go type means when the key is left out (an
        image pull secret's `name: ""`).
        """
        item = out["items"]
        raw = dict(raw_items)
        if len(raw.get("allOf", ())) == 1:
            raw = {**raw["allOf"][0], **raw}
        if "$ref" in raw:
            raw = self.schemas.get(ref_name(raw["$ref"]), {})
        raw_props = raw.get("properties", {})
        for key in out.get("x-kubernetes-list-map-keys", []):
            sub = item.get("properties", {}).get(key)
            if sub is None or key in item.get("required", []) or "default" in sub:
                continue
            if "default" in raw_props.get(key, {}):
                sub["default"] = raw_props[key]["default"]

    @staticmethod
    def _default(out: Schema, node: Mapping[str, Any], path: str) -> None:
        """Keep a non-zero default (a `+default` marker); zero values are openapi-gen's filler."""
        value = node.get("default")
        if value in (None, "", 0, False, {}, []):
            return
        if isinstance(value, (dict, list)):
            raise SchemaError(f"{path}: structured default {value!r} is not supported")
        out["default"] = value


def _check(out: Schema, path: str) -> None:
    """What the API server would refuse in this node, as a generation error."""
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        raise SchemaError(f"{path}: no type (structural schemas type every node)")
    if out.get("type") == "array" and "items" not in out:
        raise SchemaError(f"{path}: an array without items")
    if "properties" in out and "additionalProperties" in out:
        raise SchemaError(f"{path}: both properties and additionalProperties")
    if out.get("x-kubernetes-list-type") == "map":
        item = out.get("items", {})
        required = set(item.get("required", []))
        for key in out.get("x-kubernetes-list-map-keys", []):
            sub = item.get("properties", {}).get(key)
            if sub is None:
                raise SchemaError(f"{path}: list-map key {key!r} is not an item property")
            if key not in required and "default" not in sub:
                raise SchemaError(f"{path}: list-map key {key!r} is neither required nor defaulted")
    elif out.get("x-kubernetes-list-type") == "set" and out["items"].get("type") in (
        "object",
        "array",
    ):
        raise SchemaError(f"{path}: a set of non-scalar items")
